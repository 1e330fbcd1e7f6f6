//! `?`: the keys.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::Line;
use ratatui::widgets::{Block, Clear, Paragraph};

use crate::palette;

const KEYS: &[(&str, &str)] = &[
    ("q, Ctrl-C", "quit"),
    ("?", "this help (any key closes it)"),
    ("Enter", "open the selected job, rank or finding"),
    ("Esc, Backspace", "back"),
    ("↑ ↓ ← →, h j k l", "move"),
    ("g, G", "first, last"),
    ("/", "filter the jobs (Enter keeps, Esc clears)"),
    ("s", "sort the jobs: attention, name, ranks, records/s"),
    ("Tab", "job view: move between the ranks and the findings"),
    (
        "m",
        "job view: heatmap metric — blame share, lateness, in-flight age",
    ),
    ("w", "job view: the hang (who waits for whom)"),
    (
        "[ ]  { }",
        "replay: move the time cursor one step, ten steps",
    ),
];

pub fn draw(f: &mut Frame, area: Rect) {
    let h = KEYS.len() as u16 + 4;
    let [_, mid, _] = Layout::vertical([
        Constraint::Fill(1),
        Constraint::Length(h),
        Constraint::Fill(1),
    ])
    .areas(area);
    let [_, r, _] = Layout::horizontal([
        Constraint::Fill(1),
        Constraint::Length(76),
        Constraint::Fill(1),
    ])
    .areas(mid);
    let mut lines: Vec<Line> = KEYS
        .iter()
        .map(|(k, what)| Line::raw(format!(" {k:<18} {what}")))
        .collect();
    lines.push(Line::raw(""));
    lines.push(Line::styled(
        " Colours and glyphs · ░ ▒ ▓ █ rise with the metric; orange is open.",
        palette::dim(),
    ));
    f.render_widget(Clear, r);
    f.render_widget(
        Paragraph::new(lines)
            .block(Block::bordered().title(Line::styled(" Keys ", palette::title()))),
        r,
    );
}
