//! The live state split by job: each shard is a [`State`] behind its own lock, and a job lives
//! in the shard [`commscope_wire::route::shard_of`] names. Batches of different jobs apply in
//! parallel, and the findings engine evaluates the shards on threads of their own, so jobs use
//! separate cores; whatever needs every job (the job list, `/metrics`) visits the shards one
//! after the other, holding one lock at a time.

use std::sync::{Mutex, MutexGuard};

use crate::state::{Limits, State};

/// The shards.
#[derive(Debug)]
pub struct Shards {
    shards: Vec<Mutex<State>>,
}

impl Shards {
    /// `n` shards (at least one) sharing `limits`: each keeps at most its part of
    /// `limits.max_jobs` (rounded up).
    pub fn new(limits: Limits, n: usize) -> Shards {
        let n = n.max(1);
        let mut per = limits.clone();
        per.max_jobs = limits.max_jobs.div_ceil(n).max(1);
        Shards {
            shards: (0..n)
                .map(|_| Mutex::new(State::new(per.clone())))
                .collect(),
        }
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
    fn par_map_visits_every_shard_once_in_order() {
        let s = Shards::new(Limits::default(), 3);
        let got = s.par_map(|i, st| (i, st.jobs.len()));
        assert_eq!(got, vec![(0, 0), (1, 0), (2, 0)]);
    }
}
