//! The on-disk format through the library: write then read gives back every
//! token, shards are cut as specified, 64-bit offsets work past 4 GiB, and a
//! damaged index is refused, never read out of bounds.

use crate::common::{manifest, write_dataset, write_sparse_u16};
use prep::format::{atomic_write, Dtype, FormatError, MANIFEST_FILE};
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
    let err = Dataset::open(dir.path()).err().expect("refused");
    assert!(
        matches!(
            err,
            FormatError::UnsupportedVersion {
                found: 7,
                supported: 1,
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
    let err = Dataset::open(dir.path()).err().expect("refused");
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
    let err = Dataset::open(dir.path()).err().expect("refused");
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
