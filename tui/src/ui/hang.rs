//! A hang: who never arrived, who waits and since when, the wait chain, and the culprit's
//! process state and stacks, from the finding's evidence.

use commscope_wire::op::Op;
use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Wrap};
use serde_json::Value;

use super::{ranks_phrase, secs};
use crate::app::App;
use crate::palette;

fn section(title: &str) -> Line<'static> {
    Line::styled(title.to_owned(), palette::title())
}

fn ranks_of(v: &Value) -> Vec<i32> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|r| r.as_i64().map(|r| r as i32))
                .collect()
        })
        .unwrap_or_default()
}

pub fn draw(f: &mut Frame, area: Rect, app: &App) {
    let Some(x) = app.hang_finding() else {
        f.render_widget(
            Paragraph::new("No hang in this job: nobody waits for anybody.")
                .block(Block::bordered().title(" Hang ")),
            area,
        );
        return;
    };
    let ev: Value = serde_json::from_str(&x.evidence_json).unwrap_or(Value::Null);
    let mut lines: Vec<Line> = Vec::new();
    let state = if x.state == "open" {
        "open"
    } else {
        "resolved"
    };
    lines.push(Line::from(vec![
        Span::styled(format!("{} ({state})", x.kind), palette::finding(&x.state)),
        Span::styled(format!("  {}", x.id), palette::dim()),
    ]));
    lines.push(Line::raw(""));

    // Who never arrived.
    lines.push(section("Never arrived"));
    let culprits = ev["culprits"]
        .as_array()
        .cloned()
        .or_else(|| ev["ended"].as_array().cloned());
    let call = match (x.comm.as_deref(), x.seq) {
        (Some(c), Some(s)) => format!(" — the collective #{s} on communicator {c}"),
        (Some(c), None) => format!(" — communicator {c}"),
        _ => String::new(),
    };
    match &culprits {
        Some(cs) if !cs.is_empty() => {
            for c in cs {
                let rank = c["rank"].as_i64().unwrap_or(-1);
                let node = c["node"].as_str().unwrap_or("?");
                let pid = c["pid"]
                    .as_u64()
                    .map(|p| format!(", pid {p}"))
                    .unwrap_or_default();
                lines.push(Line::from(vec![
                    Span::styled(
                        format!("  rank {rank}"),
                        Style::default()
                            .fg(palette::VERMILLION)
                            .add_modifier(Modifier::BOLD),
                    ),
                    Span::raw(format!(" on {node}{pid}{call}")),
                ]));
            }
        }
        _ => lines.push(Line::raw(format!("  {}{call}", ranks_phrase(&x.ranks, 16)))),
    }
    lines.push(Line::raw(""));

    // Who waits, and since when.
    let victims = ranks_of(&ev["victims"]);
    let stuck = ev["stuck"].as_array().cloned().unwrap_or_default();
    let longest = stuck
        .iter()
        .filter_map(|s| s["in_flight_s"].as_f64())
        .fold(0.0, f64::max);
    lines.push(section("Waiting"));
    lines.push(Line::raw(format!(
        "  {} wait{}{}",
        ranks_phrase(&victims, 16),
        if victims.len() == 1 { "s" } else { "" },
        if longest > 0.0 {
            format!(", the longest for {}", secs(longest))
        } else {
            String::new()
        }
    )));
    for s in stuck.iter().take(8) {
        lines.push(Line::styled(
            format!(
                "    rank {} in {} #{} on {} for {}",
                s["rank"],
                s["op"].as_str().unwrap_or("?"),
                s["seq"],
                s["comm"].as_str().unwrap_or("?"),
                secs(s["in_flight_s"].as_f64().unwrap_or(0.0))
            ),
            palette::dim(),
        ));
    }
    if stuck.len() > 8 {
        lines.push(Line::styled(
            format!("    … and {} more", stuck.len() - 8),
            palette::dim(),
        ));
    }
    lines.push(Line::raw(""));

    // The chain, and the culprit's process.
    lines.push(section("Wait chain"));
    for c in culprits.iter().flatten() {
        let rank = c["rank"].as_i64().unwrap_or(-1);
        let where_ = if c["records_cut_short"].as_bool() == Some(true) {
            "unknown: its records end early, where its trace is damaged".to_owned()
        } else if c["in_library"].as_bool() == Some(true) {
            inside_phrase(&c["inside"])
                .unwrap_or_else(|| "blocked in another communication call".to_owned())
        } else {
            match c["process"]["state_name"].as_str() {
                Some(s) => format!(
                    "outside the communication library, {s}{}",
                    c["process"]["wchan"]
                        .as_str()
                        .filter(|w| !w.is_empty())
                        .map(|w| format!(" in {w}"))
                        .unwrap_or_default()
                ),
                None => "outside the communication library".to_owned(),
            }
        };
        lines.push(Line::raw(format!(
            "  {} → rank {rank} → {where_}",
            ranks_phrase(&victims, 6)
        )));
        let p = &c["process"];
        if p.is_object() {
            lines.push(Line::raw(format!(
                "  process: state {} ({}), CPU {} s, {}",
                p["state"].as_str().unwrap_or("?"),
                p["state_name"].as_str().unwrap_or("?"),
                p["cpu_s"]
                    .as_f64()
                    .map_or("?".to_owned(), |c| format!("{c:.2}")),
                if p["cpu_advancing"].as_bool() == Some(true) {
                    "CPU time advancing (busy)"
                } else {
                    "CPU time not advancing (idle or blocked)"
                }
            )));
        }
        stacks(&mut lines, &c["stacks"]);
    }
    lines.push(Line::raw(""));
    lines.push(section("What to do"));
    lines.push(Line::raw(format!("  {}", x.summary)));
    f.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .scroll((app.scroll, 0))
            .block(Block::bordered().title(Line::styled(
                " Hang — who waits for whom ",
                palette::title(),
            ))),
        area,
    );
}

