//! Drawing: a title bar, the current view, and a key bar; `?` lays the help over it. Every
//! view draws from [`App`] alone, so `TestBackend` snapshots show exactly what a terminal would.

mod hang;
pub mod heatmap;
mod help;
mod job;
mod jobs;
mod rank;

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use crate::app::{App, View};
use crate::palette;

/// Draws the whole screen.
pub fn draw(f: &mut Frame, app: &mut App) {
    let [top, body, bottom] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(0),
        Constraint::Length(1),
    ])
    .areas(f.area());
    title_bar(f, top, app);
    match app.view() {
        View::Jobs => jobs::draw(f, body, app),
        View::Job => job::draw(f, body, app),
        View::Hang => hang::draw(f, body, app),
        View::Rank => rank::draw(f, body, app),
    }
    key_bar(f, bottom, app);
    if app.help {
        help::draw(f, f.area());
    }
}

fn title_bar(f: &mut Frame, area: Rect, app: &App) {
    let mut spans = vec![Span::styled(" commscope ", palette::title())];
    let crumbs: Vec<String> = app
        .stack
        .iter()
        .map(|v| match v {
            View::Jobs => "jobs".to_owned(),
            View::Job => app.open_job.clone().unwrap_or_default(),
            View::Hang => "hang".to_owned(),
            View::Rank => app
                .open_rank
                .map(|r| format!("rank {r}"))
                .unwrap_or_default(),
        })
        .collect();
    spans.push(Span::raw(crumbs.join(" › ")));
    spans.push(Span::styled(format!("  · {}", app.label), palette::dim()));
    if let Some(c) = app.cursor {
        spans.push(Span::styled(
            format!(
                "  · t = {} of {} ([ ] ± {}, {{ }} ± {})",
                secs(c.at_s),
                secs(c.end_s),
                secs(c.step_s),
                secs(c.step_s * 10.0)
            ),
            Style::default().fg(palette::ORANGE),
        ));
    }
    f.render_widget(Paragraph::new(Line::from(spans)), area);
}

fn key_bar(f: &mut Frame, area: Rect, app: &App) {
    if let Some(e) = &app.data.error {
        f.render_widget(
            Paragraph::new(Line::styled(
                format!(" {e}"),
                Style::default().fg(palette::VERMILLION),
            )),
            area,
        );
        return;
    }
    let keys = if app.filtering {
        format!(" filter: {}▏  Enter keep · Esc clear", app.filter)
    } else {
        match app.view() {
            View::Jobs => " ↑↓/jk move · Enter open · / filter · s sort · ? help · q quit".to_owned(),
            View::Job => {
                " ←↑↓→/hjkl rank · Tab findings · Enter open · m metric · w hang · Esc back · ? help"
                    .to_owned()
            }
            View::Hang | View::Rank => " ↑↓/jk scroll · Esc back · ? help · q quit".to_owned(),
        }
    };
    f.render_widget(Paragraph::new(Line::styled(keys, palette::dim())), area);
}

/// `1234567` → `1.2 M`.
pub fn si(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.1} G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.1} M", v / 1e6)
    } else if a >= 1e3 {
        format!("{:.1} k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// Bytes, in B/KiB/MiB/GiB.
pub fn bytes(b: u64) -> String {
    let b = b as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.1} GiB", b / (1u64 << 30) as f64)
    } else if b >= (1u64 << 20) as f64 {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    } else if b >= 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{b:.0} B")
    }
}

/// A duration in seconds, with a unit that suits it.
pub fn secs(s: f64) -> String {
    if s >= 100.0 {
        format!("{s:.0} s")
    } else if s >= 1.0 {
        format!("{s:.1} s")
    } else if s >= 1e-3 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{:.0} µs", s * 1e6)
    }
}

/// "ranks 0, 1, 3" / "rank 2", with at most `max` named.
pub fn ranks_phrase(ranks: &[i32], max: usize) -> String {
    let named: Vec<String> = ranks.iter().take(max).map(|r| r.to_string()).collect();
    let more = ranks.len().saturating_sub(max);
    let list = if more > 0 {
        format!("{} and {more} more", named.join(", "))
    } else {
        named.join(", ")
    };
    match ranks.len() {
        0 => "no rank".to_owned(),
        1 => format!("rank {list}"),
        _ => format!("ranks {list}"),
    }
}
