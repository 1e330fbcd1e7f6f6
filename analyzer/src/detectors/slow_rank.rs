//! `slow-rank`: a rank (or a node's ranks) the others keep waiting for because it computes
//! longer before its collectives.
//!
//! **Measured, clock-free.** In a synchronizing collective (all-reduce, all-gather,
//! reduce-scatter, all-to-all, barrier) every member leaves at about the same moment, so a
//! member's duration tells how long it waited: the member with the shortest duration arrived
//! last, and a member's lateness is `reference(duration) − its duration`. Only host durations on
//! each rank's own clock are compared, never timestamps of different hosts.
//!
//! Lateness alone does not make a root: a rank can arrive late because it waited in another
//! communicator (a pipeline receive, a tensor-parallel all-reduce behind a straggler). So each
//! rank's own *compute* before the instance is measured, again on its own clock: the time since
//! its previous call on the same communicator minus the time it spent inside any communication
//! call in between. A late member is blamed only for the part of its lateness its own extra
//! compute explains: `min(lateness, compute − reference(compute))`. Victims wait inside calls,
//! roots compute; the difference is what separates them. The references are quartiles, not
//! medians, so that up to three quarters of a communicator may be slow and the fast ones still
//! set them.
//!
//! Blame is accumulated per rank with exponential decay (time constant `tau`) across all
//! communicators; `blame / tau` is the share of wall time the job spends waiting for that rank
//! (its single largest instance left out: one hiccup is never a slow rank).
//!
//! **Fires** when a rank's share — or, once that is past half the threshold, its share since it
//! was last calm (a straggler's 5 s average lags its onset by seconds; the episode's rate does
//! not) — is at least `min_share`, at least `dominance` times the job's
//! lower-quartile share, at least a third of the slowest rank's share, and it was late in at
//! least `min_late` (decayed) instances, repeatedly on some communicator. When at least half of
//! a node's ranks are slow together (and the job has another node), they are one finding: the
//! whole node from three quarters of it, else only the ranks near the slowest.
//!
//! **Resolves** when its share falls below half the threshold, or when its recent share — the
//! same blame decayed with the short time constant [`RECENT_TAU_S`] — does, over at least
//! [`QUIET_INSTANCES`] recent instances: well within 10 s of the cause ending, whatever share it
//! had, and in a noisy job where every rank is a little late now and then. A rank whose finding
//! resolved starts afresh: it is named again only on new evidence. Its summary gives the
//! figures at its peak.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::FastMap;

use serde_json::json;

use crate::finding::{Class, Finding, Kind, State, finding_id, ranks_phrase};
use crate::stream::{Tuning, median};

/// The time constant (seconds) of the recent share, which tells that a cause has ended …
pub const RECENT_TAU_S: f64 = 2.0;
/// … over at least this many recent judged instances (decayed alike).
pub const QUIET_INSTANCES: f64 = 3.0;
/// A rank whose recent share is under this fraction of `min_share` is calm: a slow episode
/// starts after it (see [`RankSt::episode_share`]).
pub const CALM_FRACTION: f64 = 0.25;
/// A rank's share must stand this many standard errors above the thresholds to open (see
/// [`RankSt::share_error`]).
pub const NOISE_Z: f64 = 1.5;

/// One member's part in an instance, measured on its own clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct Member {
    pub rank: i32,
    /// Time inside the call.
    pub dur_ns: u64,
    /// Own compute since its previous call on this communicator (None: first call, or the
    /// previous one was not blocking).
    pub compute_ns: Option<u64>,
    /// The rank's blame total when it left its previous call on this communicator: blame
    /// given since then already accounts for part of its extra compute.
    pub blamed_before_ns: u64,
}

/// What the detector needs of one call to measure its rank's compute.
#[derive(Clone, Copy, Debug)]
pub struct CallTimes {
    pub rank: i32,
    pub comm: u64,
    /// The call's interval (GPU interval where it has one).
    pub start_ns: u64,
    pub end_ns: u64,
    /// It waits for its peers before returning (not nonblocking, persistent or untracked).
    pub blocking: bool,
    /// Its agent samples calls ([`commscope_wire::op::flags::COMPUTE_KNOWN`] or a sample shift).
    pub sampled: bool,
    /// The compute its agent measured over every call, kept or not.
    pub agent_compute_ns: Option<u64>,
}

#[derive(Debug, Default)]
struct RankSt {
    /// Time spent inside blocking calls so far (ns, own clock).
    inside_ns: u64,
    /// Its agent samples its calls: compute is known only where the agent measured it; time
    /// inside left-out calls is not seen here.
    sampled: bool,
    /// comm → (t_exit, inside_ns after it, blamed_ns then) of the previous blocking call on it.
    last_on_comm: FastMap<u64, (u64, u64, u64)>,
    /// Blame given to this rank so far (ns, undecayed).
    blamed_ns: u64,
    /// Decayed blame (seconds others waited for this rank's own compute), decayed late count,
    /// decayed count of judged instances, at time `at_s`.
    blame_s: f64,
    /// The largest single instance's blame, decayed alike: left out of the share, so one
    /// hiccup never makes a slow rank by itself; with sampling (each instance weighted by its
    /// modulus) the second largest too.
    max_obs_s: f64,
    max2_obs_s: f64,
    /// The variance that sampling adds to `blame_s` (s², decayed with twice the rate): zero
    /// where every instance is seen.
    sampling_var_s2: f64,
    /// Σ w·own² over judged instances (s², decayed like `blame_s`), and Σ w decayed with twice
    /// the rate: with `judged` and `blame_s`, the spread of one instance's blame and how many
    /// instances the decayed sum rests on (see [`RankSt::share_error`]).
    sq_s2: f64,
    judged_k2: f64,
    late: f64,
    judged: f64,
    at_s: f64,
    /// Undecayed totals.
    total_blame_s: f64,
    total_late: u64,
    /// When it was first judged.
    first_s: Option<f64>,
    /// Per communicator: decayed (late, judged) — persistence.
    per_comm: FastMap<u64, (f64, f64)>,
    /// Blame and judged instances decayed with [`RECENT_TAU_S`] (at `at_s` too).
    recent_s: f64,
    recent_judged: f64,
    /// The current episode: since when it has been more than calm (its recent share at least
    /// [`CALM_FRACTION`] of the threshold), and the blame since then with its largest two
    /// instances, decayed with `tau` like the rest.
    episode: Episode,
}

/// Blame since a rank was last calm (see [`RankSt::episode_share`]).
#[derive(Debug, Default)]
struct Episode {
    since_s: Option<f64>,
    /// Judged instances since (decayed, and decayed with twice the rate) and their `Σ w·own²`
    /// (see [`RankSt::episode_error`]).
    judged: f64,
    judged_k2: f64,
    sq_s2: f64,
    blame_s: f64,
    max_obs_s: f64,
    max2_obs_s: f64,
}

