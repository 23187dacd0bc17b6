//! The on-disk format through the library: write then read gives back every
//! token, shards are cut as specified, 64-bit offsets work past 4 GiB, and a
//! damaged index is refused, never read out of bounds.

use crate::common::{manifest, write_dataset, write_sparse_u16};
use prep::format::{
    atomic_write, ChunkProblem, Dtype, Files, FormatError, ReadError, CHUNK_BYTES, MANIFEST_FILE,
};
use prep::Dataset;
use proptest::prelude::*;

fn records_strategy() -> impl Strategy<Value = (bool, Vec<Vec<u32>>)> {
    any::<bool>().prop_flat_map(|wide| {
        let max = if wide { u32::MAX } else { u32::from(u16::MAX) };
        // Lengths 0 and 1 are common on purpose: empty documents are records too.
        let len = prop_oneof![Just(0usize), Just(1usize), 0usize..40, 0usize..400];
        (
            Just(wide),
            prop::collection::vec(
                len.prop_flat_map(move |n| prop::collection::vec(0..=max, n)),
                0..60,
            ),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn write_then_read_gives_back_every_record((wide, records) in records_strategy(), shard_size in 1u64..2048) {
        let dir = tempfile::tempdir().unwrap();
        let dtype = if wide { Dtype::U32 } else { Dtype::U16 };
        let shards = write_dataset(dir.path(), dtype, shard_size, &records);
        let ds = Dataset::open(dir.path()).unwrap();
        prop_assert_eq!(ds.len(), records.len() as u64);
        for (i, r) in records.iter().enumerate() {
            prop_assert_eq!(&ds.record(i as u64).unwrap().to_vec(), r);
        }
        prop_assert!(ds.record(records.len() as u64).is_err());
        // Every shard has chunk checksums that verify its whole .bin.
        let files = Files::new(dir.path()).unwrap();
        for (s, shard) in shards.iter().enumerate() {
            let sums = files.chunk_sums(s, shard).unwrap();
            prop_assert_eq!(sums.chunk_bytes(), CHUNK_BYTES);
            prop_assert_eq!(sums.len(), shard.bin_bytes.div_ceil(CHUNK_BYTES));
            let bin = std::fs::read(dir.path().join(&shard.bin)).unwrap();
            prop_assert_eq!(sums.verify(0, &bin), Ok(()));
        }
        // Cut rule: a shard stays within the size unless it holds one record,
        // and could not have taken the next shard's first record.
        let size = dtype.size() as u64;
        let mut next_record = 0usize;
        for (s, shard) in shards.iter().enumerate() {
            prop_assert!(shard.n_records >= 1);
            prop_assert!(shard.bin_bytes <= shard_size || shard.n_records == 1);
            next_record += shard.n_records as usize;
            if s + 1 < shards.len() {
                let next_bytes = records[next_record].len() as u64 * size;
                prop_assert!(shard.bin_bytes + next_bytes > shard_size);
            }
        }
    }

    #[test]
    fn a_damaged_index_is_refused_or_read_within_bounds(cut in any::<prop::sample::Index>(), flip in any::<prop::sample::Index>(), bit in 0u8..8, truncate in any::<bool>()) {
        let dir = tempfile::tempdir().unwrap();
        let records: Vec<Vec<u32>> = (0..20u32).map(|i| (0..i % 7).collect()).collect();
        let shards = write_dataset(dir.path(), Dtype::U16, 1 << 20, &records);
        let idx = dir.path().join(&shards[0].idx);
        let mut bytes = std::fs::read(&idx).unwrap();
        if truncate {
            bytes.truncate(cut.index(bytes.len()));
        } else {
            let i = flip.index(bytes.len());
            bytes[i] ^= 1 << bit;
        }
        std::fs::write(&idx, &bytes).unwrap();
        // Either a typed error, or a dataset whose every record is in bounds.
        if let Ok(ds) = Dataset::open(dir.path()) {
            let total: u64 = ds.records().map(|r| r.len() as u64).sum();
            prop_assert_eq!(total, ds.n_tokens());
        }
    }
}

/// A shard of several chunks, as the streaming reader will read it: the
/// writer's `.sum` covers the `.bin` in 1 MiB chunks, a record's covering
/// range verifies, and a flipped byte fails naming its chunk.
#[test]
fn chunk_sums_verify_ranges_of_a_shard_of_several_chunks() {
    let dir = tempfile::tempdir().unwrap();
    // 3.5 MiB of uint16 tokens in one shard: chunks 0..3, the last a half.
    let records: Vec<Vec<u32>> = (0..7u32)
        .map(|r| (0..(1u32 << 18)).map(|t| (t * 7 + r) % 65_000).collect())
        .collect();
    let shards = write_dataset(dir.path(), Dtype::U16, u64::MAX, &records);
    assert_eq!(shards.len(), 1);
    let shard = &shards[0];
    assert_eq!(shard.sum.as_deref(), Some("shard-00000.sum"));
    assert_eq!(shard.sum_bytes, Some(32 + 4 * 8));
    let sums = Files::new(dir.path())
        .unwrap()
        .chunk_sums(0, shard)
        .unwrap();
    assert_eq!((sums.len(), sums.bin_bytes()), (4, 7 << 19));
    assert_eq!(sums.chunk(3), Some(3 << 20..7 << 19));

    let mut bin = std::fs::read(dir.path().join(&shard.bin)).unwrap();
    // Record 4's bytes: [4 * 512 KiB, 5 * 512 KiB), inside chunk 2.
    let range = sums.covering(4 << 19..5 << 19);
    assert_eq!(range, 2 << 20..3 << 20);
    let part = |bin: &[u8]| bin[range.start as usize..range.end as usize].to_vec();
    assert_eq!(sums.verify(range.start, &part(&bin)), Ok(()));
    bin[(5 << 19) - 1] ^= 0x40;
    let err = sums.verify(range.start, &part(&bin)).unwrap_err();
    assert_eq!((err.index, err.range.clone()), (2, 2 << 20..3 << 20));
    assert!(matches!(err.problem, ChunkProblem::Checksum { .. }));
    assert!(
        err.to_string().contains("chunk 2 (bytes 2097152..3145728"),
        "{err}"
    );
    // A short read that stops inside the chunk is not verified either.
    bin[(5 << 19) - 1] ^= 0x40;
    let short = &bin[range.start as usize..range.end as usize - 1];
    let err = sums.verify(range.start, short).unwrap_err();
    assert_eq!(err.problem, ChunkProblem::Truncated { got: (1 << 20) - 1 });
    // The whole .bin, in one piece and from a later chunk on.
    assert_eq!(sums.verify(0, &bin), Ok(()));
    assert_eq!(sums.verify(3 << 20, &bin[3 << 20..]), Ok(()));
}

/// A dataset written before `.sum` files lists none: it reads as before,
/// and a reader that needs chunk checksums refuses it naming the manifest
/// and the shard. A `.sum` that is not the one listed is refused too.
#[test]
fn a_shard_without_chunk_sums_is_refused_by_a_reader_that_needs_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut shards = write_dataset(dir.path(), Dtype::U16, 1 << 20, &[vec![1, 2], vec![3]]);
    let files = Files::new(dir.path()).unwrap();
    let mut bad = shards[0].clone();
    bad.sum_bytes = Some(33);
    let err = files.chunk_sums(0, &bad).unwrap_err().to_string();
    assert!(
        err.contains("shard-00000.sum: 40 bytes, the manifest lists 33"),
        "{err}"
    );
    bad.sum_bytes = shards[0].sum_bytes;
    bad.sum_xxh3 = Some("0123456789abcdef".into());
    let err = files.chunk_sums(0, &bad).unwrap_err().to_string();
    assert!(err.contains("the manifest lists 0123456789abcdef"), "{err}");

    std::fs::remove_file(dir.path().join("shard-00000.sum")).unwrap();
    let old = &mut shards[0];
    (old.sum, old.sum_bytes, old.sum_xxh3) = (None, None, None);
    let m = manifest(Dtype::U16, shards.clone());
    assert!(
        !m.to_json().contains("\"sum"),
        "no sum fields are written when there is none"
    );
    atomic_write(&dir.path().join(MANIFEST_FILE), m.to_json().as_bytes()).unwrap();
    let ds = Dataset::open(dir.path()).unwrap();
    assert_eq!(ds.record(1).unwrap().to_vec(), vec![3]);
    let err = files.chunk_sums(0, &shards[0]).unwrap_err();
    assert!(
        matches!(
            err,
            ReadError::Format(FormatError::NoChunkSums { shard: 0, .. })
        ),
        "{err}"
    );
    let message = err.to_string();
    assert!(
        message.contains("manifest.json: shard 0 lists no chunk checksums (.sum)")
            && message.contains("older prep"),
        "{message}"
    );
    assert_eq!(err.path(), Some(dir.path().join(MANIFEST_FILE)));
}

/// Every path a shard entry names stays inside the dataset, `.sum` and
/// `.seg` included (`prep fetch` writes to them), and an optional file's
/// name, size and checksum come together.
#[test]
fn a_sum_path_outside_the_dataset_or_a_partial_listing_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_dataset(dir.path(), Dtype::U16, 1 << 20, &[vec![1, 2]]);
    let path = dir.path().join(MANIFEST_FILE);
    let good = std::fs::read_to_string(&path).unwrap();
    for (from, to, words) in [
        (
            "\"shard-00000.sum\"",
            "\"../x.sum\"",
            "not a plain relative path",
        ),
        (
            "\"sum_bytes\": 40,",
            "",
            "sum, sum_bytes and sum_xxh3 go together",
        ),
    ] {
        assert!(good.contains(from), "{good}");
        std::fs::write(&path, good.replacen(from, to, 1)).unwrap();
        let err = Dataset::open(dir.path()).expect_err("refused").to_string();
        assert!(err.contains(words), "{err}");
    }
}

#[test]
fn an_empty_dataset_has_no_shards() {
    let dir = tempfile::tempdir().unwrap();
    let shards = write_dataset(dir.path(), Dtype::U16, 100, &[]);
    assert!(shards.is_empty());
    let ds = Dataset::open(dir.path()).unwrap();
    assert_eq!((ds.len(), ds.n_tokens()), (0, 0));
}

#[test]
fn a_manifest_of_a_newer_version_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    write_dataset(dir.path(), Dtype::U16, 100, &[vec![1, 2]]);
    let path = dir.path().join(MANIFEST_FILE);
    let text =
        std::fs::read_to_string(&path)
            .unwrap()
            .replacen("\"version\": 1", "\"version\": 7", 1);
    std::fs::write(&path, text).unwrap();
    let err = Dataset::open(dir.path()).expect_err("refused");
    assert!(
        matches!(
            err,
            FormatError::UnsupportedVersion {
                found: 7,
                supported: 2,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_manifest_cannot_point_outside_the_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let mut shards = write_dataset(dir.path(), Dtype::U16, 100, &[vec![1, 2]]);
    shards[0].bin = "../../etc/passwd".into();
    atomic_write(
        &dir.path().join(MANIFEST_FILE),
        manifest(Dtype::U16, shards).to_json().as_bytes(),
    )
    .unwrap();
    let err = Dataset::open(dir.path()).expect_err("refused");
    assert!(
        err.to_string().contains("not a plain relative path"),
        "{err}"
    );
}

#[test]
fn a_bin_of_the_wrong_size_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let shards = write_dataset(dir.path(), Dtype::U32, 1 << 20, &[vec![1, 2, 3], vec![4]]);
    let bin = dir.path().join(&shards[0].bin);
    let bytes = std::fs::read(&bin).unwrap();
    std::fs::write(&bin, &bytes[..bytes.len() - 4]).unwrap();
    let err = Dataset::open(dir.path()).expect_err("refused");
    assert!(matches!(err, FormatError::Mismatch { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("12 bytes, but 4 tokens of uint32 need 16"),
        "{err}"
    );
}

/// A dataset past every 32-bit limit: a .bin of more than 4 GiB holding more
/// than 2^32 tokens. The .bin is sparse (only its marker pages take disk).
#[test]
fn offsets_and_sizes_past_4_gib_and_2_pow_32_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let n_tokens: u64 = (1 << 32) + 10;
    // Markers: the last token of record 0, the first and last of record 2.
    write_sparse_u16(
        dir.path(),
        &[1 << 31, (1 << 32) + 5 - (1 << 31), 5],
        &[
            ((1u64 << 31) - 1, 11),
            ((1 << 32) + 5, 22),
            (n_tokens - 1, 33),
        ],
    );

    let ds = Dataset::open(dir.path()).unwrap();
    assert_eq!(ds.n_tokens(), n_tokens);
    let r0 = ds.record(0).unwrap();
    assert_eq!(r0.len() as u64, 1 << 31);
    assert_eq!(r0.get(r0.len() - 1), Some(11));
    let r1 = ds.record(1).unwrap();
    assert_eq!(r1.len() as u64, (1 << 32) + 5 - (1 << 31));
    let r2 = ds.record(2).unwrap();
    assert_eq!(r2.len(), 5);
    assert_eq!(r2.to_vec(), vec![22, 0, 0, 0, 33]);
}
