//! Any bytes as a packed shard's segment index: a typed error or a header,
//! never a panic, an out-of-bounds read or an allocation sized by the
//! file's counts.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = prep::format::check_segments(std::path::Path::new("fuzz.seg"), data);
});
