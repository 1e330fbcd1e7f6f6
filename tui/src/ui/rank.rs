//! A rank: its process, its health, what it is inside now, and its latest collectives with a
//! duration sparkline.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Row, Sparkline, Table};

use super::{bytes, secs};
use crate::app::App;
use crate::palette;

pub fn draw(f: &mut Frame, area: Rect, app: &App) {
    let rank = app.open_rank.unwrap_or(-1);
    let Some(d) = app
        .data
        .rank
        .as_ref()
        .filter(|d| d.state.as_ref().is_some_and(|s| s.rank == rank))
    else {
        f.render_widget(
            Paragraph::new(format!("Waiting for rank {rank}…")).block(Block::bordered()),
            area,
        );
        return;
    };
    let st = d.state.clone().unwrap_or_default();
    let [info, spark, table] = Layout::vertical([
        Constraint::Length(6),
        Constraint::Length(5),
        Constraint::Min(0),
    ])
    .areas(area);
    let mut lines = vec![
        Line::from(vec![
            Span::styled(format!("rank {}", st.rank), palette::title()),
            Span::raw(format!(
                " on node {} · pid {} · pod {}  ",
                st.node,
                st.pid,
                if st.pod.is_empty() { "—" } else { &st.pod }
            )),
            Span::styled(st.state.clone(), palette::state(&st.state)),
            Span::raw(match (st.exit_status, st.signal) {
                (_, Some(s)) => format!(" (signal {s})"),
                (Some(c), None) => format!(" (exit status {c})"),
                _ => String::new(),
            }),
        ]),
        Line::raw(format!(
            "{} calls · {} records · {} dropped{}",
            st.calls,
            st.records,
            st.dropped,
            st.clock_offset_ns
                .map(|o| format!(
                    " · node clock {:+.3} ms ± {:.3} ms",
                    o as f64 / 1e6,
                    st.clock_error_ns as f64 / 1e6
                ))
                .unwrap_or_default()
        )),
    ];
    match &d.health {
        Some(h) => lines.push(Line::from(vec![
            Span::styled(
                format!("others wait for it {:.1} % of wall time", h.share * 100.0),
                if h.slow {
                    Style::default().fg(palette::ORANGE)
                } else {
                    Style::default()
                },
            ),
            Span::raw(format!(
                "{} · late in {:.0} % of its collectives{}",
                h.recent_share
                    .map(|r| format!(" ({:.1} % lately)", r * 100.0))
                    .unwrap_or_default(),
                h.late_ratio * 100.0,
                if h.slow {
                    " · a slow-rank finding names it"
                } else {
                    ""
                }
            )),
        ])),
        None => lines.push(Line::styled(
            "not judged yet (no synchronizing collective completed)",
            palette::dim(),
        )),
    }
    if d.in_flight.is_empty() {
        lines.push(Line::styled("nothing in flight", palette::dim()));
    }
    for c in d.in_flight.iter().take(2) {
        lines.push(Line::styled(
            format!(
                "in flight: {} #{} on {:#018x} for {}",
                c.op,
                c.seq,
                c.comm_id,
                secs(c.age_ns as f64 / 1e9)
            ),
            Style::default().fg(palette::ORANGE),
        ));
    }
    f.render_widget(
        Paragraph::new(lines)
            .block(Block::bordered().title(Line::styled(" Rank ", palette::title()))),
        info,
    );
    let durations: Vec<u64> = d.recent.iter().map(|c| c.duration_ns / 1000).collect();
    let max = durations.iter().copied().max().unwrap_or(0);
    f.render_widget(
        Sparkline::default()
            .data(&durations)
            .style(Style::default().fg(palette::SKY))
            .block(Block::bordered().title(Line::styled(
                format!(
                    " Duration of its last {} calls (max {}) ",
                    durations.len(),
                    secs(max as f64 / 1e6)
                ),
                palette::title(),
            ))),
        spark,
    );
    let rows: Vec<Row> = d
        .recent
        .iter()
        .rev()
        .skip(app.scroll as usize)
        .map(|c| {
            Row::new(vec![
                c.op.clone(),
                format!("#{}", c.seq),
                format!("{:#018x}", c.comm_id),
                bytes(c.bytes),
                secs(c.duration_ns as f64 / 1e9),
                if c.peer >= 0 {
                    c.peer.to_string()
                } else {
                    String::new()
                },
            ])
        })
        .collect();
    f.render_widget(
        Table::new(
            rows,
            [
                Constraint::Length(16),
                Constraint::Length(10),
                Constraint::Length(19),
                Constraint::Length(11),
                Constraint::Length(10),
                Constraint::Length(6),
            ],
        )
        .header(
            Row::new(vec![
                "OP",
                "SEQ",
                "COMMUNICATOR",
                "BYTES",
                "DURATION",
                "PEER",
            ])
            .style(palette::title()),
        )
        .block(Block::bordered().title(Line::styled(
            " Latest collectives, newest first ",
            palette::title(),
        ))),
        table,
    );
}
