//! The loader on a real GPU (feature `cuda`): batches arrive in device
//! memory with the right rows, widened to int64 or int32 on the device, in
//! sampler order across epochs, while the consumer works on its own stream;
//! the DLPack view points at them; dropping the loader while a batch is
//! held is safe.
//!
//! Skipped, with a line saying so, only where there is no CUDA driver
//! library or the driver reports no device (CI). Where a device exists and
//! the backend cannot start, the tests fail: a broken GPU path must not
//! pass as a machine without a GPU. The rule itself is tested everywhere.
#![cfg(feature = "cuda")]

use std::sync::Arc;

use crate::common::*;
use prep::format::{Dataset, Dtype, Manifest, MANIFEST_FILE};
use prep::loader::cuda::{device_count, CudaBackend, Gather, IdType, Widen};
use prep::loader::{Loader, LoaderConfig, LoaderError, Order, Position};

const ROW: usize = 64;

/// What a GPU test does on this machine.
enum Gpu<B> {
    /// No driver or no device: the test is skipped, for this reason.
    Skip(String),
    /// A device and a working backend.
    Ready(B),
}

/// The skip rule: skip when `devices` says there is none; with a device,
/// the backend must start, and a failure panics (fails the test).
fn gpu_or_skip<B>(
    devices: Result<usize, LoaderError>,
    start: impl FnOnce() -> Result<B, LoaderError>,
) -> Gpu<B> {
    match devices {
        Ok(0) => Gpu::Skip("no CUDA driver or device on this machine".into()),
        Ok(n) => match start() {
            Ok(b) => Gpu::Ready(b),
            Err(e) => panic!("this machine has {n} GPU(s), but the backend failed to start: {e}"),
        },
        Err(e) => panic!("the CUDA driver is present but broken: {e}"),
    }
}

fn backend(dtype: Dtype, widen: Widen) -> Option<Arc<CudaBackend>> {
    match gpu_or_skip(device_count(), || CudaBackend::new(0, dtype, widen)) {
        Gpu::Skip(why) => {
            eprintln!("skipped: {why}");
            None
        }
        Gpu::Ready(b) => Some(Arc::new(b)),
    }
}

#[test]
fn the_skip_rule_skips_only_without_a_device() {
    let never = || -> Result<(), LoaderError> { panic!("no device: nothing is started") };
    assert!(matches!(gpu_or_skip(Ok(0), never), Gpu::Skip(_)));
    assert!(matches!(gpu_or_skip(Ok(1), || Ok(())), Gpu::Ready(())));
}

#[test]
#[should_panic(expected = "the backend failed to start")]
fn the_skip_rule_fails_when_a_device_exists_but_the_backend_cannot_start() {
    let _ = gpu_or_skip(Ok(1), || -> Result<(), LoaderError> {
        Err(LoaderError::Backend(
            "CUDA: creating a context: out of memory".into(),
        ))
    });
}

#[test]
#[should_panic(expected = "present but broken")]
fn the_skip_rule_fails_when_the_driver_is_present_but_broken() {
    let _ = gpu_or_skip(
        Err(LoaderError::Backend(
            "CUDA: counting devices: not initialized".into(),
        )),
        || Ok(()),
    );
}

/// `n` rows of 64 tokens with ids below `top`, spread over its whole range.
fn dataset(t: &TestDir, dtype: Dtype, n: usize, top: u64) -> Arc<Dataset> {
    dataset_of_rows(t, dtype, n, top, ROW)
}

/// `n` rows of `row` tokens with ids below `top`.
fn dataset_of_rows(t: &TestDir, dtype: Dtype, n: usize, top: u64, row: usize) -> Arc<Dataset> {
    let rows: Vec<Vec<u32>> = (0..n)
        .map(|i| {
            (0..row)
                .map(|j| ((i as u64 * 2_654_435_761 + j as u64 * 40_503) % top) as u32)
                .collect()
        })
        .collect();
    write_dataset(t.dir.path(), dtype, 1 << 20, &rows);
    // The vocabulary is what the widening checks: say it.
    let path = t.dir.path().join(MANIFEST_FILE);
    let mut manifest = Manifest::read(t.dir.path()).unwrap();
    manifest.vocab_size = top;
    std::fs::write(path, manifest.to_json()).unwrap();
    Arc::new(Dataset::open(t.dir.path()).unwrap())
}

fn config(epochs: u64) -> LoaderConfig {
    LoaderConfig {
        batch_rows: 32,
        depth: 3,
        order: Order::single(3),
        start: Position::default(),
        end_epoch: Some(epochs),
        threads: 2,
    }
}

#[test]
fn batches_reach_the_device_widened_and_in_order_across_epochs() {
    // Rows of 67 tokens start off 16-byte boundaries: the device gather's
    // head and tail are copied token by token, and the copy engines copy
    // rows of odd lengths at odd addresses.
    for (gather, row) in [
        (Gather::Host, ROW),
        (Gather::Device, ROW),
        (Gather::Device, 67),
        (Gather::Dma, ROW),
        (Gather::Dma, 67),
    ] {
        every_case_in_order(gather, row);
    }
}

