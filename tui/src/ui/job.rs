//! A job: the rank heatmap, communicator progress, the findings as sentences, the worst links,
//! and what each slow rank costs.

use commscope_wire::grpc::{JobDetail, LinkRate};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Row, Table, Wrap};

use super::heatmap::{self, Cell};
use super::{ranks_phrase, secs, si};
use crate::app::{App, Focus, Heat};
use crate::palette;

pub fn draw(f: &mut Frame, area: Rect, app: &mut App) {
    let Some(d) = app.job().cloned() else {
        let msg = match &app.open_job {
            Some(j) => format!("Waiting for job {j}…"),
            None => "No job open.".to_owned(),
        };
        f.render_widget(Paragraph::new(msg).block(Block::bordered()), area);
        return;
    };
    let [head, body] = Layout::vertical([Constraint::Length(2), Constraint::Min(0)]).areas(area);
    header(f, head, app, &d);
    let [left, right] =
        Layout::horizontal([Constraint::Percentage(55), Constraint::Percentage(45)]).areas(body);
    let [heat, progress] =
        Layout::vertical([Constraint::Percentage(60), Constraint::Percentage(40)]).areas(left);
    let [findings, links, whatif] = Layout::vertical([
        Constraint::Percentage(50),
        Constraint::Percentage(25),
        Constraint::Percentage(25),
    ])
    .areas(right);
    heat_pane(f, heat, app, &d);
    progress_pane(f, progress, &d);
    findings_pane(f, findings, app);
    links_pane(f, links, &d);
    whatif_pane(f, whatif, &d);
}

fn header(f: &mut Frame, area: Rect, app: &App, d: &JobDetail) {
    let Some(s) = &d.summary else { return };
    let step = match d.step_s {
        Some(p) => format!("step {} (from {})", secs(p), d.step_from),
        None => "step time not known yet".to_owned(),
    };
    let open = d.findings.iter().filter(|f| f.state == "open").count();
    let l1 = Line::from(vec![
        Span::styled(format!(" {} ", s.job), palette::title()),
        Span::styled(s.state.clone(), palette::state(&s.state)),
        Span::raw(format!(
            " · {} ranks on {} node{} · {} records ({} /s) · {} in flight · {} dropped",
            s.ranks,
            s.nodes.len(),
            if s.nodes.len() == 1 { "" } else { "s" },
            si(s.records as f64),
            si(app.rate(&s.job)),
            s.in_flight,
            s.dropped
        )),
    ]);
    let l2 = Line::from(vec![
        Span::raw(format!(" {step} · ")),
        if open > 0 {
            Span::styled(
                format!("{open} open finding{}", if open == 1 { "" } else { "s" }),
                palette::finding("open"),
            )
        } else {
            Span::styled("no open finding", Style::default().fg(palette::GREEN))
        },
    ]);
    // Part of the job cannot be seen now: say what, before anyone reads the findings.
    let l2 = if s.contact_note.is_empty() {
        l2
    } else {
        let mut l = l2;
        l.spans.push(Span::raw(" · "));
        l.spans.push(Span::styled(
            s.contact_note.clone(),
            palette::finding("open"),
        ));
        l
    };
    f.render_widget(Paragraph::new(vec![l1, l2]), area);
}

