//! Where the TUI's data comes from: a collector's Query service ([`crate::live`]), or a trace
//! replayed at a time cursor (the `commscope tui --replay` driver implements [`Source`] over the
//! analyzer). Both hand over the same [`Snapshot`], in the Query service's shapes, so every view
//! works on either.

use commscope_wire::grpc::{JobDetail, JobSummary, RankDetail};

/// What the views show at one moment.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub jobs: Vec<JobSummary>,
    /// The job the views asked for ([`Source::want`]), when it is known.
    pub job: Option<JobDetail>,
    /// The rank the views asked for.
    pub rank: Option<RankDetail>,
    /// The data's clock (seconds): wall time live, the cursor in a replay. Rates are measured
    /// against it.
    pub clock_s: f64,
    /// Why the data is stale or incomplete ("collector unreachable: …").
    pub error: Option<String>,
}

/// A replay's time cursor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cursor {
    /// Seconds since the trace's first record.
    pub at_s: f64,
    /// The trace's length (seconds).
    pub end_s: f64,
    /// One step of `[` and `]` (seconds).
    pub step_s: f64,
}

/// A source of snapshots. `latest` never blocks on the network: a live source polls in the
/// background.
pub trait Source: Send {
    /// The job and rank the open views need in detail.
    fn want(&mut self, job: Option<&str>, rank: Option<i32>);
    /// The newest snapshot, when there is one newer than the last returned.
    fn latest(&mut self) -> Option<Snapshot>;
    /// Where the data comes from, for the title bar.
    fn label(&self) -> String;
    /// A replay's cursor (None live).
    fn cursor(&self) -> Option<Cursor> {
        None
    }
    /// Moves a replay's cursor by `steps` of [`Cursor::step_s`] (nothing live).
    fn seek(&mut self, _steps: f64) {}
}
