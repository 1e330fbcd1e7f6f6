//! `commscope report`: one self-contained HTML file that needs no network to view.
//!
//! The page holds the jobs' post-mortems ([`commscope_analyzer::postmortem::JobReport`]) as JSON,
//! the charting library, and the script that draws them. Charts are drawn by Apache ECharts
//! (vendored in `vendor/`, Apache-2.0), with its SVG renderer: it has every chart the report
//! needs (heatmap, custom timelines, log axes, scatter), is maintained by the Apache Software
//! Foundation, and one minified file embeds as is. Findings are also written as plain HTML, so
//! the sentences read without script.

use commscope_analyzer::postmortem::JobReport;

const ECHARTS: &str = include_str!("../vendor/echarts.min.js");
const SCRIPT: &str = include_str!("report.js");
const STYLE: &str = include_str!("report.css");

/// Escapes text for HTML.
fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            _ => o.push(c),
        }
    }
    o
}

/// JSON that can sit inside a `<script>` element.
fn script_json(v: &serde_json::Value) -> String {
    v.to_string()
        .replace("</", "<\\/")
        .replace("<!--", "<\\!--")
}

/// The whole page for `jobs`; `sources` names what was read, `warnings` what was damaged.
pub fn render(jobs: &[JobReport], sources: &[String], warnings: &[String]) -> String {
    let data = serde_json::json!({ "jobs": jobs, "warnings": warnings });
    let mut body = String::new();
    body += "<header><h1>commscope post-mortem</h1>";
    body += &format!("<p class=\"sources\">From {}</p>", esc(&sources.join(", ")));
    if !warnings.is_empty() {
        body += "<details class=\"warnings\" open><summary>";
        body += &format!(
            "{} file{} could not be read whole",
            warnings.len(),
            if warnings.len() == 1 { "" } else { "s" }
        );
        body += "</summary><ul>";
        for w in warnings {
            body += &format!("<li>{}</li>", esc(w));
        }
        body += "</ul></details>";
    }
    body += "</header>";
    for (i, j) in jobs.iter().enumerate() {
        body += &job_section(i, j);
    }
    if jobs.is_empty() {
        body += "<p>No job could be read.</p>";
    }
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>commscope post-mortem: {title}</title><style>{STYLE}</style></head>\
         <body>{body}<div id=\"errors\" hidden></div>\
         <script>{ECHARTS}</script>\
         <script type=\"application/json\" id=\"report-data\">{data}</script>\
         <script>{SCRIPT}</script></body></html>\n",
        title = esc(&jobs
            .iter()
            .map(|j| j.job.as_str())
            .collect::<Vec<_>>()
            .join(", ")),
        data = script_json(&data),
    )
}

fn job_section(i: usize, j: &JobReport) -> String {
    let mut s = format!(
        "<section class=\"job\" id=\"job-{i}\"><h2>Job {}</h2>",
        esc(&j.job)
    );
    s += &format!(
        "<p class=\"facts\">{} ranks{}, {} records over {:.1} s{}{}</p>",
        j.ranks,
        match j.nodes {
            0 => String::new(),
            1 => " on 1 node".to_owned(),
            n => format!(" on {n} nodes"),
        },
        j.records,
        j.duration_s,
        j.step_s.map_or(String::new(), |p| format!(
            ", a step every {:.1} ms",
            p * 1e3
        )),
        if j.libraries.is_empty() {
            String::new()
        } else {
            format!("; {}", esc(&j.libraries.join("; ")))
        }
    );
    s += "<h3>Findings</h3>";
    if j.findings.is_empty() {
        s += "<p class=\"none\">No findings: no rank, link or collective stood out.</p>";
    }
    for (k, f) in j.findings.iter().enumerate() {
        let x = &f.finding;
        s += &format!(
            "<article class=\"finding {kind}\"><p><span class=\"kind\">{kind}</span> \
             <span class=\"state\">{state}</span> {summary}</p>\
             <div class=\"chart timeline\" data-job=\"{i}\" data-finding=\"{k}\"></div></article>",
            kind = esc(x.kind.name()),
            state = esc(&format!("{:?}", x.state).to_lowercase()),
            summary = esc(&x.summary),
        );
        if let Some(front) = x.evidence["front"].as_array().filter(|a| !a.is_empty()) {
            s += "<table class=\"front\"><caption>The hang front: who is missing, per communicator</caption>\
                  <tr><th>Communicator</th><th>Name</th><th>Call</th><th>Missing</th><th>Waiting</th></tr>";
            for row in front {
                let list = |v: &serde_json::Value| {
                    v.as_array()
                        .map(|a| {
                            a.iter()
                                .map(|r| r.to_string())
                                .collect::<Vec<_>>()
                                .join(", ")
                        })
                        .unwrap_or_default()
                };
                s += &format!(
                    "<tr><td>{}</td><td>{}</td><td>{} #{}</td><td>{}</td><td>{}</td></tr>",
                    esc(row["comm"].as_str().unwrap_or("")),
                    esc(row["name"].as_str().unwrap_or("")),
                    esc(row["op"].as_str().unwrap_or("")),
                    row["seq"],
                    esc(&list(&row["missing"])),
                    esc(&list(&row["waiting"])),
                );
            }
            s += "</table>";
        }
    }
    s += "<h3>What if</h3>";
    match j.whatif.ranks.first() {
        Some((rank, node, share)) => {
            s += &format!(
                "<p class=\"whatif\">Without rank {rank}'s delay{}, the others would wait {:.0} % less of the wall time{}.</p>",
                if node.is_empty() {
                    String::new()
                } else {
                    format!(" (on {})", esc(node))
                },
                share * 100.0,
                j.step_s.map_or(String::new(), |p| format!(
                    ": a step of {:.1} ms would take {:.1} ms",
                    p * 1e3,
                    p * (1.0 - share) * 1e3
                ))
            );
        }
        None => {
            s +=
                "<p class=\"none\">No rank kept the others waiting for 1 % of the time or more.</p>"
        }
    }
    if !j.whatif.ranks.is_empty() {
        s += &format!("<div class=\"chart whatif\" data-job=\"{i}\"></div>");
    }
    for (class, title) in [
        (
            "heatmap",
            "Lateness: how long after the first member each rank arrived (ms)",
        ),
        (
            "progress",
            "Collectives completed per communicator (fewest and most over its ranks)",
        ),
        ("durations", "Call durations"),
        (
            "busbw",
            "Bus bandwidth by message size (nccl-tests factors)",
        ),
        ("links", "Node pairs"),
    ] {
        s += &format!("<h3>{title}</h3><div class=\"chart {class}\" data-job=\"{i}\"></div>");
    }
    s += "</section>";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_data_cannot_close_the_script_or_inject_markup() {
        assert_eq!(esc("<b>&\"'"), "&lt;b&gt;&amp;&quot;&#39;");
        let j = serde_json::json!({"x": "</script><script>alert(1)</script>"});
        assert!(!script_json(&j).contains("</script"));
        let page = render(&[], &["a<b".into()], &["f: </script>".into()]);
        // The vendored library, the data and the report's script: nothing else closes a script.
        assert_eq!(page.matches("</script>").count(), 3);
        assert!(page.contains("a&lt;b"));
    }
}