fn heat_pane(f: &mut Frame, area: Rect, app: &mut App, d: &JobDetail) {
    let focused = app.focus == Focus::Ranks;
    let block = Block::bordered()
        .title(Line::styled(
            format!(" Ranks — {} (m: metric) ", app.heat.name()),
            palette::title(),
        ))
        .border_style(if focused {
            Style::default().fg(palette::SKY)
        } else {
            Style::default()
        });
    let inner = block.inner(area);
    f.render_widget(block, area);
    if inner.height < 3 || inner.width < 4 {
        return;
    }
    // Two lines below the grid: the legend and the selected cell.
    let grid_h = inner.height - 2;
    let capacity = inner.width as usize * grid_h as usize;
    let (cells, note) = heatmap::cells(d, app.heat, capacity);
    // Few cells: wider ones ("██ "), easier to read and to point at.
    let width = if cells.len() * 3 <= capacity && inner.width >= 3 {
        3
    } else {
        1
    };
    let cols = (inner.width as usize / width).max(1);
    app.cells = cells.len();
    app.cells_per_row = cols;
    app.cell_ranks = cells.iter().map(|c| c.worst).collect();
    app.cell_sel = app.cell_sel.min(cells.len().saturating_sub(1));
    let mut lines: Vec<Line> = Vec::with_capacity(grid_h as usize + 2);
    for (row, chunk) in cells.chunks(cols).enumerate().take(grid_h as usize) {
        let spans: Vec<Span> = chunk
            .iter()
            .enumerate()
            .flat_map(|(i, c)| {
                let lvl = palette::level(c.value);
                let mut st = Style::default().fg(palette::HEAT[lvl]);
                if focused && row * cols + i == app.cell_sel {
                    st = st.add_modifier(Modifier::REVERSED);
                }
                let g = palette::GLYPH[lvl];
                let text = if width == 3 {
                    format!("{g}{g}")
                } else {
                    g.to_string()
                };
                let mut v = vec![Span::styled(text, st)];
                if width == 3 {
                    v.push(Span::raw(" "));
                }
                v
            })
            .collect();
        lines.push(Line::from(spans));
    }
    while lines.len() < grid_h as usize {
        lines.push(Line::raw(""));
    }
    let scale = match app.heat {
        Heat::Share => "0 → 20 % of wall time",
        Heat::Lateness => "0 → late every time",
        Heat::InFlightAge => "0 → 10 s",
    };
    let mut legend = vec![Span::styled(format!("{note}; "), palette::dim())];
    for (i, g) in palette::GLYPH.iter().enumerate() {
        legend.push(Span::styled(
            g.to_string(),
            Style::default().fg(palette::HEAT[i]),
        ));
    }
    legend.push(Span::styled(format!(" {scale}"), palette::dim()));
    lines.push(Line::from(legend));
    lines.push(selected_line(app, d, cells.get(app.cell_sel)));
    f.render_widget(Paragraph::new(lines), inner);
}

fn selected_line<'a>(app: &App, d: &JobDetail, c: Option<&Cell>) -> Line<'a> {
    let Some(c) = c else {
        return Line::styled("no ranks reported yet", palette::dim());
    };
    let raw = heatmap::values(d, app.heat)
        .get(&c.worst)
        .map_or(0.0, |v| v.1);
    let figure = match app.heat {
        Heat::Share => format!("waited for {:.1} % of wall time", raw * 100.0),
        Heat::Lateness => format!("late in {:.0} % of its collectives", raw * 100.0),
        Heat::InFlightAge => format!("oldest call in flight {}", secs(raw)),
    };
    let node = d
        .ranks
        .iter()
        .find(|r| r.rank == c.worst)
        .map(|r| r.node.clone())
        .unwrap_or_default();
    let what = if c.ranks.len() == 1 {
        format!("rank {} on {node}", c.worst)
    } else {
        format!(
            "{} ({} ranks), worst rank {} on {node}",
            c.label,
            c.ranks.len(),
            c.worst
        )
    };
    Line::from(vec![
        Span::styled("▶ ", Style::default().fg(palette::SKY)),
        Span::raw(format!("{what}: {figure} · Enter opens it")),
    ])
}

fn progress_pane(f: &mut Frame, area: Rect, d: &JobDetail) {
    let block = Block::bordered().title(Line::styled(
        " Communicators — who is behind ",
        palette::title(),
    ));
    let mut comms: Vec<_> = d
        .comms
        .iter()
        .filter(|c| !c.progress.is_empty())
        .map(|c| {
            let min = c.progress.iter().copied().min().unwrap_or(0);
            let max = c.progress.iter().copied().max().unwrap_or(0);
            let behind: Vec<i32> = c
                .members
                .iter()
                .zip(&c.progress)
                .filter(|(_, p)| **p == min)
                .map(|(r, _)| *r)
                .collect();
            (max - min, c, min, max, behind)
        })
        .collect();
    comms.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.size.cmp(&a.1.size)));
    let rows: Vec<Row> = comms
        .iter()
        .map(|(spread, c, min, max, behind)| {
            let name = if c.name.is_empty() {
                format!("{:#018x}", c.comm_id)
            } else {
                c.name.clone()
            };
            let who = if *spread == 0 {
                Span::styled(format!("all at #{max}"), palette::dim())
            } else {
                Span::styled(
                    format!("{} at #{min}", ranks_phrase(behind, 4)),
                    Style::default().fg(palette::ORANGE),
                )
            };
            Row::new(vec![
                ratatui::widgets::Cell::from(name),
                ratatui::widgets::Cell::from(c.size.to_string()),
                ratatui::widgets::Cell::from(format!("#{min}…#{max}")),
                ratatui::widgets::Cell::from(Line::from(who)),
            ])
        })
        .collect();
    let table = Table::new(
        rows,
        [
            Constraint::Length(18),
            Constraint::Length(5),
            Constraint::Length(15),
            Constraint::Min(10),
        ],
    )
    .header(Row::new(vec!["COMMUNICATOR", "SIZE", "DONE", "BEHIND"]).style(palette::title()))
    .block(block);
    f.render_widget(table, area);
}