impl RankSt {
    fn decay_to(&mut self, t: f64, tau: f64) {
        if t > self.at_s {
            let k = (-(t - self.at_s) / tau).exp();
            let kr = (-(t - self.at_s) / RECENT_TAU_S).exp();
            self.recent_s *= kr;
            self.recent_judged *= kr;
            self.blame_s *= k;
            self.max_obs_s *= k;
            self.max2_obs_s *= k;
            self.sampling_var_s2 *= k * k;
            self.sq_s2 *= k;
            self.judged_k2 *= k * k;
            self.episode.judged *= k;
            self.episode.judged_k2 *= k * k;
            self.episode.sq_s2 *= k;
            self.episode.blame_s *= k;
            self.episode.max_obs_s *= k;
            self.episode.max2_obs_s *= k;
            self.late *= k;
            self.judged *= k;
            for v in self.per_comm.values_mut() {
                v.0 *= k;
                v.1 *= k;
            }
            self.at_s = t;
        }
    }

    fn decay_factor(&self, now: f64, tau: f64) -> f64 {
        if now > self.at_s {
            (-(now - self.at_s) / tau).exp()
        } else {
            1.0
        }
    }

    /// The share of wall time others wait for this rank, at `now`.
    fn share(&self, now: f64, tau: f64) -> f64 {
        self.rate(
            (self.blame_s, self.max_obs_s, self.max2_obs_s),
            self.first_s,
            now,
            tau,
        )
    }

    /// Decayed `blame` (with its largest two instances) as a share of the time since `from`:
    /// the decayed sum over a history shorter than a few time constants covers less time, so it
    /// is divided by the time it does cover (bias correction), at least half a time constant.
    /// The largest instance (two, sampled) is left out: one hiccup is never a slow rank.
    fn rate(
        &self,
        (blame, max, max2): (f64, f64, f64),
        from: Option<f64>,
        now: f64,
        tau: f64,
    ) -> f64 {
        let outliers = max + if self.sampled { max2 } else { 0.0 };
        (blame - outliers).max(0.0) * self.decay_factor(now, tau) / covered(from, now, tau)
    }

    /// What [`RankSt::share`] (or, `episode`, [`RankSt::episode_share`]) rests on, at `now`.
    fn tally(&self, now: f64, tau: f64, episode: bool) -> Tally {
        let k = self.decay_factor(now, tau);
        let e = &self.episode;
        let (judged, judged_k2, blame, sq, sampling, from) = if episode {
            (e.judged, e.judged_k2, e.blame_s, e.sq_s2, 0.0, e.since_s)
        } else {
            let r = self;
            (
                r.judged,
                r.judged_k2,
                r.blame_s,
                r.sq_s2,
                r.sampling_var_s2,
                r.first_s,
            )
        };
        Tally {
            judged: judged * k,
            judged_k2: judged_k2 * k * k,
            blame: blame * k,
            sq: sq * k,
            sampling: sampling * k * k,
            covered: covered(from, now, tau),
        }
    }

    /// The standard error of [`RankSt::share`] (see [`Tally::error`]).
    fn share_error(&self, now: f64, tau: f64) -> f64 {
        Tally::error(&[self.tally(now, tau, false)])
    }

    /// The same for [`RankSt::episode_share`], over the episode's instances: a straggler's
    /// blame is steady since its onset, not over the calm instances before it.
    fn episode_error(&self, now: f64, tau: f64) -> f64 {
        Tally::error(&[self.tally(now, tau, true)])
    }

    /// The share of wall time others have waited for this rank since it was last calm — the
    /// same estimate as [`RankSt::share`] over the episode only. A rank that turns slow has its
    /// 5 s average build up over several seconds (a 7 % straggler crosses 5 % after 6 s); over
    /// the episode its rate shows once two of its late instances were seen. As in the share,
    /// the largest instance is left out and the window is at least half a time constant, so a
    /// burst or two of noise after a calm spell stays small. (An episode never starts before
    /// the rank was first judged.)
    fn episode_share(&self, now: f64, tau: f64) -> f64 {
        let e = &self.episode;
        match e.since_s {
            Some(_) => self.rate((e.blame_s, e.max_obs_s, e.max2_obs_s), e.since_s, now, tau),
            None => 0.0,
        }
    }

    /// Calm (its recent share under [`CALM_FRACTION`] of `min_share`, judged in enough recent
    /// instances to tell): what came before does not belong to the episode that follows.
    fn calm_check(&mut self, now: f64, min_share: f64) {
        let calm = self.recent_judged >= QUIET_INSTANCES
            && self.recent_s / RECENT_TAU_S < CALM_FRACTION * min_share;
        if calm || self.episode.since_s.is_none() {
            self.episode = Episode {
                since_s: Some(now),
                ..Episode::default()
            };
        }
    }

    fn late_now(&self, now: f64, tau: f64) -> f64 {
        self.late * self.decay_factor(now, tau)
    }

    /// Late again and again on some communicator (not a one-off).
    fn repeated(&self, min_ratio: f64) -> bool {
        self.per_comm
            .values()
            .any(|(l, j)| *j >= 2.0 && l / j >= min_ratio)
    }

    /// Its recent share, when it was judged in enough recent instances to tell.
    fn recent_share(&self, now: f64) -> Option<f64> {
        let k = if now > self.at_s {
            (-(now - self.at_s) / RECENT_TAU_S).exp()
        } else {
            1.0
        };
        (self.recent_judged * k >= QUIET_INSTANCES).then_some(self.recent_s * k / RECENT_TAU_S)
    }

    /// A new episode: the evidence of the last one is spent.
    fn start_afresh(&mut self, now: f64) {
        self.blame_s = 0.0;
        self.max_obs_s = 0.0;
        self.max2_obs_s = 0.0;
        self.sampling_var_s2 = 0.0;
        self.sq_s2 = 0.0;
        self.late = 0.0;
        self.first_s = Some(now);
        self.episode = Episode::default();
        for v in self.per_comm.values_mut() {
            v.0 = 0.0;
        }
    }
}

/// A rank's decayed blame statistics at one moment, for its standard error.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    /// Judged instances (Σ w, decayed), and decayed with twice the rate.
    judged: f64,
    judged_k2: f64,
    /// Σ w·own (s) and Σ w·own² (s²), decayed.
    blame: f64,
    sq: f64,
    /// The variance sampling adds (s²).
    sampling: f64,
    /// The time the decayed sums cover (s).
    covered: f64,
}

impl Tally {
    /// The standard error of the summed share of one or more ranks (a node's): how far the
    /// blame of the instances it rests on could have put ranks with no cause of their own.
    /// Two parts:
    /// - the variance of one instance's blame times the (decayed) number of instances: in a
    ///   healthy job every rank is last now and then, and over a 5 s window of long steps
    ///   (hundreds of ms) one of them is last often enough by chance to cross the threshold,
    ///   while a straggler is late by about as much every time (a narrow variance). For a
    ///   node, its ranks' blame is summed per instance: they take turns being last, so each
    ///   one's blame is as uneven as a healthy rank's while the node's is steady (the cross
    ///   terms are left out: mostly one rank of a node is the last one);
    /// - sampling: an instance kept with probability `1/w` and counted `w` times has a blame
    ///   of `s = w·own`; the sum of such has the variance `Σ own²·w·(w − 1)`, estimated by
    ///   `Σ s²·(1 − 1/w)` over the instances kept (zero where every instance is seen).
    fn error(ranks: &[Tally]) -> f64 {
        if ranks.is_empty() {
            return 0.0;
        }
        let n = ranks.len() as f64;
        let sum = |f: fn(&Tally) -> f64| ranks.iter().map(f).sum::<f64>();
        let judged = sum(|t| t.judged) / n;
        let per_instance = if judged > 0.0 {
            let m = sum(|t| t.blame) / judged;
            (sum(|t| t.sq) / judged - m * m).max(0.0)
        } else {
            0.0
        };
        let var = per_instance * sum(|t| t.judged_k2) / n + sum(|t| t.sampling);
        var.max(0.0).sqrt() / (sum(|t| t.covered) / n)
    }
}

