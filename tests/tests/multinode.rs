//! `commscope run` reaches ranks on other nodes: two "nodes" (network namespaces with their own
//! host names), Open MPI and MPICH's Hydra launching through an rsh agent; every rank is preloaded
//! and records the same job id, under its own node's name.

use std::collections::BTreeMap;

use commscope_tests::{Flavour, Nodes, assert_ok, build, commscope, load_job};
use commscope_wire::record::Record;

#[test]
fn ranks_on_other_nodes_get_the_shim_and_the_identity() {
    // One set of nodes for both launchers, one after the other.
    let nodes = Nodes::new(2);
    two_nodes(
        &nodes,
        Flavour::OpenMpi,
        "mpirun.openmpi",
        nodes.openmpi_args(2),
    );
    two_nodes(&nodes, Flavour::Mpich, "mpiexec.mpich", nodes.hydra_args(2));
}

fn two_nodes(nodes: &Nodes, flavour: Flavour, launcher: &str, launcher_args: Vec<String>) {
    let prog = build(flavour, "basic");
    let tmp = tempfile::tempdir().expect("tempdir");
    let job_id = format!("two-nodes-{}", flavour.name());
    let mut cmd = commscope();
    cmd.arg("run")
        .arg("--trace-dir")
        .arg(tmp.path())
        .arg("--job-id")
        .arg(&job_id)
        .arg("--")
        .arg(launcher);
    cmd.args(launcher_args)
        .arg("-np")
        .arg("4")
        .arg(&prog)
        .arg("30");
    let out = cmd.output().expect("run");
    assert_ok(&out, &format!("{} two-node job", flavour.name()));
    let job = load_job(&tmp.path().join(&job_id));
    assert_eq!(job.processes.len(), 4);
    let mut by_node: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for p in &job.processes {
        assert_eq!(p.header.job, job_id);
        by_node
            .entry(p.header.node.clone())
            .or_default()
            .push(p.header.rank);
        let calls = p
            .records
            .iter()
            .filter(|r| matches!(r, Record::Call(_)))
            .count();
        assert_eq!(calls, 30, "rank {} on {}", p.header.rank, p.header.node);
    }
    let expected: BTreeMap<String, Vec<i32>> = [
        (nodes.names[0].clone(), vec![0, 1]),
        (nodes.names[1].clone(), vec![2, 3]),
    ]
    .into_iter()
    .collect();
    assert_eq!(
        by_node,
        expected,
        "{}: two ranks on each node, by host name",
        flavour.name()
    );
}
