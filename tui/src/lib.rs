//! `commscope tui`: a live terminal view of a collector's jobs (through its Query service), or
//! of a trace replayed with a time cursor — the same screens either way.
//!
//! - [`source`]: where snapshots come from ([`live::Live`] polls a collector);
//! - [`app`]: the state and what each key does;
//! - [`ui`]: drawing, one module per view.
#![forbid(unsafe_code)]

pub mod app;
#[doc(hidden)]
pub mod fixtures;
pub mod live;
pub mod palette;
pub mod source;
pub mod ui;

use std::time::Duration;

use anyhow::Result;
use ratatui::crossterm::event::{self, Event};

use crate::app::{Action, App};
use crate::source::Source;

/// How often the screen is redrawn without input (new data shows within this).
const TICK: Duration = Duration::from_millis(250);

/// Runs the TUI on the terminal until the user quits.
pub fn run(mut source: Box<dyn Source>) -> Result<()> {
    let mut terminal = ratatui::init();
    let result = (|| -> Result<()> {
        let mut app = App::new(source.label());
        loop {
            let (job, rank) = app.wants();
            source.want(job, rank);
            if let Some(s) = source.latest() {
                app.update(s);
            }
            app.cursor = source.cursor();
            terminal.draw(|f| ui::draw(f, &mut app))?;
            if event::poll(TICK)? {
                match event::read()? {
                    Event::Key(k) => match app.key(k) {
                        Action::Quit => return Ok(()),
                        Action::Seek(s) => source.seek(s),
                        Action::None => {}
                    },
                    // The next draw takes the new size.
                    Event::Resize(..) => {}
                    _ => {}
                }
            }
        }
    })();
    ratatui::restore();
    result
}
