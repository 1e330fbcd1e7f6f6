//! The jobs list.

use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::Style;
use ratatui::text::Line;
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table, TableState, Wrap};

use super::si;
use crate::app::App;
use crate::palette;

pub fn draw(f: &mut Frame, area: Rect, app: &App) {
    let jobs = app.visible_jobs();
    let title = format!(
        " Jobs ({}{}) · sort: {} ",
        jobs.len(),
        if app.filter.is_empty() {
            String::new()
        } else {
            format!(" matching \"{}\"", app.filter)
        },
        app.sort.name()
    );
    let block = Block::bordered().title(Line::styled(title, palette::title()));
    if app.data.jobs.is_empty() {
        let text = vec![
            Line::raw(""),
            Line::raw("No jobs yet."),
            Line::styled(
                "Jobs appear here when a node's agent streams a traced job: `commscope run -- mpirun …` on a node running `commscope agent`.",
                palette::dim(),
            ),
        ];
        f.render_widget(
            Paragraph::new(text).wrap(Wrap { trim: true }).block(block),
            area,
        );
        return;
    }
    // Ages against the data's clock: wall time live, the cursor in a replay.
    let now = app.data.clock_s;
    let rows: Vec<Row> = jobs
        .iter()
        .map(|j| {
            let findings = if j.open_findings > 0 {
                Cell::from(format!("{} open", j.open_findings)).style(palette::finding("open"))
            } else {
                Cell::from("—").style(palette::dim())
            };
            let seen = if j.state == "running" && j.last_seen_ns > 0 {
                let age = (now - j.last_seen_ns as f64 / 1e9).max(0.0);
                format!("{age:.0} s ago")
            } else {
                String::new()
            };
            Row::new(vec![
                Cell::from(j.job.clone()),
                Cell::from(j.state.clone()).style(palette::state(&j.state)),
                Cell::from(j.ranks.to_string()),
                Cell::from(j.nodes.len().to_string()),
                findings,
                Cell::from(si(app.rate(&j.job))),
                Cell::from(j.in_flight.to_string()),
                Cell::from(j.dropped.to_string()).style(if j.dropped > 0 {
                    Style::default().fg(palette::ORANGE)
                } else {
                    Style::default()
                }),
                Cell::from(j.flavour.clone()),
                Cell::from(seen).style(palette::dim()),
            ])
        })
        .collect();
    let header = Row::new(vec![
        "JOB",
        "STATE",
        "RANKS",
        "NODES",
        "FINDINGS",
        "REC/S",
        "IN FLIGHT",
        "DROPPED",
        "LIBRARY",
        "LAST SEEN",
    ])
    .style(palette::title());
    let name_w = jobs
        .iter()
        .map(|j| j.job.chars().count())
        .max()
        .unwrap_or(0)
        .clamp(12, 48) as u16
        + 1;
    let table = Table::new(
        rows,
        [
            Constraint::Length(name_w),
            Constraint::Length(8),
            Constraint::Length(6),
            Constraint::Length(6),
            Constraint::Length(9),
            Constraint::Length(8),
            Constraint::Length(9),
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Fill(1),
        ],
    )
    .header(header)
    .row_highlight_style(palette::selected())
    .block(block);
    let mut state = TableState::default().with_selected(Some(app.job_sel));
    f.render_stateful_widget(table, area, &mut state);
}