fn findings_pane(f: &mut Frame, area: Rect, app: &App) {
    let focused = app.focus == Focus::Findings;
    let block = Block::bordered()
        .title(Line::styled(" Findings (Tab, Enter) ", palette::title()))
        .border_style(if focused {
            Style::default().fg(palette::SKY)
        } else {
            Style::default()
        });
    let fs = app.findings();
    if fs.is_empty() {
        f.render_widget(
            Paragraph::new(Line::styled(
                "Nothing found: no rank is slow, nothing hangs.",
                Style::default().fg(palette::GREEN),
            ))
            .wrap(Wrap { trim: true })
            .block(block),
            area,
        );
        return;
    }
    let mut lines = Vec::new();
    for (i, x) in fs.iter().enumerate() {
        let mut head = palette::finding(&x.state);
        if focused && i == app.finding_sel {
            head = head.add_modifier(Modifier::REVERSED);
        }
        lines.push(Line::from(vec![
            Span::styled(
                format!("{} {}", if x.state == "open" { "●" } else { "○" }, x.kind),
                head,
            ),
            Span::styled(format!(" ({})", x.state), palette::dim()),
        ]));
        lines.push(Line::raw(x.summary.clone()));
    }
    // Keep the selected finding in view.
    let scroll = if focused {
        (app.finding_sel * 2) as u16
    } else {
        0
    };
    f.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: true })
            .scroll((scroll.saturating_sub(2), 0))
            .block(block),
        area,
    );
}

/// Per-channel rate of a link: bytes over channel-seconds on the network.
pub fn link_rate(l: &LinkRate) -> Option<f64> {
    (l.network_s > 0.0).then(|| l.bytes as f64 / l.network_s)
}

fn links_pane(f: &mut Frame, area: Rect, d: &JobDetail) {
    let block = Block::bordered().title(Line::styled(
        " Links — slowest node pairs ",
        palette::title(),
    ));
    let mut links: Vec<(&LinkRate, f64)> = d
        .links
        .iter()
        .filter_map(|l| link_rate(l).map(|r| (l, r)))
        .collect();
    if links.is_empty() {
        f.render_widget(
            Paragraph::new(Line::styled(
                "No link data: NCCL jobs report it through the profiler plugin.",
                palette::dim(),
            ))
            .wrap(Wrap { trim: true })
            .block(block),
            area,
        );
        return;
    }
    links.sort_by(|a, b| a.1.total_cmp(&b.1));
    let rows: Vec<Row> = links
        .iter()
        .map(|(l, r)| {
            Row::new(vec![
                format!("{} → {}", l.src, l.dst),
                format!("{}B/s", si(*r)),
                super::bytes(l.bytes),
                secs(l.gpu_wait_s),
            ])
        })
        .collect();
    f.render_widget(
        Table::new(
            rows,
            [
                Constraint::Min(16),
                Constraint::Length(10),
                Constraint::Length(10),
                Constraint::Length(8),
            ],
        )
        .header(Row::new(vec!["LINK", "RATE/CH", "SENT", "GPU WAIT"]).style(palette::title()))
        .block(block),
        area,
    );
}

fn whatif_pane(f: &mut Frame, area: Rect, d: &JobDetail) {
    let block = Block::bordered().title(Line::styled(
        " What if — time saved without each rank ",
        palette::title(),
    ));
    let mut h: Vec<_> = d.health.iter().filter(|h| h.share >= 0.01).collect();
    h.sort_by(|a, b| b.share.total_cmp(&a.share));
    if h.is_empty() {
        f.render_widget(
            Paragraph::new(Line::styled(
                "No rank keeps the others waiting for more than 1 % of the time.",
                palette::dim(),
            ))
            .wrap(Wrap { trim: true })
            .block(block),
            area,
        );
        return;
    }
    let lines: Vec<Line> = h
        .iter()
        .take(area.height.saturating_sub(2) as usize)
        .map(|x| {
            let saved = match d.step_s {
                Some(p) => format!(
                    "step {} → {} (−{:.0} %)",
                    secs(p),
                    secs(p * (1.0 - x.share)),
                    x.share * 100.0
                ),
                None => format!("−{:.0} % of wall time", x.share * 100.0),
            };
            let st = if x.slow {
                Style::default().fg(palette::ORANGE)
            } else {
                Style::default()
            };
            Line::from(vec![
                Span::styled(format!("without rank {}: ", x.rank), st),
                Span::raw(saved),
            ])
        })
        .collect();
    f.render_widget(Paragraph::new(lines).block(block), area);
}
