//! The transport probes' test doubles (`tests/doubles/transport/`): a stand-in libibverbs
//! exporting the control path at libibverbs' symbol versions (with IBVERBS_1.0 compatibility
//! copies beside the current ones), a stand-in of NCCL's network layer under NCCL's mangled
//! names, and a driver that calls them the way NCCL does.

use std::path::PathBuf;
use std::sync::Mutex;

use crate::bin_dir;
use crate::nccl::{cc, newer};

static BUILD: Mutex<()> = Mutex::new(());

/// The built stand-ins and driver.
#[derive(Debug)]
pub struct StandIns {
    pub verbs: PathBuf,
    pub ncclnet: PathBuf,
    pub driver: PathBuf,
}

/// Builds them once (they are rebuilt when their sources change).
pub fn stand_ins() -> StandIns {
    let _g = BUILD.lock().unwrap_or_else(|p| p.into_inner());
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("doubles/transport");
    let dir = bin_dir().join("transport-doubles");
    std::fs::create_dir_all(&dir).expect("create transport-doubles dir");
    let s = StandIns {
        verbs: dir.join("libcommscope_verbs_standin.so"),
        ncclnet: dir.join("libcommscope_ncclnet_standin.so"),
        driver: dir.join("transport_driver"),
    };
    let (verbs_c, map) = (src.join("verbs_standin.c"), src.join("verbs_standin.map"));
    if newer(&[&verbs_c, &map], &s.verbs) {
        let script = format!("-Wl,--version-script={}", map.display());
        cc(&["-shared", "-fPIC", &script], &verbs_c, &s.verbs, &[]);
    }
    let net_c = src.join("ncclnet_standin.c");
    if newer(&[&net_c], &s.ncclnet) {
        cc(&["-shared", "-fPIC"], &net_c, &s.ncclnet, &["-ldl"]);
    }
    let driver_c = src.join("transport_driver.c");
    if newer(&[&driver_c], &s.driver) {
        cc(&[], &driver_c, &s.driver, &["-ldl", "-lpthread"]);
    }
    s
}
