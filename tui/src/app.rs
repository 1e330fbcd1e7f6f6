//! The TUI's state and what each key does to it; rendering is in [`crate::ui`].

use std::collections::HashMap;

use commscope_wire::grpc::{Finding, JobDetail, JobSummary};
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use crate::source::{Cursor, Snapshot};

/// A screen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    Jobs,
    Job,
    Hang,
    Rank,
}

/// What the job view's heatmap shows per rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heat {
    /// Share of wall time the job waits for the rank.
    Share,
    /// Share of its collectives in which it arrived late.
    Lateness,
    /// Age of its oldest call in flight.
    InFlightAge,
}

impl Heat {
    pub fn name(self) -> &'static str {
        match self {
            Heat::Share => "blame share",
            Heat::Lateness => "lateness",
            Heat::InFlightAge => "in-flight age",
        }
    }

    fn next(self) -> Heat {
        match self {
            Heat::Share => Heat::Lateness,
            Heat::Lateness => Heat::InFlightAge,
            Heat::InFlightAge => Heat::Share,
        }
    }
}

/// The jobs list's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sort {
    /// Running first, then open findings, then name.
    Attention,
    Name,
    Ranks,
    Rate,
}

impl Sort {
    pub fn name(self) -> &'static str {
        match self {
            Sort::Attention => "attention",
            Sort::Name => "name",
            Sort::Ranks => "ranks",
            Sort::Rate => "records/s",
        }
    }

    fn next(self) -> Sort {
        match self {
            Sort::Attention => Sort::Name,
            Sort::Name => Sort::Ranks,
            Sort::Ranks => Sort::Rate,
            Sort::Rate => Sort::Attention,
        }
    }
}

/// Which pane of the job view takes the arrow keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Focus {
    Ranks,
    Findings,
}

/// What the event loop should do after a key.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Action {
    None,
    Quit,
    /// Move a replay's cursor by this many steps.
    Seek(f64),
}

/// Everything the views show and where the user is.
#[derive(Debug)]
pub struct App {
    pub stack: Vec<View>,
    pub help: bool,
    pub data: Snapshot,
    pub label: String,
    pub cursor: Option<Cursor>,
    /// Per job: (records, clock) at the previous snapshot, and the rate measured then.
    rates: HashMap<String, (u64, f64, f64)>,
    pub job_sel: usize,
    pub sort: Sort,
    pub filter: String,
    pub filtering: bool,
    pub heat: Heat,
    /// The user picked the metric (`m`); until then it follows the job: in-flight age while
    /// something hangs, blame share otherwise.
    pub heat_chosen: bool,
    pub focus: Focus,
    /// Index of the selected heatmap cell.
    pub cell_sel: usize,
    /// Cells per heatmap row at the last draw (for up/down).
    pub cells_per_row: usize,
    /// Cells at the last draw (a cell is a rank, or a node's ranks folded).
    pub cells: usize,
    /// The rank each cell opens.
    pub cell_ranks: Vec<i32>,
    pub finding_sel: usize,
    pub open_job: Option<String>,
    pub open_rank: Option<i32>,
    /// The finding the hang view shows.
    pub open_finding: Option<String>,
    pub scroll: u16,
}

impl App {
    pub fn new(label: String) -> App {
        App {
            stack: vec![View::Jobs],
            help: false,
            data: Snapshot::default(),
            label,
            cursor: None,
            rates: HashMap::new(),
            job_sel: 0,
            sort: Sort::Attention,
            filter: String::new(),
            filtering: false,
            heat: Heat::Share,
            heat_chosen: false,
            focus: Focus::Ranks,
            cell_sel: 0,
            cells_per_row: 1,
            cells: 0,
            cell_ranks: Vec::new(),
            finding_sel: 0,
            open_job: None,
            open_rank: None,
            open_finding: None,
            scroll: 0,
        }
    }

    /// The screen shown.
    pub fn view(&self) -> View {
        *self.stack.last().unwrap_or(&View::Jobs)
    }