/// A rank as the operator views show it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RankHealth {
    pub rank: i32,
    /// The share of wall time the job waits for this rank's own compute (decayed, `tau`).
    pub share: f64,
    /// The same over the last seconds, once it was judged in enough recent instances.
    pub recent_share: Option<f64>,
    /// The share of its judged instances in which it arrived late (decayed alike).
    pub late_ratio: f64,
    /// A slow-rank finding names it now.
    pub slow: bool,
}

/// A finding while it is open.
#[derive(Debug, Clone)]
struct SlowOpen {
    ranks: Vec<i32>,
    /// The ranks it opened with (its id stays when a node's ranks join it).
    id_ranks: Vec<i32>,
    node: Option<String>,
    opened_s: f64,
    /// Its highest share so far, and the step period then.
    peak_share: f64,
    peak_step: Option<(f64, String)>,
    /// Late in at least half its instances on some communicator at some point while open.
    persistent: bool,
}

/// What a slow-rank evaluation is given.
#[derive(Debug)]
pub struct Context<'a> {
    pub job: &'a str,
    pub now_s: f64,
    pub tuning: &'a Tuning,
    /// Rank → node (empty or absent: unknown).
    pub nodes: &'a FastMap<i32, String>,
    /// The step period and where it came from, when known.
    pub step: Option<(f64, String)>,
}

/// The slow-rank detector of one job.
#[derive(Debug, Default)]
pub struct SlowRanks {
    ranks: FastMap<i32, RankSt>,
    open: Vec<SlowOpen>,
}

/// The time a decayed sum since `from` covers: over a history shorter than a few time
/// constants, less than `tau` (bias correction), but at least half a time constant.
fn covered(from: Option<f64>, now: f64, tau: f64) -> f64 {
    match from {
        Some(f) => tau * (1.0 - (-(now - f).max(tau / 2.0) / tau).exp()),
        None => tau,
    }
}

/// Keeps the largest two of the values seen in `max` and `max2`.
fn keep_largest(max: &mut f64, max2: &mut f64, s: f64) {
    if s > *max {
        *max2 = *max;
        *max = s;
    } else if s > *max2 {
        *max2 = s;
    }
}

/// The lower quartile (0 when empty).
fn lower_quartile(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[(v.len() - 1) / 4]
}

/// The upper quartile (of two: the larger).
fn upper_quartile_u64(v: &mut [u64]) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let i = (3 * v.len() / 4).min(v.len() - 1);
    *v.select_nth_unstable(i).1
}

/// The lower quartile (of two: the smaller).
fn lower_quartile_u64(v: &mut [u64]) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let i = (v.len() - 1) / 4;
    *v.select_nth_unstable(i).1
}

fn fmt_dur(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{:.0} µs", s * 1e6)
    }
}

/// Communicators remembered per rank, at most (a program that makes them without end).
const MAX_COMMS_PER_RANK: usize = 1024;

impl SlowRanks {
    /// A rank's agent samples its calls: from now on its compute comes from the agent.
    pub fn sampled(&mut self, rank: i32) {
        self.ranks.entry(rank).or_default().sampled = true;
    }

    /// One completed call of a rank, in its own order: measures its own compute since its
    /// previous call on the same communicator, the member's part in the call's instance.
    pub fn call(&mut self, c: &CallTimes) -> Member {
        let r = self.ranks.entry(c.rank).or_default();
        r.sampled |= c.sampled;
        let mut m = Member {
            rank: c.rank,
            dur_ns: c.end_ns.saturating_sub(c.start_ns),
            ..Member::default()
        };
        if r.last_on_comm.len() >= MAX_COMMS_PER_RANK && !r.last_on_comm.contains_key(&c.comm) {
            r.last_on_comm.clear();
        }
        if r.sampled {
            // Measured by the agent over every call, kept or not.
            m.compute_ns = c.agent_compute_ns;
            if let Some(&(_, _, blamed)) = r.last_on_comm.get(&c.comm) {
                m.blamed_before_ns = blamed;
            }
            r.last_on_comm.insert(c.comm, (c.end_ns, 0, r.blamed_ns));
        } else if c.blocking {
            if let Some(&(t_exit, inside, blamed)) = r.last_on_comm.get(&c.comm) {
                m.blamed_before_ns = blamed;
                let span = c.start_ns.saturating_sub(t_exit);
                m.compute_ns = Some(span.saturating_sub(r.inside_ns.saturating_sub(inside)));
            }
            r.inside_ns += m.dur_ns;
            r.last_on_comm
                .insert(c.comm, (c.end_ns, r.inside_ns, r.blamed_ns));
        } else {
            // Its wait is not known: the next instance on this comm has no compute measure.
            r.last_on_comm.remove(&c.comm);
        }
        m
    }

    /// Judges one completed instance of a synchronizing collective on `comm` whose members all
    /// blocked: blames the late members for their own extra compute. `weight`: the instances it
    /// stands for (consistent sampling).
    pub fn judge(&mut self, comm: u64, members: &[Member], weight: u32, now: f64, t: &Tuning) {
        if members.len() < 2 || members.iter().any(|m| m.compute_ns.is_none()) {
            return;
        }
        let mut durs: Vec<u64> = members.iter().map(|m| m.dur_ns).collect();
        let d_ref = upper_quartile_u64(&mut durs);
        let mut comp: Vec<u64> = members.iter().filter_map(|m| m.compute_ns).collect();
        // The lower quartile: with two members, the slower one's excess is over the faster.
        let c_ref = lower_quartile_u64(&mut comp);
        let w = f64::from(weight.max(1));
        for m in members {
            let late = d_ref.saturating_sub(m.dur_ns);
            let r = self.ranks.entry(m.rank).or_default();
            // Extra compute not already blamed at an instance in between (a tensor-parallel
            // all-reduce inside a data-parallel step): each unit of it is blamed once.
            let already = r.blamed_ns.saturating_sub(m.blamed_before_ns);
            let own = late.min(
                m.compute_ns
                    .unwrap_or(0)
                    .saturating_sub(c_ref)
                    .saturating_sub(already),
            );
            r.decay_to(now, t.tau_s);
            r.calm_check(now, t.min_share);
            r.first_s.get_or_insert(now);
            r.judged += w;
            r.judged_k2 += w;
            r.episode.judged += w;
            r.episode.judged_k2 += w;
            r.recent_judged += w;
            if r.per_comm.len() >= 64 && !r.per_comm.contains_key(&comm) {
                r.per_comm.retain(|_, v| v.1 >= 0.5);
            }
            let pc = r.per_comm.entry(comm).or_default();
            pc.1 += w;
            if own < t.min_excess_ns {
                continue;
            }
            pc.0 += w;
            // The wait it caused, for every instance this one stands for; lateness itself is
            // counted as seen: repetition needs as many late instances sampled or not.
            let blame_ns = own * u64::from(weight.max(1));
            r.blamed_ns += blame_ns;
            // Blame charged at this communicator's own instance is not "blamed in between" for
            // the rank's next call on it: its snapshot moves too.
            if let Some(x) = r.last_on_comm.get_mut(&comm) {
                x.2 += blame_ns;
            }
            let s = own as f64 / 1e9 * w;
            r.blame_s += s;
            r.recent_s += s;
            r.sampling_var_s2 += s * s * (1.0 - 1.0 / w);
            r.sq_s2 += s * s / w;
            keep_largest(&mut r.max_obs_s, &mut r.max2_obs_s, s);
            let e = &mut r.episode;
            e.blame_s += s;
            e.sq_s2 += s * s / w;
            keep_largest(&mut e.max_obs_s, &mut e.max2_obs_s, s);
            r.late += 1.0;
            r.total_blame_s += s;
            r.total_late += 1;
        }
    }

