//! The live state split by job: each shard is a [`State`] behind its own lock, and a job lives
//! in the shard [`commscope_wire::route::shard_of`] names. Batches of different jobs apply in
//! parallel, and the findings engine evaluates the shards on threads of their own, so jobs use
//! separate cores; whatever needs every job (the job list, `/metrics`) visits the shards one
//! after the other, holding one lock at a time.
//!
//! Ingest changes a shard on that shard's applier thread ([`Shards::apply`]), never on the async
//! runtime: an evaluation holds its shard for a while (a few hundred milliseconds at 65,536
//! ranks), and the runtime's workers must go on reading streams, storing batches and answering
//! meanwhile. The applier takes what queued up while it waited under one lock.

use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::state::{Limits, State};

/// Work on one shard's state, run on its applier thread.
type Work = Box<dyn FnOnce(&mut State) + Send>;

/// Pieces of work an applier runs under one lock at most (then lets an evaluation in).
const APPLY_RUN: usize = 256;

/// The shards.
#[derive(Debug)]
pub struct Shards {
    shards: Vec<Arc<Mutex<State>>>,
    appliers: Vec<mpsc::Sender<Work>>,
}

/// The applier work of a shard went away: its thread ended (a panic while applying, logged).
#[derive(Debug, thiserror::Error)]
#[error("the live state's applier thread of this job's shard is gone (see the log)")]
pub struct ApplierGone;

/// One shard's applier: runs the work sent to it, each queue-full under one lock. A panic in a
/// piece of work is logged and ends only that piece.
fn applier(shard: Arc<Mutex<State>>, rx: mpsc::Receiver<Work>) {
    while let Ok(first) = rx.recv() {
        let mut st = shard.lock().unwrap_or_else(|p| p.into_inner());
        let mut next = Some(first);
        let mut ran = 0;
        while let Some(w) = next.take() {
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w(&mut st))).is_err() {
                tracing::error!(
                    "applying to the live state failed (a bug: the records stay stored)"
                );
            }
            ran += 1;
            if ran < APPLY_RUN {
                next = rx.try_recv().ok();
            }
        }
    }
}

impl Shards {
    /// `n` shards (at least one) sharing `limits`: each keeps at most its part of
    /// `limits.max_jobs` (rounded up).
    pub fn new(limits: Limits, n: usize) -> Shards {
        let n = n.max(1);
        let mut per = limits.clone();
        per.max_jobs = limits.max_jobs.div_ceil(n).max(1);
        let shards: Vec<Arc<Mutex<State>>> = (0..n)
            .map(|_| Arc::new(Mutex::new(State::new(per.clone()))))
            .collect();
        let appliers = shards
            .iter()
            .enumerate()
            .map(|(i, shard)| {
                let (tx, rx) = mpsc::channel::<Work>();
                let shard = shard.clone();
                // The thread ends with the last sender, when the shards are dropped.
                if let Err(e) = std::thread::Builder::new()
                    .name(format!("state-apply-{i}"))
                    .spawn(move || applier(shard, rx))
                {
                    tracing::error!("cannot start the live state's applier thread {i}: {e}");
                }
                tx
            })
            .collect();
        Shards { shards, appliers }
    }