    /// Takes a new snapshot: measures record rates against the previous one.
    pub fn update(&mut self, s: Snapshot) {
        for j in &s.jobs {
            let e = self
                .rates
                .entry(j.job.clone())
                .or_insert((j.records, s.clock_s, 0.0));
            let dt = s.clock_s - e.1;
            if dt > 0.0 {
                e.2 = j.records.saturating_sub(e.0) as f64 / dt;
                e.0 = j.records;
                e.1 = s.clock_s;
            } else if dt < 0.0 {
                // A replay stepped back: start over.
                *e = (j.records, s.clock_s, 0.0);
            }
        }
        self.data = s;
        let n = self.visible_jobs().len();
        self.job_sel = self.job_sel.min(n.saturating_sub(1));
        let f = self.findings().len();
        self.finding_sel = self.finding_sel.min(f.saturating_sub(1));
        if !self.heat_chosen {
            let hangs = self
                .findings()
                .iter()
                .any(|f| f.state == "open" && is_hang_like(f));
            self.heat = if hangs {
                Heat::InFlightAge
            } else {
                Heat::Share
            };
        }
    }

    /// Records per second of a job, over the last two snapshots.
    pub fn rate(&self, job: &str) -> f64 {
        self.rates.get(job).map_or(0.0, |r| r.2)
    }

    /// The jobs list as shown: filtered by `/`, in the chosen order.
    pub fn visible_jobs(&self) -> Vec<&JobSummary> {
        let f = self.filter.to_lowercase();
        let mut v: Vec<&JobSummary> = self
            .data
            .jobs
            .iter()
            .filter(|j| {
                f.is_empty()
                    || j.job.to_lowercase().contains(&f)
                    || j.state.contains(&f)
                    || j.flavour.to_lowercase().contains(&f)
                    || j.nodes.iter().any(|n| n.to_lowercase().contains(&f))
            })
            .collect();
        match self.sort {
            Sort::Attention => v.sort_by(|a, b| {
                (b.state == "running", b.open_findings, &a.job).cmp(&(
                    a.state == "running",
                    a.open_findings,
                    &b.job,
                ))
            }),
            Sort::Name => v.sort_by(|a, b| a.job.cmp(&b.job)),
            Sort::Ranks => v.sort_by(|a, b| (b.ranks, &a.job).cmp(&(a.ranks, &b.job))),
            Sort::Rate => v.sort_by(|a, b| {
                self.rate(&b.job)
                    .total_cmp(&self.rate(&a.job))
                    .then(a.job.cmp(&b.job))
            }),
        }
        v
    }

    /// The open job's detail, when it arrived.
    pub fn job(&self) -> Option<&JobDetail> {
        self.data.job.as_ref().filter(|d| {
            d.summary
                .as_ref()
                .is_some_and(|s| Some(&s.job) == self.open_job.as_ref())
        })
    }

    /// The open job's findings, open first, then the latest.
    pub fn findings(&self) -> Vec<&Finding> {
        let mut v: Vec<&Finding> = self
            .job()
            .map(|d| d.findings.iter().collect())
            .unwrap_or_default();
        v.sort_by_key(|f| std::cmp::Reverse((f.state == "open", f.opened_at)));
        v
    }

    /// The finding the hang view shows: the chosen one, else the first open hang-like one.
    pub fn hang_finding(&self) -> Option<&Finding> {
        let f = self.findings();
        if let Some(id) = &self.open_finding
            && let Some(x) = f.iter().find(|x| &x.id == id)
        {
            return Some(x);
        }
        f.into_iter().find(|x| is_hang_like(x))
    }

    /// The job and rank the views need from the source.
    pub fn wants(&self) -> (Option<&str>, Option<i32>) {
        let rank = (self.view() == View::Rank)
            .then_some(self.open_rank)
            .flatten();
        let job = (self.view() != View::Jobs)
            .then_some(self.open_job.as_deref())
            .flatten();
        (job, rank)
    }

    fn push(&mut self, v: View) {
        self.stack.push(v);
        self.scroll = 0;
    }

