//! A Kineto trace: read and analyzed.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((p, _)) = commscope_import::kineto::read(data, "fuzz") {
        let _ = commscope_analyzer::analyze("fuzz", &[p], &Default::default());
    }
});
