//! Where a job's records go: to which collector replica (rendezvous hashing over the replica
//! list) and, inside a collector, to which shard of its live state and store.
//!
//! Both are functions of the job id alone, so every agent of a job picks the same replica
//! without talking to the others, and all of a job's records meet in one shard.
//!
//! Rendezvous (highest random weight) hashing: each replica scores `H(ROUTE, job, replica)`
//! and the highest score wins. Adding or removing a replica moves only the jobs that win or
//! lose it (about 1/n of them); the list's order does not matter, its entries' spelling does
//! (every agent must be given the same names: with a StatefulSet, the pods' stable DNS names).

use crate::hash::{Hasher, fnv1a64};

/// Domain tag of the routing hash ("ROUTE").
const ROUTE: u64 = 0x52_4f_55_54_45;

/// The replica (an index into `replicas`) that owns `job`; `None` when the list is empty.
pub fn replica_of<S: AsRef<str>>(job: &str, replicas: &[S]) -> Option<usize> {
    let j = fnv1a64(job.as_bytes());
    replicas
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let score = Hasher::new().word(ROUTE).word(j).str(r.as_ref()).finish();
            // Ties (equal names) go to the first.
            (score, std::cmp::Reverse(i))
        })
        .max()
        .map(|(_, std::cmp::Reverse(i))| i)
}

/// The shard (of `shards`, at least 1) that holds `job` inside one collector.
pub fn shard_of(job: &str, shards: usize) -> usize {
    let h = Hasher::new().word(ROUTE).str(job).finish();
    (h % shards.max(1) as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jobs(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("job-{i}")).collect()
    }

    #[test]
    fn every_replica_gets_a_fair_share() {
        let replicas = ["http://c0:4650", "http://c1:4650", "http://c2:4650"];
        let mut count = [0usize; 3];
        for j in jobs(3000) {
            count[replica_of(&j, &replicas).expect("non-empty")] += 1;
        }
        for c in count {
            assert!((850..=1150).contains(&c), "shares {count:?}");
        }
    }

    #[test]
    fn the_order_of_the_list_does_not_matter() {
        let a = ["http://c0:4650", "http://c1:4650", "http://c2:4650"];
        let b = ["http://c2:4650", "http://c0:4650", "http://c1:4650"];
        for j in jobs(500) {
            let ra = a[replica_of(&j, &a).expect("non-empty")];
            let rb = b[replica_of(&j, &b).expect("non-empty")];
            assert_eq!(ra, rb, "{j}");
        }
    }

    #[test]
    fn adding_a_replica_moves_only_the_jobs_it_wins() {
        let before = ["http://c0:4650", "http://c1:4650"];
        let after = ["http://c0:4650", "http://c1:4650", "http://c2:4650"];
        let mut moved = 0;
        for j in jobs(3000) {
            let b = before[replica_of(&j, &before).expect("non-empty")];
            let a = after[replica_of(&j, &after).expect("non-empty")];
            if a != b {
                assert_eq!(a, "http://c2:4650", "{j} moved between old replicas");
                moved += 1;
            }
        }
        assert!((850..=1150).contains(&moved), "{moved} of 3000 moved");
    }

    #[test]
    fn an_empty_list_owns_nothing_and_shards_are_in_range() {
        assert_eq!(replica_of::<&str>("j", &[]), None);
        assert_eq!(shard_of("j", 0), 0);
        let mut seen = [false; 4];
        for j in jobs(64) {
            seen[shard_of(&j, 4)] = true;
        }
        assert_eq!(seen, [true; 4]);
    }
}
