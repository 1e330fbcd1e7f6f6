//! Logs through `tracing`, on standard error.
//!
//! - Filter: `COMMSCOPE_LOG`, in `RUST_LOG` syntax (`info`, `commscope_collector=debug,warn`, …);
//!   without it, the default the command passes (`info` for the daemons, `warn` for the others).
//! - `--log-format text` (default): `2026-12-04T15:53:25.123456Z  INFO commscope collector:
//!   listening …` — the lines keep the wording they always had, after a time and a level;
//! - `--log-format json`: one JSON object per line (`timestamp`, `level`, `target`, `message`
//!   and the event's fields) for log collectors.

use std::fmt;

use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The environment variable with the filter.
pub const ENV: &str = "COMMSCOPE_LOG";

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// A line of text per event.
    #[default]
    Text,
    /// A JSON object per event.
    Json,
}

/// The name a log line gives its component: `commscope collector` for
/// `commscope_collector::ingest`, `commscope` for the command line, else the target.
pub fn component(target: &str) -> String {
    let krate = target.split("::").next().unwrap_or(target);
    match krate {
        "commscope_cli" | "commscope" => "commscope".to_owned(),
        k => match k.strip_prefix("commscope_") {
            Some(rest) => format!("commscope {rest}"),
            None => target.to_owned(),
        },
    }
}

/// The text format.
#[derive(Debug, Default)]
struct Text;

impl<S, N> FormatEvent<S, N> for Text
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        SystemTime.format_time(&mut w)?;
        let level = *event.metadata().level();
        if w.has_ansi_escapes() {
            let colour = match level {
                tracing::Level::ERROR => "31",
                tracing::Level::WARN => "33",
                tracing::Level::INFO => "32",
                _ => "2",
            };
            write!(w, " \x1b[{colour}m{level:>5}\x1b[0m ")?;
        } else {
            write!(w, " {level:>5} ")?;
        }
        write!(w, "{}: ", component(event.metadata().target()))?;
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}

/// Installs the process's subscriber. `default` is the filter when `COMMSCOPE_LOG` is unset. An
/// invalid `COMMSCOPE_LOG` is reported and `default` used instead; a second call does nothing.
pub fn init(format: LogFormat, default: &str) {
    let (filter, bad) = match std::env::var(ENV) {
        Ok(v) if !v.trim().is_empty() => match EnvFilter::try_new(&v) {
            Ok(f) => (f, None),
            Err(e) => (EnvFilter::new(default), Some(format!("{ENV}={v:?}: {e}"))),
        },
        _ => (EnvFilter::new(default), None),
    };
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let installed = match format {
        LogFormat::Text => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(ansi)
            .event_format(Text)
            .try_init(),
        LogFormat::Json => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .try_init(),
    };
    if installed.is_ok()
        && let Some(bad) = bad
    {
        tracing::warn!("ignoring an invalid log filter, using {default:?}: {bad}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_read_as_the_lines_always_did() {
        assert_eq!(
            component("commscope_collector::ingest"),
            "commscope collector"
        );
        assert_eq!(component("commscope_agent"), "commscope agent");
        assert_eq!(component("commscope_cli::daemons"), "commscope");
        assert_eq!(component("h2::codec"), "h2::codec");
    }
}
