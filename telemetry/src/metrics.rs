//! One Prometheus registry per process.
//!
//! Most of what commscope exports is derived from state the process keeps anyway (a job's ranks,
//! a communicator's histogram, the store's counters). Rather than mirror that state into live
//! metric objects on every change, each component declares its families once, as a catalog of
//! [`Def`]s, and registers a [`Scrape`] collector that fills them from its state when Prometheus
//! scrapes. The `prometheus` crate validates the families, merges them with the process
//! collector's (`process_cpu_seconds_total`, `process_resident_memory_bytes`, …) and writes the
//! exposition text; nothing here writes that text by hand.
//!
//! The catalog is also what `docs/metrics.md` is checked against ([`check_doc`]) and what the
//! Grafana dashboards' queries are checked against.

use std::collections::{BTreeSet, HashMap};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, MetricFamily, MetricType};
use prometheus::{Registry, TextEncoder};

/// The content type of [`encode`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What kind of family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    /// Its name in the exposition format and in `docs/metrics.md`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }

    fn proto(self) -> MetricType {
        match self {
            Kind::Counter => MetricType::COUNTER,
            Kind::Gauge => MetricType::GAUGE,
            Kind::Histogram => MetricType::HISTOGRAM,
        }
    }
}

/// One metric family: its name, kind, help text and label names, fixed at compile time.
#[derive(Debug)]
pub struct Def {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
    pub labels: &'static [&'static str],
}

