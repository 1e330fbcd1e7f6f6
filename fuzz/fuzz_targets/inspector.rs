//! An NCCL Inspector log: read and analyzed.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (procs, _) = commscope_import::inspector::read(data, "fuzz");
    let _ = commscope_analyzer::analyze("fuzz", &procs, &Default::default());
});
