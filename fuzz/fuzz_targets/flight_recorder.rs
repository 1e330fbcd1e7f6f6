//! A Flight Recorder dump: read, turned into records, replayed and analyzed.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = commscope_import::flight_recorder::read(data, 3) {
        let procs = commscope_import::flight_recorder::to_traces("fuzz", &[d]);
        let _ = commscope_analyzer::analyze("fuzz", &procs, &Default::default());
    }
});