impl Def {
    const fn of(
        kind: Kind,
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> Def {
        Def {
            name,
            kind,
            help,
            labels,
        }
    }

    /// A counter.
    pub const fn counter(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> Def {
        Def::of(Kind::Counter, name, help, labels)
    }

    /// A gauge.
    pub const fn gauge(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> Def {
        Def::of(Kind::Gauge, name, help, labels)
    }

    /// A histogram.
    pub const fn histogram(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> Def {
        Def::of(Kind::Histogram, name, help, labels)
    }
}

/// The series of one scrape, family by family.
#[derive(Debug, Default)]
pub struct Sink {
    families: Vec<(&'static Def, Vec<proto::Metric>)>,
    index: HashMap<&'static str, usize>,
}

fn label_pairs(def: &Def, values: &[&str]) -> Option<Vec<proto::LabelPair>> {
    if values.len() != def.labels.len() {
        debug_assert!(
            false,
            "{}: labels {:?} given {values:?}",
            def.name, def.labels
        );
        return None;
    }
    // An empty value is no label (as Prometheus stores it): a job without attribution keeps
    // the series it had before its labels existed.
    Some(
        def.labels
            .iter()
            .zip(values)
            .filter(|(_, v)| !v.is_empty())
            .map(|(n, v)| {
                let mut p = proto::LabelPair::default();
                p.set_name((*n).to_owned());
                p.set_value((*v).to_owned());
                p
            })
            .collect(),
    )
}

impl Sink {
    fn push(&mut self, def: &'static Def, m: proto::Metric) {
        let i = *self.index.entry(def.name).or_insert_with(|| {
            self.families.push((def, Vec::new()));
            self.families.len() - 1
        });
        self.families[i].1.push(m);
    }

    /// A counter's or a gauge's value for these label values (in the order of `def.labels`).
    pub fn value(&mut self, def: &'static Def, labels: &[&str], v: f64) {
        let Some(pairs) = label_pairs(def, labels) else {
            return;
        };
        let mut m = proto::Metric::from_label(pairs);
        match def.kind {
            Kind::Counter => {
                let mut c = proto::Counter::default();
                c.set_value(v);
                m.set_counter(c);
            }
            Kind::Gauge => {
                let mut g = proto::Gauge::default();
                g.set_value(v);
                m.set_gauge(g);
            }
            Kind::Histogram => {
                debug_assert!(false, "{} is a histogram", def.name);
                return;
            }
        }
        self.push(def, m);
    }

    /// A histogram: cumulative counts at each upper bound (`+Inf` is `count`), and the sum.
    pub fn histogram(
        &mut self,
        def: &'static Def,
        labels: &[&str],
        bounds: &[f64],
        cumulative: &[u64],
        count: u64,
        sum: f64,
    ) {
        debug_assert_eq!(def.kind, Kind::Histogram, "{}", def.name);
        let Some(pairs) = label_pairs(def, labels) else {
            return;
        };
        let mut h = proto::Histogram::default();
        h.set_sample_count(count);
        h.set_sample_sum(sum);
        h.set_bucket(
            bounds
                .iter()
                .zip(cumulative)
                .map(|(b, c)| {
                    let mut k = proto::Bucket::default();
                    k.set_upper_bound(*b);
                    k.set_cumulative_count(*c);
                    k
                })
                .collect(),
        );
        let mut m = proto::Metric::from_label(pairs);
        m.set_histogram(h);
        self.push(def, m);
    }

    fn into_families(self) -> Vec<MetricFamily> {
        self.families
            .into_iter()
            .map(|(def, metrics)| {
                let mut f = MetricFamily::default();
                f.set_name(def.name.to_owned());
                f.set_help(def.help.to_owned());
                f.set_field_type(def.kind.proto());
                f.set_metric(metrics);
                f
            })
            .collect()
    }
}

type Fill = Box<dyn Fn(&mut Sink) + Send + Sync>;

/// A collector that fills a catalog of families from the process's state at each scrape.
pub struct Scrape {
    descs: Vec<Desc>,
    fill: Fill,
}

impl std::fmt::Debug for Scrape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scrape")
            .field("families", &self.descs.len())
            .finish()
    }
}

impl Scrape {
    /// `fill` writes the series of `defs` (and no others) into the sink.
    pub fn new(
        defs: &[&'static Def],
        fill: impl Fn(&mut Sink) + Send + Sync + 'static,
    ) -> prometheus::Result<Scrape> {
        let descs = defs
            .iter()
            .map(|d| {
                Desc::new(
                    d.name.to_owned(),
                    d.help.to_owned(),
                    d.labels.iter().map(|l| (*l).to_owned()).collect(),
                    HashMap::new(),
                )
            })
            .collect::<prometheus::Result<Vec<_>>>()?;
        Ok(Scrape {
            descs,
            fill: Box::new(fill),
        })
    }
}

impl Collector for Scrape {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut sink = Sink::default();
        (self.fill)(&mut sink);
        sink.into_families()
    }
}

/// A registry with the process collector (CPU seconds, resident memory, open descriptors,
/// threads, start time) and a scrape collector over `defs`.
pub fn registry(
    defs: &[&'static Def],
    fill: impl Fn(&mut Sink) + Send + Sync + 'static,
) -> prometheus::Result<Registry> {
    let r = Registry::new();
    r.register(Box::new(
        prometheus::process_collector::ProcessCollector::for_self(),
    ))?;
    r.register(Box::new(Scrape::new(defs, fill)?))?;
    Ok(r)
}

/// The registry's families in the Prometheus text format.
pub fn encode(r: &Registry) -> String {
    let mut out = String::with_capacity(16 << 10);
    if let Err(e) = TextEncoder::new().encode_utf8(&r.gather(), &mut out) {
        // Only an invalid family (a programming error the tests catch) gets here; serve what
        // was written and say why the rest is missing.
        out.push_str(&format!("# commscope: metrics incomplete: {e}\n"));
    }
    out
}

/// The names of the families a registry has series for now.
pub fn names(r: &Registry) -> BTreeSet<String> {
    r.gather().iter().map(|f| f.name().to_owned()).collect()
}

/// A row of a metrics table in `docs/metrics.md`: names, kind, label names.
#[derive(Debug, PartialEq, Eq)]
struct DocRow {
    names: Vec<String>,
    kind: String,
    labels: Vec<String>,
}

fn backticked(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

fn doc_rows(doc: &str, section: &str) -> Vec<DocRow> {
    let heading = format!("## {section}");
    let mut inside = false;
    let mut rows = Vec::new();
    for line in doc.lines() {
        if line.starts_with("## ") {
            inside = line.trim() == heading;
            continue;
        }
        if !inside || !line.starts_with("| `") {
            continue;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 4 {
            continue;
        }
        rows.push(DocRow {
            names: backticked(cells[1]),
            kind: cells[2].to_owned(),
            labels: backticked(cells[3]),
        });
    }
    rows
}

/// Checks the tables under `## {section}` of `docs/metrics.md` against a catalog: every family
/// has a row with its kind and exactly its labels, and every row names families of the catalog.
/// Returns what does not match, one sentence each.
pub fn check_doc(doc: &str, section: &str, defs: &[&'static Def]) -> Vec<String> {
    let rows = doc_rows(doc, section);
    let mut problems = Vec::new();
    if rows.is_empty() {
        problems.push(format!(
            "docs/metrics.md has no table under \"## {section}\""
        ));
    }
    let by_name: HashMap<&str, &Def> = defs.iter().map(|d| (d.name, *d)).collect();
    let mut documented = BTreeSet::new();
    for row in &rows {
        for name in &row.names {
            documented.insert(name.as_str());
            let Some(def) = by_name.get(name.as_str()) else {
                problems.push(format!(
                    "docs/metrics.md documents {name}, which the registry does not have"
                ));
                continue;
            };
            if row.kind != def.kind.name() {
                problems.push(format!(
                    "{name} is a {} in the registry, a {} in docs/metrics.md",
                    def.kind.name(),
                    row.kind
                ));
            }
            let want: Vec<&str> = def.labels.to_vec();
            if row.labels != want {
                problems.push(format!(
                    "{name} has labels {want:?} in the registry, {:?} in docs/metrics.md",
                    row.labels
                ));
            }
        }
    }
    for d in defs {
        if !documented.contains(d.name) {
            problems.push(format!("{} is not in docs/metrics.md", d.name));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    static UP: Def = Def::gauge("t_up", "Up.", &[]);
    static CALLS: Def = Def::counter("t_calls_total", "Calls.", &["job_id", "op"]);
    static DUR: Def = Def::histogram("t_duration_seconds", "Duration.", &["op"]);

    fn reg() -> Registry {
        registry(&[&UP, &CALLS, &DUR], |s| {
            s.value(&UP, &[], 1.0);
            s.value(&CALLS, &["a\"b", "allreduce"], 3.0);
            s.histogram(&DUR, &["allreduce"], &[0.1, 1.0], &[1, 2], 3, 2.5);
        })
        .expect("a valid catalog")
    }

    #[test]
    fn families_are_encoded_by_the_crate_with_escaping_and_process_metrics() {
        let text = encode(&reg());
        assert!(text.contains("# TYPE t_up gauge\nt_up 1\n"), "{text}");
        assert!(
            text.contains("t_calls_total{job_id=\"a\\\"b\",op=\"allreduce\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("t_duration_seconds_bucket{op=\"allreduce\",le=\"1\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("t_duration_seconds_bucket{op=\"allreduce\",le=\"+Inf\"} 3"),
            "{text}"
        );
        assert!(text.contains("t_duration_seconds_sum{op=\"allreduce\"} 2.5"));
        assert!(text.contains("process_resident_memory_bytes "), "{text}");
    }

    #[test]
    fn a_family_without_series_is_left_out() {
        let r = registry(&[&UP, &CALLS], |s| s.value(&UP, &[], 1.0)).expect("valid");
        let n = names(&r);
        assert!(n.contains("t_up"));
        assert!(!n.contains("t_calls_total"));
    }

    #[test]
    fn an_invalid_name_is_refused_at_registration() {
        static BAD: Def = Def::gauge("t-bad", "Bad.", &[]);
        assert!(registry(&[&BAD], |_| {}).is_err());
    }

    #[test]
    fn the_doc_check_names_every_difference() {
        let doc = "# M\n## Here\n| series | type | labels | meaning |\n|---|---|---|---|\n\
                   | `t_up` | gauge | | up |\n\
                   | `t_calls_total` | gauge | `job_id` | calls |\n\
                   | `t_gone` | counter | | gone |\n## Elsewhere\n| `t_duration_seconds` | histogram | `op` | x |\n";
        let p = check_doc(doc, "Here", &[&UP, &CALLS, &DUR]);
        assert_eq!(p.len(), 4, "{p:#?}");
        assert!(p.iter().any(|s| s.contains("t_calls_total is a counter")));
        assert!(p.iter().any(|s| s.contains("labels [\"job_id\", \"op\"]")));
        assert!(p.iter().any(|s| s.contains("documents t_gone")));
        assert!(
            p.iter()
                .any(|s| s == "t_duration_seconds is not in docs/metrics.md")
        );
        let good = "## Here\n| `t_up` | gauge | | up |\n| `t_calls_total` | counter | `job_id`, `op` | c |\n\
                    | `t_duration_seconds` | histogram | `op` | d |\n";
        assert_eq!(
            check_doc(good, "Here", &[&UP, &CALLS, &DUR]),
            Vec::<String>::new()
        );
    }
}