    /// The ranks of the findings open now.
    pub fn open_ranks(&self) -> BTreeSet<i32> {
        self.open
            .iter()
            .flat_map(|o| o.ranks.iter().copied())
            .collect()
    }

    /// Each rank's share of wall time the others wait for it, at `now`.
    pub fn shares(&self, now: f64, tau: f64) -> BTreeMap<i32, f64> {
        self.ranks
            .iter()
            .map(|(r, st)| (*r, st.share(now, tau)))
            .collect()
    }

    /// Per rank, in rank order: what the operator views show ([`RankHealth`]), at `now`.
    pub fn health(&self, now: f64, tau: f64) -> Vec<RankHealth> {
        self.ranks
            .iter()
            .map(|(r, st)| {
                let judged = st.judged * st.decay_factor(now, tau);
                RankHealth {
                    rank: *r,
                    share: st.share(now, tau),
                    recent_share: st.recent_share(now),
                    late_ratio: if judged >= 1.0 {
                        (st.late_now(now, tau) / judged).min(1.0)
                    } else {
                        0.0
                    },
                    slow: self.open.iter().any(|o| o.ranks.contains(r)),
                }
            })
            .collect()
    }

    /// Per rank, highest share first: (rank, share, decayed late instances, highest
    /// per-communicator late ratio, blame in seconds) — for looking into verdicts.
    pub fn debug_ranks(&self, now: f64, tau: f64) -> Vec<(i32, f64, f64, f64, f64)> {
        let mut v: Vec<(i32, f64, f64, f64, f64)> = self
            .ranks
            .iter()
            .map(|(r, st)| {
                let ratio = st
                    .per_comm
                    .values()
                    .filter(|(_, j)| *j >= 2.0)
                    .map(|(l, j)| l / j)
                    .fold(0.0, f64::max);
                (
                    *r,
                    st.share(now, tau),
                    st.late_now(now, tau),
                    ratio,
                    st.total_blame_s,
                )
            })
            .collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1));
        v
    }

    /// The slow-rank findings open now (with hysteresis), appended to `out`.
    pub fn findings(&mut self, cx: &Context, out: &mut Vec<Finding>) {
        let t = cx.tuning;
        let now = cx.now_s;
        // Quiet: recently below the lower threshold (against the job's recent shares), while
        // still calling collectives.
        // Recent shares, of the ranks judged in enough recent instances to tell.
        let recent_of: HashMap<i32, f64> = self
            .ranks
            .iter()
            .filter_map(|(r, st)| Some((*r, st.recent_share(now)?)))
            .collect();
        let recent_reference =
            lower_quartile(&mut recent_of.values().copied().collect::<Vec<f64>>());
        let quiet: BTreeSet<i32> = recent_of
            .iter()
            .filter(|(_, s)| **s < t.min_share / 2.0 || **s < t.dominance * recent_reference / 2.0)
            .map(|(r, _)| *r)
            .collect();
        // (rank, share, decayed late count — zero unless it is late repeatedly on some
        // communicator and still late lately)
        let mut shares: Vec<(i32, f64, f64)> = self
            .ranks
            .iter()
            .map(|(r, st)| {
                let active = st.repeated(t.min_late_ratio) && !quiet.contains(r);
                let late = if active {
                    st.late_now(now, t.tau_s)
                } else {
                    0.0
                };
                (*r, st.share(now, t.tau_s), late)
            })
            .collect();
        shares.sort_by_key(|s| s.0);
        // What a rank is judged on to open: its share, or while its 5 s average is still
        // building up (past half the threshold), its share since it was last calm — each as
        // measured (`firing_of`, the figure quoted) and less `NOISE_Z` standard errors
        // (`sure_of`, what must pass the thresholds).
        let mut firing_of: HashMap<i32, f64> = HashMap::new();
        let mut sure_of: HashMap<i32, f64> = HashMap::new();
        for &(r, s, _) in &shares {
            let Some(st) = self.ranks.get(&r) else {
                continue;
            };
            let mut firing = s;
            let mut sure = s - NOISE_Z * st.share_error(now, t.tau_s);
            // Not for a rank whose calls are sampled: an instance there weighs for many, and
            // over an episode of a few seconds the noise of a few of them named healthy
            // ranks (a fresh seed at 1 in 8: 10 healthy jobs of 200 with a finding, 6
            // without the episode share).
            if s >= t.min_share / 2.0 && !st.sampled {
                let e = st.episode_share(now, t.tau_s);
                firing = firing.max(e);
                sure = sure.max(e - NOISE_Z * st.episode_error(now, t.tau_s));
            }
            firing_of.insert(r, firing);
            sure_of.insert(r, sure);
        }
        // The reference is the lower quartile, not the median: with half the job slow (a slow
        // node of a 2-node job) the median rank is itself slow.
        let mut all: Vec<f64> = shares.iter().map(|s| s.1).collect();
        let reference = lower_quartile(&mut all);
        // A rank far below the slowest one (under a third of its share) is the noise around
        // it, not a cause of its own.
        // The same over recent shares: while the slowest rank's share is still building up
        // (its 5 s average lags), the noise around it is already told apart.
        let top = shares.iter().map(|s| s.1).fold(0.0, f64::max);
        let top_recent = recent_of.values().copied().fold(0.0, f64::max);
        let high = |r: i32, s: f64, late: f64| {
            let sure = sure_of.get(&r).copied().unwrap_or(0.0);
            let s = firing_of.get(&r).copied().unwrap_or(s);
            sure >= t.min_share
                && sure >= t.dominance * reference
                && late >= t.min_late
                && 3.0 * s >= top
                && recent_of.get(&r).is_none_or(|x| 3.0 * x >= top_recent)
        };
        let low = |r: i32, s: f64| {
            !quiet.contains(&r) && s >= t.min_share / 2.0 && s >= t.dominance * reference / 2.0
        };
        let share_of: HashMap<i32, f64> = shares.iter().map(|s| (s.0, s.1)).collect();
        // A node's ranks take turns being last: each one's share, and more so its recent
        // share, swings while the node's mean holds. A node's finding stays while that mean
        // stays above the lower threshold.
        let node_low = |ranks: &[i32]| {
            let n = ranks.len().max(1) as f64;
            let share = ranks.iter().filter_map(|r| share_of.get(r)).sum::<f64>() / n;
            let recent: Vec<f64> = ranks
                .iter()
                .filter_map(|r| recent_of.get(r))
                .copied()
                .collect();
            let recent_quiet = !recent.is_empty() && {
                let m = recent.iter().sum::<f64>() / recent.len() as f64;
                m < t.min_share / 2.0 || m < t.dominance * recent_reference / 2.0
            };
            !recent_quiet && share >= t.min_share / 2.0 && share >= t.dominance * reference / 2.0
        };
        // Keep the open ones that stay above the lower threshold.
        let mut open: Vec<SlowOpen> = Vec::new();
        let mut taken: BTreeSet<i32> = BTreeSet::new();
        for o in std::mem::take(&mut self.open) {
            let stays = o
                .ranks
                .iter()
                .any(|r| low(*r, share_of.get(r).copied().unwrap_or(0.0)))
                || (o.node.is_some() && node_low(&o.ranks));
            if stays {
                taken.extend(o.ranks.iter().copied());
                open.push(o);
            } else {
                for r in &o.ranks {
                    if let Some(st) = self.ranks.get_mut(r) {
                        st.start_afresh(now);
                    }
                }
            }
        }
        let node_of = |r: &i32| cx.nodes.get(r).cloned().unwrap_or_default();
        let mut node_members: HashMap<String, Vec<i32>> = HashMap::new();
        let known: BTreeSet<i32> = self.ranks.keys().chain(cx.nodes.keys()).copied().collect();
        for r in known {
            node_members.entry(node_of(&r)).or_default().push(r);
        }
        // Per node: ranks above the lower threshold, and whether one is above the upper one.
        let mut by_node: BTreeMap<String, (Vec<i32>, bool)> = BTreeMap::new();
        for (r, s, late) in &shares {
            if low(*r, *s) {
                let e = by_node.entry(node_of(r)).or_default();
                e.0.push(*r);
                e.1 |= high(*r, *s, *late) && !taken.contains(r);
            }
        }
        // A slow node's ranks take turns being last, so each one's blame is as uneven as a
        // healthy rank's while the node's is steady: the node is judged as one, on its ranks'
        // mean share less the noise of their blame summed per instance.
        let node_high = |lows: &[i32]| {
            let n = lows.len() as f64;
            let sts: Vec<&RankSt> = lows.iter().filter_map(|r| self.ranks.get(r)).collect();
            // Its 5 s average, or — none of its ranks sampled — its rate since its ranks
            // were last calm.
            let pooled = |episode: bool| {
                let rate: f64 = sts
                    .iter()
                    .map(|st| {
                        if episode {
                            st.episode_share(now, t.tau_s)
                        } else {
                            st.share(now, t.tau_s)
                        }
                    })
                    .sum();
                let tallies: Vec<Tally> = sts
                    .iter()
                    .map(|st| st.tally(now, t.tau_s, episode))
                    .collect();
                (rate, Tally::error(&tallies))
            };
            let (mut firing, mut se) = pooled(false);
            if sts.iter().all(|st| !st.sampled) {
                let (e, e_se) = pooled(true);
                if e - NOISE_Z * e_se > firing - NOISE_Z * se {
                    (firing, se) = (e, e_se);
                }
            }
            // `shares` is sorted by rank.
            let late: f64 = lows
                .iter()
                .filter_map(|r| shares.binary_search_by_key(r, |x| x.0).ok())
                .map(|i| shares[i].2)
                .sum();
            let sure = (firing - NOISE_Z * se) / n;
            sure >= t.min_share
                && sure >= t.dominance * reference
                && late >= t.min_late
                && 3.0 * firing / n >= top
        };
        for (node, (lows, any_high)) in by_node {
            let on_node = node_members.get(&node).map_or(0, Vec::len);
            // A slow node is slow against other nodes: a job on one node has ranks only.
            let is_node = !node.is_empty()
                && node_members.len() >= 2
                && lows.len() >= 2
                && 2 * lows.len() >= on_node;
            let any_high = any_high || (is_node && node_high(&lows));
            if !is_node {
                for r in lows {
                    let (s, late) = shares
                        .iter()
                        .find(|x| x.0 == r)
                        .map_or((0.0, 0.0), |x| (x.1, x.2));
                    if !taken.contains(&r) && high(r, s, late) {
                        open.push(SlowOpen {
                            ranks: vec![r],
                            id_ranks: vec![r],
                            node: None,
                            opened_s: now,
                            peak_share: 0.0,
                            peak_step: None,
                            persistent: false,
                        });
                    }
                }
                continue;
            }
            // Half the node or more is slow: one finding for the node. Three quarters or more:
            // the whole node (the rest are slow too, only less visibly: their waits fall on the
            // others' instances); fewer: only the ranks near the slowest.
            let mut lows = if 4 * lows.len() >= 3 * on_node {
                node_members.get(&node).cloned().unwrap_or(lows)
            } else {
                let share = |r: &i32| share_of.get(r).copied().unwrap_or(0.0);
                let top = lows.iter().map(share).fold(0.0, f64::max);
                lows.into_iter().filter(|r| share(r) >= top / 2.0).collect()
            };
            lows.sort_unstable();
            merge_node(&mut open, node, lows, any_high, now, &node_of);
        }
        // The figures quoted are the ones judged on: while a rank's 5 s average still builds
        // up, its rate since its episode began.
        for o in &mut open {
            let share = o
                .ranks
                .iter()
                .map(|r| firing_of.get(r).copied().unwrap_or(0.0))
                .fold(0.0, f64::max);
            if share >= o.peak_share {
                o.peak_share = share;
                o.peak_step = cx.step.clone();
            }
            o.persistent |= o
                .ranks
                .iter()
                .filter_map(|r| self.ranks.get(r))
                .any(|st| st.repeated(0.5));
        }
        for o in &open {
            out.push(self.finding(o, cx, &share_of, &firing_of));
        }
        self.open = open;
    }

    fn finding(
        &self,
        o: &SlowOpen,
        cx: &Context,
        share_of: &HashMap<i32, f64>,
        firing_of: &HashMap<i32, f64>,
    ) -> Finding {
        let now = cx.now_s;
        let tau = cx.tuning.tau_s;
        let share = o.peak_share;
        let share_now = o
            .ranks
            .iter()
            .map(|r| firing_of.get(r).copied().unwrap_or(0.0))
            .fold(0.0, f64::max);
        let nodes: Vec<String> = o
            .ranks
            .iter()
            .filter_map(|r| cx.nodes.get(r).filter(|n| !n.is_empty()).cloned())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let sts = || o.ranks.iter().filter_map(|r| self.ranks.get(r));
        let late = sts().map(|st| st.late_now(now, tau)).fold(0.0, f64::max);
        let total_blame = sts().map(|st| st.total_blame_s).fold(0.0, f64::max);
        let total_late = sts().map(|st| st.total_late).max().unwrap_or(0);
        let persistent = o.persistent;
        let job_median = {
            let mut all: Vec<f64> = share_of.values().copied().collect();
            median(&mut all)
        };
        let step = o.peak_step.as_ref();
        let impact = match step {
            Some((p, _)) => format!(
                "the others wait {} per step for it ({:.0} % of the {} step)",
                fmt_dur(share * p),
                share * 100.0,
                fmt_dur(*p)
            ),
            None => format!("the others wait for it {:.0} % of the time", share * 100.0),
        };
        let who = match &o.node {
            Some(n) => format!("{n} ({})", ranks_phrase(&o.ranks)),
            None => format!(
                "{} on {}",
                ranks_phrase(&o.ranks),
                nodes.first().map_or("an unknown node", String::as_str)
            ),
        };
        let what_next = match &o.node {
            Some(_) => {
                "every rank of the node computes slowly: check the node's CPU/GPU clocks, thermal throttling and noisy neighbours, or drain it"
            }
            None => {
                "it computes longer than its peers before each collective: check that rank's data shard, GPU health and CPU contention (top/nvidia-smi on that node)"
            }
        };
        Finding {
            id: finding_id(Kind::SlowRank, cx.job, None, &o.id_ranks, None),
            kind: Kind::SlowRank,
            class: Class::NonCommunicationSlow,
            state: State::Open,
            job: cx.job.to_owned(),
            comm: None,
            seq: None,
            ranks: o.ranks.clone(),
            nodes,
            link: None,
            opened_at: (o.opened_s * 1e9) as u64,
            resolved_at: None,
            confidence: if persistent { 0.9 } else { 0.7 },
            summary: format!(
                "{who} arrives last at collectives ({}): {impact} — {what_next}",
                if persistent {
                    "persistently"
                } else {
                    "in bursts"
                }
            ),
            evidence: json!({
                "share_of_time": share,
                "share_now": share_now,
                "persistence": if persistent { "persistent" } else { "transient" },
                "late_instances_decayed": late,
                "late_instances_total": total_late,
                "blame_total_s": total_blame,
                "step_s": step.map(|s| s.0),
                "step_from": step.map(|s| s.1.clone()),
                "job_median_share": job_median,
                "at_ns": (now * 1e9) as u64,
            }),
        }
    }
}