/// "blocked in recv from rank 1 (tag 8) for 19.2 s; posted send to rank 3 (tag 7)": the
/// calls a culprit inside the library is in (the finding's `culprits[].inside`).
fn inside_phrase(inside: &Value) -> Option<String> {
    let calls = inside.as_array().filter(|a| !a.is_empty())?;
    let call = |c: &Value| {
        let op = c["op"].as_str().unwrap_or("?");
        let Some(dir) = Op::from_name(op).and_then(Op::peer_word) else {
            return format!("{op} #{}", c["seq"]);
        };
        let peer = c["peer"]
            .as_i64()
            .map_or_else(|| "any rank".to_owned(), |p| format!("rank {p}"));
        match c["tag"].as_i64() {
            Some(t) if t >= 0 => format!("{op} {dir} {peer} (tag {t})"),
            _ => format!("{op} {dir} {peer}"),
        }
    };
    let (posted, blocking): (Vec<&Value>, Vec<&Value>) = calls
        .iter()
        .partition(|c| c["posted"].as_bool() == Some(true));
    let mut parts = Vec::new();
    if !blocking.is_empty() {
        let age = blocking
            .iter()
            .filter_map(|c| c["in_flight_s"].as_f64())
            .fold(0.0, f64::max);
        let shown: Vec<String> = blocking.iter().take(3).map(|c| call(c)).collect();
        parts.push(format!("blocked in {} for {}", shown.join(", "), secs(age)));
    }
    if !posted.is_empty() {
        let shown: Vec<String> = posted.iter().take(3).map(|c| call(c)).collect();
        parts.push(format!("posted {}, not complete", shown.join(", ")));
    }
    Some(parts.join("; "))
}

fn stacks(lines: &mut Vec<Line>, s: &Value) {
    if !s.is_object() {
        lines.push(Line::styled(
            "  stacks: none in the evidence yet (the culprit's node agent adds them when it can reach the process)",
            palette::dim(),
        ));
        return;
    }
    for (what, key) in [("native stack", "native"), ("Python stack", "python")] {
        if let Some(t) = s[key].as_str().filter(|t| !t.trim().is_empty()) {
            lines.push(Line::raw(format!("  {what}:")));
            for l in t.lines().take(40) {
                lines.push(Line::styled(format!("    {l}"), palette::dim()));
            }
        }
    }
    if let Some(e) = s["error"].as_str().filter(|e| !e.is_empty()) {
        lines.push(Line::styled(format!("  stacks: {e}"), palette::dim()));
    }
}
