//! A `.cst` trace file: parsed whole, damage skipped.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = commscope_wire::cst::parse(std::path::Path::new("fuzz.cst"), data);
});
