//! Any bytes as a shard's chunk checksums (`.sum`), for a `.bin` of any
//! size (the first 8 bytes, little-endian; the file is the rest): a typed
//! error or checksums whose ranges stay inside the `.bin`, never a panic,
//! an overflow or an allocation sized by the header's counts.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((head, file)) = data.split_first_chunk::<8>() else {
        return;
    };
    let bin_bytes = u64::from_le_bytes(*head);
    let path = std::path::Path::new("fuzz.sum");
    if let Ok(sums) = prep::format::ChunkSums::parse(path, file, bin_bytes) {
        let range = sums.covering(bin_bytes / 3..bin_bytes / 2 + 1);
        assert!(range.start <= range.end && range.end <= bin_bytes);
        let _ = sums.verify(range.start, file);
    }
});