    fn back(&mut self) {
        if self.stack.len() > 1 {
            self.stack.pop();
            self.scroll = 0;
        }
    }

    /// Applies a key.
    pub fn key(&mut self, k: KeyEvent) -> Action {
        if k.kind == KeyEventKind::Release {
            return Action::None;
        }
        if k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL) {
            return Action::Quit;
        }
        if self.filtering {
            self.filter_key(k.code);
            return Action::None;
        }
        if self.help {
            if matches!(k.code, KeyCode::Char('q')) {
                return Action::Quit;
            }
            self.help = false;
            return Action::None;
        }
        match k.code {
            KeyCode::Char('q') => return Action::Quit,
            KeyCode::Char('?') => self.help = true,
            KeyCode::Esc | KeyCode::Backspace => self.back(),
            KeyCode::Char('[') => return Action::Seek(-1.0),
            KeyCode::Char(']') => return Action::Seek(1.0),
            KeyCode::Char('{') => return Action::Seek(-10.0),
            KeyCode::Char('}') => return Action::Seek(10.0),
            code => match self.view() {
                View::Jobs => self.jobs_key(code),
                View::Job => self.job_key(code),
                View::Hang | View::Rank => self.scroll_key(code),
            },
        }
        Action::None
    }

    fn filter_key(&mut self, code: KeyCode) {
        match code {
            KeyCode::Enter => self.filtering = false,
            KeyCode::Esc => {
                self.filtering = false;
                self.filter.clear();
            }
            KeyCode::Backspace => {
                self.filter.pop();
            }
            KeyCode::Char(c) => self.filter.push(c),
            _ => {}
        }
        self.job_sel = 0;
    }

    fn jobs_key(&mut self, code: KeyCode) {
        let n = self.visible_jobs().len();
        match code {
            KeyCode::Down | KeyCode::Char('j') => {
                self.job_sel = (self.job_sel + 1).min(n.saturating_sub(1))
            }
            KeyCode::Up | KeyCode::Char('k') => self.job_sel = self.job_sel.saturating_sub(1),
            KeyCode::Home | KeyCode::Char('g') => self.job_sel = 0,
            KeyCode::End | KeyCode::Char('G') => self.job_sel = n.saturating_sub(1),
            KeyCode::Char('/') => {
                self.filtering = true;
                self.filter.clear();
            }
            KeyCode::Char('s') => self.sort = self.sort.next(),
            KeyCode::Enter | KeyCode::Right | KeyCode::Char('l') => {
                if let Some(j) = self.visible_jobs().get(self.job_sel) {
                    self.open_job = Some(j.job.clone());
                    self.cell_sel = 0;
                    self.finding_sel = 0;
                    self.open_finding = None;
                    self.push(View::Job);
                }
            }
            _ => {}
        }
    }

    fn job_key(&mut self, code: KeyCode) {
        match code {
            KeyCode::Tab => {
                self.focus = match self.focus {
                    Focus::Ranks => Focus::Findings,
                    Focus::Findings => Focus::Ranks,
                }
            }
            KeyCode::Char('m') => {
                self.heat = self.heat.next();
                self.heat_chosen = true;
            }
            KeyCode::Char('w') => {
                if let Some(f) = self.findings().into_iter().find(|f| is_hang_like(f)) {
                    self.open_finding = Some(f.id.clone());
                    self.push(View::Hang);
                }
            }
            KeyCode::Enter => self.job_enter(),
            code if self.focus == Focus::Findings => {
                let n = self.findings().len();
                match code {
                    KeyCode::Down | KeyCode::Char('j') => {
                        self.finding_sel = (self.finding_sel + 1).min(n.saturating_sub(1))
                    }
                    KeyCode::Up | KeyCode::Char('k') => {
                        self.finding_sel = self.finding_sel.saturating_sub(1)
                    }
                    _ => {}
                }
            }
            code => {
                let last = self.cells.saturating_sub(1);
                let row = self.cells_per_row.max(1);
                self.cell_sel = match code {
                    KeyCode::Right | KeyCode::Char('l') => (self.cell_sel + 1).min(last),
                    KeyCode::Left | KeyCode::Char('h') => self.cell_sel.saturating_sub(1),
                    KeyCode::Down | KeyCode::Char('j') => (self.cell_sel + row).min(last),
                    KeyCode::Up | KeyCode::Char('k') => self.cell_sel.saturating_sub(row),
                    KeyCode::Home | KeyCode::Char('g') => 0,
                    KeyCode::End | KeyCode::Char('G') => last,
                    _ => self.cell_sel,
                };
            }
        }
    }

    fn job_enter(&mut self) {
        match self.focus {
            Focus::Findings => {
                let Some(f) = self.findings().get(self.finding_sel).map(|f| (*f).clone()) else {
                    return;
                };
                if is_hang_like(&f) {
                    self.open_finding = Some(f.id.clone());
                    self.push(View::Hang);
                } else if let Some(r) = f.ranks.first() {
                    self.open_rank = Some(*r);
                    self.push(View::Rank);
                }
            }
            Focus::Ranks => {
                if let Some(r) = self.cell_ranks.get(self.cell_sel) {
                    self.open_rank = Some(*r);
                    self.push(View::Rank);
                }
            }
        }
    }

    fn scroll_key(&mut self, code: KeyCode) {
        match code {
            KeyCode::Down | KeyCode::Char('j') => self.scroll = self.scroll.saturating_add(1),
            KeyCode::Up | KeyCode::Char('k') => self.scroll = self.scroll.saturating_sub(1),
            KeyCode::PageDown => self.scroll = self.scroll.saturating_add(10),
            KeyCode::PageUp => self.scroll = self.scroll.saturating_sub(10),
            KeyCode::Home | KeyCode::Char('g') => self.scroll = 0,
            _ => {}
        }
    }
}

