//! An ncclras JSON report: read and analyzed.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(procs) = commscope_import::ras::read(data, "fuzz") {
        let _ = commscope_analyzer::analyze("fuzz", &procs, &Default::default());
    }
});