    /// Runs `f` on `job`'s shard on that shard's applier thread, in the order asked, and
    /// resolves with its result; the caller's thread never waits for the shard's lock.
    pub async fn apply<T: Send + 'static>(
        &self,
        job: &str,
        f: impl FnOnce(&mut State) -> T + Send + 'static,
    ) -> Result<T, ApplierGone> {
        self.dispatch(job, f).await
    }

    /// Hands `f` to `job`'s applier now, behind whatever was handed to it before, and returns
    /// its result's future: a caller that hands on one piece after another without awaiting
    /// each keeps them in order and pays for one round trip, not one per piece.
    pub fn dispatch<T: Send + 'static, F: FnOnce(&mut State) -> T + Send + 'static>(
        &self,
        job: &str,
        f: F,
    ) -> impl Future<Output = Result<T, ApplierGone>> + Send + use<T, F> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let work: Work = Box::new(move |st| {
            let _ = tx.send(f(st));
        });
        // A send that fails drops the work and its sender: the receiver then says so.
        let _ = self.appliers[self.index(job)].send(work);
        async move { rx.await.map_err(|_| ApplierGone) }
    }

    /// How many shards.
    pub fn len(&self) -> usize {
        self.shards.len()
    }

    /// Never: there is at least one shard.
    pub fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }

    /// The index of `job`'s shard.
    pub fn index(&self, job: &str) -> usize {
        commscope_wire::route::shard_of(job, self.shards.len())
    }

    /// `job`'s shard, locked.
    pub fn of(&self, job: &str) -> MutexGuard<'_, State> {
        self.at(self.index(job))
    }

    /// Shard `i`, locked.
    pub fn at(&self, i: usize) -> MutexGuard<'_, State> {
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every shard, each locked while the caller holds it (one at a time when the caller drops
    /// each before taking the next, as a `for` loop does).
    pub fn iter(&self) -> impl Iterator<Item = MutexGuard<'_, State>> {
        (0..self.shards.len()).map(|i| self.at(i))
    }

    /// Names of every job held now.
    pub fn job_names(&self) -> Vec<String> {
        self.iter()
            .flat_map(|s| s.jobs.keys().cloned().collect::<Vec<_>>())
            .collect()
    }

    /// Runs `f` on every shard, each on a thread of its own, and returns the results in shard
    /// order (one shard: on the caller's thread).
    pub fn par_map<T: Send>(&self, f: impl Fn(usize, &mut State) -> T + Sync) -> Vec<T> {
        if self.shards.len() == 1 {
            return vec![f(0, &mut self.at(0))];
        }
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..self.shards.len())
                .map(|i| {
                    let f = &f;
                    scope.spawn(move || f(i, &mut self.at(i)))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| match h.join() {
                    Ok(v) => v,
                    Err(p) => std::panic::resume_unwind(p),
                })
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_spread_over_the_shards_and_the_job_limit_is_split() {
        let limits = Limits {
            max_jobs: 10,
            ..Default::default()
        };
        let s = Shards::new(limits, 4);
        assert_eq!(s.len(), 4);
        for i in 0..4 {
            assert_eq!(s.at(i).limits.max_jobs, 3);
        }
        let mut used = [false; 4];
        for j in 0..64 {
            used[s.index(&format!("job-{j}"))] = true;
        }
        assert_eq!(used, [true; 4]);
        assert_eq!(s.index("job-7"), s.index("job-7"));
    }

    #[test]
    fn applying_waits_for_the_shard_on_its_applier_never_on_the_callers_thread() {
        let s = Shards::new(Limits::default(), 2);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let job = "job-1";
        // An evaluation holds the job's shard: the caller's single thread stays free (the
        // timeout below could not fire on it otherwise) and the work waits.
        let held = s.of(job);
        let order = std::sync::Arc::new(Mutex::new(Vec::new()));
        let pending = rt.block_on(async {
            let o = order.clone();
            let first = s.apply(job, move |st| {
                o.lock().expect("order").push(1);
                st.jobs.len()
            });
            tokio::time::timeout(std::time::Duration::from_millis(200), first).await
        });
        assert!(pending.is_err(), "applied while the shard was held");
        drop(held);
        let got = rt.block_on(async {
            let (a, b) = (order.clone(), order.clone());
            let x = s.apply(job, move |_| a.lock().expect("order").push(2));
            let y = s.apply(job, move |_| b.lock().expect("order").push(3));
            let (x, y) = tokio::join!(x, y);
            x.and(y)
        });
        assert!(got.is_ok());
        // The abandoned first piece still ran, before the later ones: in the order asked.
        assert_eq!(*order.lock().expect("order"), vec![1, 2, 3]);
    }

    #[test]
    fn pieces_handed_on_without_waiting_run_in_the_order_handed() {
        let s = Shards::new(Limits::default(), 2);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let order = std::sync::Arc::new(Mutex::new(Vec::new()));
        // Handed on while the shard is held: none runs until it is let go, then all in order.
        let held = s.of("j");
        let pending: Vec<_> = (0..1000)
            .map(|i| {
                let o = order.clone();
                s.dispatch("j", move |_| {
                    o.lock().expect("order").push(i);
                    i
                })
            })
            .collect();
        assert!(order.lock().expect("order").is_empty());
        drop(held);
        let results: Vec<_> = rt.block_on(async {
            let mut out = Vec::new();
            for p in pending {
                out.push(p.await.expect("applied"));
            }
            out
        });
        let want: Vec<i32> = (0..1000).collect();
        assert_eq!(results, want);
        assert_eq!(*order.lock().expect("order"), want);
    }

    #[test]
    fn a_panic_while_applying_ends_only_that_piece() {
        let s = Shards::new(Limits::default(), 1);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let (bad, good) = rt.block_on(async {
            let bad = s.apply("j", |_| -> u32 { panic!("a bug") }).await;
            let good = s.apply("j", |st| st.jobs.len()).await;
            (bad, good)
        });
        assert!(bad.is_err());
        assert_eq!(good.ok(), Some(0));
    }

    #[test]
    fn par_map_visits_every_shard_once_in_order() {
        let s = Shards::new(Limits::default(), 3);
        let got = s.par_map(|i, st| (i, st.jobs.len()));
        assert_eq!(got, vec![(0, 0), (1, 0), (2, 0)]);
    }
}