/// A slow node: one finding. It takes over open findings of ranks on the node (keeping the
/// earliest one's id and opening time) once a rank crosses the upper threshold.
fn merge_node(
    open: &mut Vec<SlowOpen>,
    node: String,
    lows: Vec<i32>,
    any_high: bool,
    now: f64,
    node_of: &dyn Fn(&i32) -> String,
) {
    let on_node = |o: &SlowOpen| o.ranks.iter().any(|r| node_of(r) == node);
    let (mine, rest): (Vec<SlowOpen>, Vec<SlowOpen>) =
        std::mem::take(open).into_iter().partition(on_node);
    *open = rest;
    let Some(first) = mine.iter().min_by(|a, b| a.opened_s.total_cmp(&b.opened_s)) else {
        if any_high {
            open.push(SlowOpen {
                ranks: lows.clone(),
                id_ranks: lows,
                node: Some(node),
                opened_s: now,
                peak_share: 0.0,
                peak_step: None,
                persistent: false,
            });
        }
        return;
    };
    let mut merged: BTreeSet<i32> = lows.into_iter().collect();
    merged.extend(mine.iter().flat_map(|o| o.ranks.iter().copied()));
    let best = mine
        .iter()
        .max_by(|a, b| a.peak_share.total_cmp(&b.peak_share))
        .expect("one at least");
    open.push(SlowOpen {
        ranks: merged.into_iter().collect(),
        id_ranks: first.id_ranks.clone(),
        node: Some(node),
        opened_s: first.opened_s,
        peak_share: best.peak_share,
        peak_step: best.peak_step.clone(),
        persistent: mine.iter().any(|o| o.persistent),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const WORLD: u64 = 0x100;

    /// A job of `n` ranks, `per_node` per node, stepping one world all-reduce at a time: each
    /// rank computes `base` plus its extra, then every member leaves together.
    struct Job {
        det: SlowRanks,
        nodes: FastMap<i32, String>,
        /// Per rank: its clock (ns) after its last call.
        t: Vec<u64>,
        now_ns: u64,
        tuning: Tuning,
        /// Consistent sampling: only every `modulus`-th instance is seen, weighted by it,
        /// with its compute measured by the agent.
        modulus: u32,
        k: u64,
    }

    impl Job {
        fn new(n: i32, per_node: i32) -> Job {
            Job {
                det: SlowRanks::default(),
                nodes: (0..n).map(|r| (r, format!("n{}", r / per_node))).collect(),
                t: vec![0; n as usize],
                now_ns: 0,
                tuning: Tuning::default(),
                modulus: 1,
                k: 0,
            }
        }

        fn sampled(n: i32, per_node: i32, modulus: u32) -> Job {
            Job {
                modulus,
                ..Job::new(n, per_node)
            }
        }

        /// One step: rank r computes `base_ms + extra(r)` ms; the all-reduce ends when the
        /// last one arrives, plus 1 ms of transfer.
        fn step(&mut self, base_ms: f64, extra: impl Fn(i32) -> f64) {
            let n = self.t.len() as i32;
            let arrive: Vec<u64> = (0..n)
                .map(|r| self.now_ns + ((base_ms + extra(r)) * MS as f64) as u64)
                .collect();
            let end = arrive.iter().max().copied().unwrap_or(0) + MS;
            let sampled = self.modulus > 1;
            let kept = self.k.is_multiple_of(u64::from(self.modulus));
            self.k += 1;
            if kept {
                let members: Vec<Member> = (0..n)
                    .map(|r| {
                        self.det.call(&CallTimes {
                            rank: r,
                            comm: WORLD,
                            start_ns: arrive[r as usize],
                            end_ns: end,
                            blocking: true,
                            sampled,
                            agent_compute_ns: sampled
                                .then(|| arrive[r as usize] - self.t[r as usize]),
                        })
                    })
                    .collect();
                self.det.judge(
                    WORLD,
                    &members,
                    self.modulus,
                    end as f64 / 1e9,
                    &self.tuning,
                );
            }
            self.now_ns = end;
            self.t.iter_mut().for_each(|t| *t = end);
        }

        fn steps(&mut self, k: usize, base_ms: f64, extra: impl Fn(i32) -> f64) {
            for _ in 0..k {
                self.step(base_ms, &extra);
            }
        }

        fn findings(&mut self) -> Vec<Finding> {
            let cx = Context {
                job: "j",
                now_s: self.now_ns as f64 / 1e9,
                tuning: &self.tuning,
                nodes: &self.nodes,
                step: None,
            };
            let mut out = vec![];
            self.det.findings(&cx, &mut out);
            out
        }

        /// Steps for `secs` seconds of job time, evaluating once a second; the findings of the
        /// last evaluation.
        fn run(&mut self, secs: f64, base_ms: f64, extra: impl Fn(i32) -> f64) -> Vec<Finding> {
            let until = self.now_ns + (secs * 1e9) as u64;
            let mut next = self.now_ns + 1_000 * MS;
            let mut last = vec![];
            while self.now_ns < until {
                self.step(base_ms, &extra);
                if self.now_ns >= next {
                    last = self.findings();
                    next += 1_000 * MS;
                }
            }
            last
        }
    }

    /// Steps for `secs` seconds, evaluating once a second: when (seconds after the start) each
    /// finding opened, its ranks and the share it quoted.
    fn opened(
        j: &mut Job,
        secs: f64,
        base_ms: f64,
        extra: impl Fn(i32) -> f64,
    ) -> Vec<(f64, Vec<i32>, f64)> {
        let start = j.now_ns;
        let until = start + (secs * 1e9) as u64;
        let mut next = start + 1_000 * MS;
        let mut seen: Vec<(f64, Vec<i32>, f64)> = vec![];
        let mut was_open = false;
        while j.now_ns < until {
            j.step(base_ms, &extra);
            if j.now_ns >= next {
                let f = j.findings();
                if !f.is_empty() && !was_open {
                    let t = (j.now_ns - start) as f64 / 1e9;
                    let share = f[0].evidence["share_of_time"].as_f64().unwrap_or(0.0);
                    seen.push((t, f[0].ranks.clone(), share));
                }
                was_open = !f.is_empty();
                next += 1_000 * MS;
            }
        }
        seen
    }

    #[test]
    fn a_straggler_just_over_the_threshold_is_named_within_seconds_of_its_onset() {
        // 33 ms late on 500 ms steps: the others wait 6.2 % of the time. Judged on its 5 s
        // average alone it was named 10.1 s after its onset; its share since it was last calm
        // names it once that average is past half the threshold (4.3 s).
        let mut j = Job::new(16, 8);
        j.run(20.0, 500.0, |_| 0.0);
        let seen = opened(&mut j, 20.0, 500.0, |r| if r == 5 { 33.0 } else { 0.0 });
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!(seen[0].1, vec![5]);
        assert!(seen[0].0 <= 5.0, "named {:.1} s after onset", seen[0].0);
        // It quotes the rate it was named on, not its 5 s average still on its way up.
        assert!((0.055..0.07).contains(&seen[0].2), "{seen:?}");
    }

    #[test]
    fn a_straggler_under_the_threshold_late_once_a_long_step_never_opens() {
        // 75 ms late once per 2.5 s step: 2.9 % of the time. Right after each late instance
        // its 2 s average is past 5 %, and its share since it was last calm can be too; it
        // must never open (nor open and resolve again and again).
        for extra in [60.0, 75.0] {
            let mut j = Job::new(16, 8);
            j.run(20.0, 2_500.0, |_| 0.0);
            let seen = opened(&mut j, 60.0, 2_500.0, |r| if r == 5 { extra } else { 0.0 });
            assert!(seen.is_empty(), "{extra} ms: {seen:?}");
        }
    }

    fn ranks(f: &[Finding]) -> Vec<Vec<i32>> {
        f.iter().map(|f| f.ranks.clone()).collect()
    }

    /// A little deterministic noise per (rank, step): ±`ms`.
    fn jitter(r: i32, k: u64, ms: f64) -> f64 {
        let mut x = (r as u64) << 32 ^ k;
        x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^= x >> 29;
        x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x ^= x >> 32;
        let x = x % 1000;
        (x as f64 / 500.0 - 1.0) * ms
    }

    #[test]
    fn a_healthy_job_is_no_finding() {
        let mut j = Job::new(16, 8);
        let k = std::cell::Cell::new(0u64);
        let f = j.run(20.0, 50.0, |r| {
            k.set(k.get() + 1);
            jitter(r, k.get(), 2.0).abs()
        });
        assert!(f.is_empty(), "{f:#?}");
    }

    #[test]
    fn a_straggler_sampled_one_in_eight_is_named() {
        let mut j = Job::sampled(32, 8, 8);
        let k = std::cell::Cell::new(0u64);
        let noise = |r: i32| {
            k.set(k.get() + 1);
            jitter(r, k.get(), 1.6).abs()
        };
        j.run(10.0, 20.0, noise);
        let seen = opened(&mut j, 20.0, 20.0, |r| {
            noise(r) + if r == 13 { 4.0 } else { 0.0 }
        });
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!(seen[0].1, vec![13]);
        assert!(seen[0].0 <= 8.0, "named {:.1} s after onset", seen[0].0);
    }

    #[test]
    fn a_rank_that_computes_longer_is_named() {
        let mut j = Job::new(16, 8);
        let f = j.run(10.0, 50.0, |r| if r == 5 { 25.0 } else { 0.0 });
        assert_eq!(ranks(&f), vec![vec![5]]);
        assert_eq!(f[0].nodes, vec!["n0".to_owned()]);
        assert!(
            f[0].summary.starts_with("rank 5 on n0 arrives last"),
            "{}",
            f[0].summary
        );
    }

    #[test]
    fn a_single_hiccup_is_not_a_slow_rank() {
        let mut j = Job::new(16, 8);
        j.steps(40, 50.0, |_| 0.0);
        j.step(50.0, |r| if r == 3 { 2_000.0 } else { 0.0 });
        let f = j.run(10.0, 50.0, |_| 0.0);
        assert!(f.is_empty(), "{f:#?}");
    }

    #[test]
    fn a_noisy_job_is_no_finding() {
        // Every rank's compute varies by up to 20 % from step to step: whoever is last changes
        // every step, and nobody stands out against the rest.
        let mut j = Job::new(16, 8);
        let k = std::cell::Cell::new(0u64);
        let f = j.run(30.0, 50.0, |r| {
            k.set(k.get() + 1);
            jitter(r, k.get(), 10.0).abs()
        });
        assert!(f.is_empty(), "{f:#?}");
    }

    #[test]
    fn ranks_that_take_turns_being_last_are_no_finding() {
        // Each step one of four ranks, drawn anew, is 30 ms late: each makes the others wait
        // about 9 % of the time, but none more than the rest.
        let mut j = Job::new(4, 4);
        let k = std::cell::Cell::new(0u64);
        let f = j.run(30.0, 50.0, |r| {
            k.set(k.get() + 1);
            let step = (k.get() - 1) / 4;
            let last = (jitter(0, step, 500.0) + 500.0) as i32 % 4;
            if r == last { 30.0 } else { 0.0 }
        });
        assert!(f.is_empty(), "{f:#?}");
    }

    #[test]
    fn a_mild_skew_shared_by_all_is_no_finding() {
        // Every rank a little slower than some others, persistently: nobody dominates.
        let mut j = Job::new(16, 8);
        let f = j.run(20.0, 50.0, |r| (r % 4) as f64 * 0.5);
        assert!(f.is_empty(), "{f:#?}");
    }

    #[test]
    fn an_intermittent_straggler_below_the_threshold_is_no_finding() {
        // Late by 1 ms once in ten steps of 50 ms: 0.2 % of the time.
        let mut j = Job::new(16, 8);
        let k = std::cell::Cell::new(0u64);
        let f = j.run(20.0, 50.0, |r| {
            k.set(k.get() + 1);
            if r == 9 && (k.get() / 16).is_multiple_of(10) {
                1.0
            } else {
                0.0
            }
        });
        assert!(f.is_empty(), "{f:#?}");
    }

    #[test]
    fn a_slow_node_in_a_two_node_job_is_one_finding_for_the_node() {
        let mut j = Job::new(16, 8);
        let f = j.run(10.0, 50.0, |r| if r >= 8 { 20.0 } else { 0.0 });
        assert_eq!(ranks(&f), vec![(8..16).collect::<Vec<_>>()]);
        assert!(f[0].summary.starts_with("n1 (ranks 8,"), "{}", f[0].summary);
    }

    #[test]
    fn half_a_node_names_only_the_slow_ranks() {
        let mut j = Job::new(32, 8);
        let f = j.run(
            10.0,
            50.0,
            |r| if (8..12).contains(&r) { 20.0 } else { 0.0 },
        );
        assert_eq!(ranks(&f), vec![vec![8, 9, 10, 11]]);
    }

    #[test]
    fn a_job_on_one_node_names_ranks_not_the_node() {
        let mut j = Job::new(8, 8);
        let f = j.run(10.0, 50.0, |r| if r == 2 || r == 6 { 20.0 } else { 0.0 });
        let mut named: Vec<i32> = f.iter().flat_map(|f| f.ranks.clone()).collect();
        named.sort_unstable();
        assert_eq!(named, vec![2, 6], "{f:#?}");
        assert!(f.iter().all(|f| f.ranks.len() == 1), "{f:#?}");
    }

    #[test]
    fn it_resolves_within_ten_seconds_after_it_stops() {
        // Very slow (a share far above the threshold, the slowest to decay): still resolved
        // within 10 s of it ending.
        let mut j = Job::new(16, 8);
        let f = j.run(10.0, 20.0, |r| if r == 4 { 80.0 } else { 0.0 });
        assert_eq!(ranks(&f), vec![vec![4]]);
        let after = seconds_to_resolve(&mut j, 20.0, 20.0, |_| 0.0).expect("resolved");
        assert!(after <= 10.0, "resolved {after:.1} s after it stopped");
        // And it stays resolved.
        let f = j.run(10.0, 20.0, |_| 0.0);
        assert!(f.is_empty(), "{f:#?}");
    }

    /// Steps until no finding is open, evaluating once a second; seconds it took (`None`:
    /// still open after `limit_s`).
    fn seconds_to_resolve(
        j: &mut Job,
        limit_s: f64,
        base_ms: f64,
        extra: impl Fn(i32) -> f64,
    ) -> Option<f64> {
        let from = j.now_ns;
        let mut next = j.now_ns + 1_000 * MS;
        while j.now_ns < from + (limit_s * 1e9) as u64 {
            j.step(base_ms, &extra);
            if j.now_ns >= next {
                next += 1_000 * MS;
                if j.findings().is_empty() {
                    return Some((j.now_ns - from) as f64 / 1e9);
                }
            }
        }
        None
    }

    #[test]
    fn it_resolves_within_ten_seconds_in_a_noisy_job() {
        // Eight ranks sharing two cores: every rank is a little late now and then (by more
        // than the per-instance threshold), so "never late again" never comes. Rank 5 computes
        // 4x as long for 10 s, then like the others.
        let mut j = Job::new(8, 8);
        let k = std::cell::Cell::new(0u64);
        let noise = |r: i32| {
            k.set(k.get() + 1);
            jitter(r, k.get(), 1.5).abs()
        };
        let f = j.run(10.0, 3.0, |r| noise(r) + if r == 5 { 9.0 } else { 0.0 });
        assert_eq!(ranks(&f), vec![vec![5]]);
        let after = seconds_to_resolve(&mut j, 30.0, 3.0, noise).expect("resolved within 30 s");
        assert!(after <= 10.0, "resolved {after:.1} s after it stopped");
        // It stays resolved under the same noise, and comes back when the rank is slow again.
        let f = j.run(20.0, 3.0, noise);
        assert!(f.is_empty(), "{f:#?}");
        let f = j.run(6.0, 3.0, |r| noise(r) + if r == 5 { 9.0 } else { 0.0 });
        assert_eq!(ranks(&f), vec![vec![5]]);
    }

    #[test]
    fn its_summary_keeps_the_share_at_its_peak() {
        let mut j = Job::new(16, 8);
        j.run(10.0, 50.0, |r| if r == 5 { 50.0 } else { 0.0 });
        let peak = j.findings()[0].evidence["share_of_time"]
            .as_f64()
            .expect("share");
        // It recovers: the share decays, the summary's figure does not.
        for _ in 0..8 {
            j.step(50.0, |_| 0.0);
        }
        let f = j.findings();
        assert_eq!(ranks(&f), vec![vec![5]]);
        let now = f[0].evidence["share_now"].as_f64().expect("share now");
        assert!(now < peak, "now {now} peak {peak}");
        assert_eq!(f[0].evidence["share_of_time"].as_f64(), Some(peak));
        let pct = format!("{:.0} %", peak * 100.0);
        assert!(f[0].summary.contains(&pct), "{} lacks {pct}", f[0].summary);
        // Late at every step while it lasted: persistent, though on time lately.
        assert!(f[0].summary.contains("persistently"), "{}", f[0].summary);
    }

    #[test]
    fn a_victim_that_waits_elsewhere_is_not_blamed() {
        // Rank 1 arrives late at the world all-reduce because it waited inside another call
        // (a pipeline receive): time inside calls is not its own compute.
        let mut j = Job::new(8, 8);
        let mut last = vec![];
        for k in 0..300 {
            let n = 8;
            let start = j.now_ns;
            let mut members = Vec::new();
            for r in 0..n {
                let wait_elsewhere = if r == 1 { 20 * MS } else { 0 };
                if r == 1 {
                    // The receive: 1 ms compute, then 20 ms inside a call on another comm.
                    j.det.call(&CallTimes {
                        rank: 1,
                        comm: 0x200,
                        start_ns: start + MS,
                        end_ns: start + MS + wait_elsewhere,
                        blocking: true,
                        sampled: false,
                        agent_compute_ns: None,
                    });
                }
                members.push((r, start + 50 * MS + wait_elsewhere));
            }
            let end = start + 71 * MS;
            let members: Vec<Member> = members
                .into_iter()
                .map(|(r, arrive)| {
                    j.det.call(&CallTimes {
                        rank: r,
                        comm: WORLD,
                        start_ns: arrive,
                        end_ns: end,
                        blocking: true,
                        sampled: false,
                        agent_compute_ns: None,
                    })
                })
                .collect();
            j.now_ns = end;
            j.det.judge(WORLD, &members, 1, end as f64 / 1e9, &j.tuning);
            if k % 14 == 13 {
                last = j.findings();
                assert!(last.is_empty(), "step {k}: {last:#?}");
            }
        }
        assert!(last.is_empty());
    }
}
