//! The rank heatmap: one cell per rank while they fit, else one per node (its worst rank), else
//! consecutive nodes folded together — thousands of ranks always fit the pane.

use std::collections::{BTreeMap, HashMap};

use commscope_wire::grpc::JobDetail;

use crate::app::Heat;

/// One cell: the ranks it stands for, its value in [0, 1] and the rank Enter opens (the worst).
#[derive(Clone, Debug, PartialEq)]
pub struct Cell {
    pub label: String,
    pub ranks: Vec<i32>,
    pub value: f64,
    pub worst: i32,
}

/// Per rank, the metric in [0, 1] (and its raw figure, for the status line).
pub fn values(d: &JobDetail, heat: Heat) -> BTreeMap<i32, (f64, f64)> {
    let mut v: BTreeMap<i32, (f64, f64)> = d.ranks.iter().map(|r| (r.rank, (0.0, 0.0))).collect();
    match heat {
        Heat::Share => {
            for h in &d.health {
                // A fifth of wall time waiting for one rank is as hot as it gets.
                v.insert(h.rank, ((h.share / 0.2).min(1.0), h.share));
            }
        }
        Heat::Lateness => {
            for h in &d.health {
                v.insert(h.rank, (h.late_ratio.min(1.0), h.late_ratio));
            }
        }
        Heat::InFlightAge => {
            for c in &d.in_flight {
                let age = c.age_ns as f64 / 1e9;
                let e = v.entry(c.rank).or_insert((0.0, 0.0));
                if age > e.1 {
                    // Ten seconds in flight is as hot as it gets.
                    *e = ((age / 10.0).min(1.0), age);
                }
            }
        }
    }
    v
}

/// The cells for a pane of `capacity` cells.
pub fn cells(d: &JobDetail, heat: Heat, capacity: usize) -> (Vec<Cell>, &'static str) {
    let vals = values(d, heat);
    if vals.len() <= capacity.max(1) {
        let cells = vals
            .iter()
            .map(|(r, (v, _))| Cell {
                label: format!("rank {r}"),
                ranks: vec![*r],
                value: *v,
                worst: *r,
            })
            .collect();
        return (cells, "a cell is a rank");
    }
    let node_of: HashMap<i32, &str> = d.ranks.iter().map(|r| (r.rank, r.node.as_str())).collect();
    let mut by_node: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for r in vals.keys() {
        by_node
            .entry(node_of.get(r).copied().unwrap_or("?"))
            .or_default()
            .push(*r);
    }
    // Nodes in the order of their first rank.
    let mut nodes: Vec<(&str, Vec<i32>)> = by_node.into_iter().collect();
    nodes.sort_by_key(|(_, rs)| rs.first().copied().unwrap_or(i32::MAX));
    let per = nodes.len().div_ceil(capacity.max(1));
    let note = if per <= 1 {
        "a cell is a node (its worst rank)"
    } else {
        "a cell is several nodes (their worst rank)"
    };
    let cells = nodes
        .chunks(per.max(1))
        .map(|group| {
            let ranks: Vec<i32> = group
                .iter()
                .flat_map(|(_, rs)| rs.iter().copied())
                .collect();
            let (worst, value) = ranks
                .iter()
                .map(|r| (*r, vals.get(r).map_or(0.0, |v| v.0)))
                .fold((ranks[0], -1.0), |a, b| if b.1 > a.1 { b } else { a });
            let label = if group.len() == 1 {
                group[0].0.to_owned()
            } else {
                format!("{} … {}", group[0].0, group[group.len() - 1].0)
            };
            Cell {
                label,
                ranks,
                value: value.max(0.0),
                worst,
            }
        })
        .collect();
    (cells, note)
}

#[cfg(test)]
mod tests {
    use super::*;
    use commscope_wire::grpc::{RankHealth, RankState};

    fn detail(ranks: i32, per_node: i32) -> JobDetail {
        JobDetail {
            ranks: (0..ranks)
                .map(|r| RankState {
                    rank: r,
                    node: format!("node-{:04}", r / per_node),
                    ..Default::default()
                })
                .collect(),
            health: vec![RankHealth {
                rank: ranks - 3,
                share: 0.1,
                late_ratio: 0.9,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn ranks_fit_then_nodes_then_groups_of_nodes_and_the_worst_rank_is_kept() {
        let d = detail(64, 8);
        let (c, note) = cells(&d, Heat::Share, 100);
        assert_eq!(c.len(), 64);
        assert_eq!(note, "a cell is a rank");
        assert_eq!(c[61].value, 0.5);

        let d = detail(4096, 8);
        let (c, note) = cells(&d, Heat::Share, 1000);
        assert_eq!(c.len(), 512, "{note}");
        let hot: Vec<&Cell> = c.iter().filter(|c| c.value > 0.0).collect();
        assert_eq!(hot.len(), 1);
        assert_eq!(hot[0].worst, 4093);
        assert_eq!(hot[0].label, "node-0511");

        let (c, note) = cells(&d, Heat::Lateness, 100);
        assert!(c.len() <= 100, "{}", c.len());
        assert_eq!(note, "a cell is several nodes (their worst rank)");
        assert_eq!(c.iter().map(|c| c.ranks.len()).sum::<usize>(), 4096);
        assert_eq!(c.last().map(|c| c.value), Some(0.9));
    }
}