/// A finding the hang view explains: someone waits for someone.
pub fn is_hang_like(f: &Finding) -> bool {
    matches!(f.kind.as_str(), "hang" | "dead-rank" | "mismatch")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(c: KeyCode) -> KeyEvent {
        KeyEvent::new(c, KeyModifiers::NONE)
    }

    fn job(name: &str, state: &str, ranks: u32, open: u32, records: u64) -> JobSummary {
        JobSummary {
            job: name.into(),
            state: state.into(),
            ranks,
            open_findings: open,
            records,
            ..Default::default()
        }
    }

    fn snap(jobs: Vec<JobSummary>, clock_s: f64) -> Snapshot {
        Snapshot {
            jobs,
            clock_s,
            ..Default::default()
        }
    }

    #[test]
    fn jobs_needing_attention_come_first_and_rates_are_measured() {
        let mut a = App::new("t".into());
        a.update(snap(
            vec![
                job("done", "ended", 8, 0, 10),
                job("quiet", "running", 4, 0, 100),
                job("hung", "running", 4, 1, 100),
            ],
            10.0,
        ));
        let names: Vec<&str> = a.visible_jobs().iter().map(|j| j.job.as_str()).collect();
        assert_eq!(names, ["hung", "quiet", "done"]);
        a.update(snap(
            vec![
                job("done", "ended", 8, 0, 10),
                job("quiet", "running", 4, 0, 300),
                job("hung", "running", 4, 1, 100),
            ],
            12.0,
        ));
        assert_eq!(a.rate("quiet"), 100.0);
        assert_eq!(a.rate("hung"), 0.0);
        a.key(key(KeyCode::Char('s')));
        assert_eq!(a.sort, Sort::Name);
        let names: Vec<&str> = a.visible_jobs().iter().map(|j| j.job.as_str()).collect();
        assert_eq!(names, ["done", "hung", "quiet"]);
    }

    #[test]
    fn the_filter_narrows_the_list_and_esc_clears_it() {
        let mut a = App::new("t".into());
        a.update(snap(
            vec![
                job("train-a", "running", 8, 0, 1),
                job("eval-b", "running", 8, 0, 1),
            ],
            1.0,
        ));
        a.key(key(KeyCode::Char('/')));
        for c in "eval".chars() {
            a.key(key(KeyCode::Char(c)));
        }
        assert!(a.filtering);
        assert_eq!(a.visible_jobs().len(), 1);
        // 'q' while typing is part of the filter, not quit.
        assert_eq!(a.key(key(KeyCode::Char('q'))), Action::None);
        a.key(key(KeyCode::Backspace));
        a.key(key(KeyCode::Enter));
        assert!(!a.filtering);
        assert_eq!(a.visible_jobs()[0].job, "eval-b");
        a.key(key(KeyCode::Char('/')));
        a.key(key(KeyCode::Esc));
        assert_eq!(a.visible_jobs().len(), 2);
    }

    #[test]
    fn enter_opens_esc_goes_back_and_q_quits() {
        let mut a = App::new("t".into());
        a.update(snap(vec![job("j1", "running", 4, 0, 1)], 1.0));
        assert_eq!(a.wants(), (None, None));
        a.key(key(KeyCode::Enter));
        assert_eq!(a.view(), View::Job);
        assert_eq!(a.wants(), (Some("j1"), None));
        a.cell_ranks = vec![0, 1, 2, 3];
        a.cells = 4;
        a.cells_per_row = 2;
        a.key(key(KeyCode::Char('j')));
        a.key(key(KeyCode::Char('l')));
        assert_eq!(a.cell_sel, 3);
        a.key(key(KeyCode::Enter));
        assert_eq!(a.view(), View::Rank);
        assert_eq!(a.wants(), (Some("j1"), Some(3)));
        a.key(key(KeyCode::Esc));
        a.key(key(KeyCode::Esc));
        assert_eq!(a.view(), View::Jobs);
        a.key(key(KeyCode::Esc));
        assert_eq!(a.view(), View::Jobs, "the first screen stays");
        a.key(key(KeyCode::Char('?')));
        assert!(a.help);
        assert_eq!(a.key(key(KeyCode::Esc)), Action::None);
        assert!(!a.help);
        assert_eq!(a.key(key(KeyCode::Char('q'))), Action::Quit);
        assert_eq!(a.key(key(KeyCode::Char(']'))), Action::Seek(1.0));
    }

    #[test]
    fn w_opens_the_hang_of_the_open_job() {
        let mut a = App::new("t".into());
        let mut s = snap(vec![job("j1", "running", 4, 1, 1)], 1.0);
        s.job = Some(JobDetail {
            summary: Some(job("j1", "running", 4, 1, 1)),
            findings: vec![
                Finding {
                    id: "0xs".into(),
                    kind: "slow-rank".into(),
                    state: "resolved".into(),
                    ranks: vec![5],
                    ..Default::default()
                },
                Finding {
                    id: "0xh".into(),
                    kind: "hang".into(),
                    state: "open".into(),
                    ranks: vec![2],
                    ..Default::default()
                },
            ],
            ..Default::default()
        });
        a.update(s.clone());
        a.key(key(KeyCode::Char('w')));
        assert_eq!(a.view(), View::Jobs, "no job open yet");
        a.key(key(KeyCode::Enter));
        a.update(s);
        assert_eq!(a.heat, Heat::InFlightAge, "while something hangs");
        a.key(key(KeyCode::Char('m')));
        assert_eq!(a.heat, Heat::Share, "until the user picks");
        a.key(key(KeyCode::Char('w')));
        assert_eq!(a.view(), View::Hang);
        assert_eq!(a.hang_finding().map(|f| f.id.as_str()), Some("0xh"));
        a.key(key(KeyCode::Esc));
        a.key(key(KeyCode::Tab));
        assert_eq!(a.findings()[0].id, "0xh", "open first");
        a.key(key(KeyCode::Char('j')));
        a.key(key(KeyCode::Enter));
        assert_eq!(a.view(), View::Rank, "a slow rank opens its rank");
        assert_eq!(a.open_rank, Some(5));
    }
}
