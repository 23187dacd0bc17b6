//! The loader on a real GPU (feature `cuda`): batches arrive in device
//! memory with the right rows, widened to int64 or int32 on the device, in
//! sampler order, while the consumer works on its own stream. Skipped, with
//! a line saying so, on machines without a CUDA driver or GPU (CI).
#![cfg(feature = "cuda")]

mod common;

use std::sync::Arc;

use common::*;
use prep::format::{Dataset, Dtype};
use prep::loader::cuda::{driver_present, CudaBackend, Widen};
use prep::loader::{Loader, LoaderConfig};
use prep::sampler::Sampler;

const ROW: usize = 64;

fn backend(dtype: Dtype, widen: Widen) -> Option<Arc<CudaBackend>> {
    if !driver_present() {
        eprintln!("skipped: no CUDA driver on this machine");
        return None;
    }
    match CudaBackend::new(0, dtype, widen) {
        Ok(b) => Some(Arc::new(b)),
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

/// `n` rows of 64 tokens with ids that need the dtype's width.
fn dataset(t: &TestDir, dtype: Dtype, n: usize) -> Arc<Dataset> {
    let top: u64 = match dtype {
        Dtype::U16 => 65_536,
        Dtype::U32 => 1 << 32,
    };
    let rows: Vec<Vec<u32>> = (0..n)
        .map(|i| {
            (0..ROW)
                .map(|j| ((i as u64 * 2_654_435_761 + j as u64 * 40_503) % top) as u32)
                .collect()
        })
        .collect();
    write_dataset(t.dir.path(), dtype, 1 << 20, &rows);
    Arc::new(Dataset::open(t.dir.path()).unwrap())
}

#[test]
fn batches_reach_the_device_widened_and_in_order() {
    for (dtype, widen) in [
        (Dtype::U16, Widen::I64),
        (Dtype::U16, Widen::I32),
        (Dtype::U32, Widen::I64),
        (Dtype::U16, Widen::None),
    ] {
        let Some(backend) = backend(dtype, widen) else {
            return;
        };
        let t = TestDir::new();
        let ds = dataset(&t, dtype, 300);
        let sampler = Sampler::new(ds.len(), 3, 0, 0, 1);
        let mut loader = Loader::new(
            ds.clone(),
            sampler.clone(),
            backend.clone(),
            LoaderConfig {
                batch_rows: 32,
                depth: 3,
                start: 0,
                threads: 2,
            },
        )
        .unwrap();
        let consumer = backend.context().new_stream().unwrap();
        let mut position = 0;
        while let Some(batch) = loader.next_batch().unwrap() {
            consumer.wait(batch.ready()).unwrap();
            let bytes = consumer.clone_dtoh(batch.target().ids()).unwrap();
            consumer.synchronize().unwrap();
            let width = match widen {
                Widen::I64 => 8,
                Widen::I32 => 4,
                Widen::None => dtype.size(),
            };
            for r in 0..batch.rows() {
                let index = sampler.get(position + r as u64).unwrap();
                let expected = ds.record(index).unwrap().to_vec();
                for (j, &id) in expected.iter().enumerate() {
                    let at = (r * ROW + j) * width;
                    let mut word = [0u8; 8];
                    word[..width].copy_from_slice(&bytes[at..at + width]);
                    assert_eq!(
                        u64::from_le_bytes(word),
                        u64::from(id),
                        "{dtype:?} {widen:?}"
                    );
                }
            }
            position += batch.rows() as u64;
            let done = consumer.record_event(None).unwrap();
            batch.release(Some(done));
        }
        assert_eq!(position, ds.len());
    }
}