/// Every dtype and widening, rows gathered as `gather` says.
fn every_case_in_order(gather: Gather, row: usize) {
    for (dtype, widen, top) in [
        (Dtype::U16, Widen::I64, 1 << 16),
        (Dtype::U16, Widen::I32, 1 << 16),
        (Dtype::U32, Widen::I64, 1 << 32),
        (Dtype::U32, Widen::I32, 1 << 31),
        (Dtype::U16, Widen::None, 1 << 16),
        (Dtype::U32, Widen::None, 1 << 32),
    ] {
        let Some(backend) = backend(dtype, widen) else {
            return;
        };
        let t = TestDir::new();
        let ds = dataset_of_rows(&t, dtype, 300, top, row);
        let b = Arc::try_unwrap(backend).ok().expect("the only reference");
        let backend = Arc::new(b.gather_with(gather, ds.clone()).unwrap());
        let order = config(2).order;
        let mut loader = Loader::new(ds.clone(), backend.clone(), config(2)).unwrap();
        let consumer = backend.context().new_stream().unwrap();
        let mut seen = 0u64;
        while let Some(batch) = loader.next_batch().unwrap() {
            consumer.wait(batch.ready()).unwrap();
            let bytes = consumer.clone_dtoh(batch.target().ids()).unwrap();
            consumer.synchronize().unwrap();
            let width = widen.bytes(dtype);
            let sampler = order.sampler(ds.len(), batch.epoch());
            for r in 0..batch.rows() {
                let index = sampler.get(batch.position() + r as u64).unwrap();
                let expected = ds.record(index).unwrap().to_vec();
                for (j, &id) in expected.iter().enumerate() {
                    let at = (r * row + j) * width;
                    let mut word = [0u8; 8];
                    word[..width].copy_from_slice(&bytes[at..at + width]);
                    let got = match width {
                        4 if widen == Widen::I32 => {
                            i64::from(i32::from_le_bytes(word[..4].try_into().unwrap()))
                        }
                        _ => i64::from_le_bytes(word),
                    };
                    assert_eq!(
                        got,
                        i64::from(id),
                        "{dtype:?} {widen:?}, rows of {row} (gathered: {gather:?}): ids keep their value"
                    );
                }
            }
            seen += batch.rows() as u64;
            let done = consumer.record_event(None).unwrap();
            batch.release(Some(done));
        }
        assert_eq!(seen, 2 * ds.len(), "two epochs");
    }
}

#[test]
fn u32_ids_past_2_pow_31_are_refused_for_int32() {
    let Some(backend) = backend(Dtype::U32, Widen::I32) else {
        return;
    };
    let t = TestDir::new();
    let ds = dataset(&t, Dtype::U32, 10, 1 << 32);
    let err = Loader::new(ds, backend, config(1)).err().unwrap();
    assert!(err.to_string().contains("does not fit int32"), "{err}");
}

#[test]
fn the_device_view_describes_the_batch_and_orders_a_stream() {
    let Some(backend) = backend(Dtype::U16, Widen::I64) else {
        return;
    };
    let t = TestDir::new();
    let ds = dataset(&t, Dtype::U16, 100, 1 << 16);
    let mut loader = Loader::new(ds.clone(), backend.clone(), config(1)).unwrap();
    let consumer = backend.context().new_stream().unwrap();
    let batch = loader.next_batch().unwrap().unwrap();
    let view = batch.device_view();
    assert_eq!(view.shape, [32, ROW as i64]);
    assert_eq!(view.dtype, IdType::I64);
    assert_eq!(view.device, 0);
    assert_ne!(view.ptr, 0);
    // SAFETY: the consumer stream is alive and of the loader's context;
    // the batch is held.
    unsafe { view.order_stream(consumer.cu_stream()) }.unwrap();
    let bytes = consumer.clone_dtoh(batch.target().ids()).unwrap();
    consumer.synchronize().unwrap();
    let index = config(1).order.sampler(ds.len(), 0).get(0).unwrap();
    let first = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    assert_eq!(first, u64::from(ds.record(index).unwrap().to_vec()[0]));
    batch.release(Some(consumer.record_event(None).unwrap()));
}

#[test]
fn dropping_the_loader_while_a_batch_is_held_is_safe() {
    let Some(backend) = backend(Dtype::U16, Widen::I64) else {
        return;
    };
    let t = TestDir::new();
    let ds = dataset(&t, Dtype::U16, 300, 1 << 16);
    let mut loader = Loader::new(ds.clone(), backend.clone(), config(1)).unwrap();
    let consumer = backend.context().new_stream().unwrap();
    let first = loader.next_batch().unwrap().unwrap();
    consumer.wait(first.ready()).unwrap();
    let second = loader.next_batch().unwrap().unwrap();
    consumer.wait(second.ready()).unwrap();
    second.release(Some(consumer.record_event(None).unwrap()));
    drop(loader);
    // The held batch stays readable after the loader is gone.
    let bytes = consumer.clone_dtoh(first.target().ids()).unwrap();
    first.release(Some(consumer.record_event(None).unwrap()));
    consumer.synchronize().unwrap();
    backend.stream().synchronize().unwrap();
    let index = config(1).order.sampler(ds.len(), 0).get(0).unwrap();
    let id = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    assert_eq!(id, u64::from(ds.record(index).unwrap().to_vec()[0]));
    backend.context().check_err().unwrap();
}

#[test]
fn a_loader_refuses_a_backend_that_gathers_from_another_dataset() {
    let Some(backend) = backend(Dtype::U16, Widen::I64) else {
        return;
    };
    let (t1, t2) = (TestDir::new(), TestDir::new());
    let (one, other) = (
        dataset(&t1, Dtype::U16, 40, 1 << 16),
        dataset(&t2, Dtype::U16, 40, 1 << 16),
    );
    let b = Arc::try_unwrap(backend).ok().expect("the only reference");
    let gathering = Arc::new(b.gather_on_device(one).unwrap());
    let err = Loader::new(other, gathering, config(1)).err().unwrap();
    assert!(err.to_string().contains("another dataset"), "{err}");
}
