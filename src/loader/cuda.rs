//! The CUDA backend of the loader (feature `cuda`): pinned staging buffers,
//! asynchronous host-to-device copies on the loader's own stream, optional
//! widening of the ids on the device, and events as fences.
//!
//! cudarc loads the driver library at run time (feature `dynamic-loading`),
//! so prep builds without a CUDA toolkit; [`CudaBackend::new`] checks that
//! the library is there before touching it (cudarc panics when it is not)
//! and returns an error instead.
//!
//! Staging buffers come from `cuMemHostAlloc`: plain page-locked memory by
//! default, or write-combined ([`Pinned`]); on an H200 the two measured the
//! same (docs/performance.md).
//!
//! Or the GPU gathers the rows itself ([`CudaBackend::gather_on_device`]):
//! the dataset's mapped shards are registered with the driver in place,
//! the producer writes each row's address into the staging buffer, and a
//! kernel copies the rows from host memory into the batch, widening as it
//! goes. Host memory is then read once per byte instead of three times (the
//! gather's read and write, the copy's read), which is what bounds the
//! host gather on a machine whose memory is slower than its PCIe link.
//! Or the GPU's copy engines copy the rows from the registered shards
//! ([`CudaBackend::gather_by_copies`]): one batched copy per batch
//! (`cuMemcpyBatchAsync`, CUDA 12.8 or newer), then the widening kernel,
//! as for a staged copy.
//!
//! The backend does its own synchronisation with events it owns, and never
//! relies on cudarc's event tracking (which a consumer may turn off on the
//! shared context): each staging buffer's copy records the ring's staging
//! event, each batch's copy a ready event, and a target is freed only after
//! a stream wait on the consumer's last event. Every event is created with
//! `CU_EVENT_BLOCKING_SYNC`, so a host waiting on one sleeps instead of
//! spinning on a core the gather threads need.
//!
//! This is the crate's second place with `unsafe` (the first is
//! `format::mmap`): calls into the CUDA driver that the compiler cannot check.

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::sys::{CUevent_flags, CUresult};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
    DriverError, LaunchConfig, PinnedHostSlice, PushKernelArg,
};

use super::{check_widen, Backend, Batch, LoaderError};
pub use super::{Gather, Pinned, Widen};
use crate::format::{Dataset, Dtype, Manifest};

/// The `cuMemHostAlloc` flags of each kind of staging memory.
fn pinned_flags(pinned: Pinned) -> u32 {
    match pinned {
        Pinned::Plain => 0,
        Pinned::WriteCombined => cudarc::driver::sys::CU_MEMHOSTALLOC_WRITECOMBINED,
    }
}

/// Copies batches into the memory of one GPU.
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    pinned: Pinned,
    stream: Arc<CudaStream>,
    dtype: Dtype,
    widen: Widen,
    kernel: Option<CudaFunction>,
    gather: Option<DeviceGather>,
    /// Copy events the consumer is done with, recorded again by the next
    /// copies: after the first `depth` steps no event is created.
    events: std::sync::Mutex<Vec<CudaEvent>>,
}

/// A pinned, write-combined host buffer.
pub struct Staging {
    host: PinnedHostSlice<u8>,
}

/// A batch's device memory: the tokens as stored (copied from staging, or
/// gathered there on the device when widening is off), and the widened
/// ids when widening is on.
pub struct Target {
    raw: Option<CudaSlice<u8>>,
    wide: Option<CudaSlice<u8>>,
}

impl Target {
    /// The ids as the consumer reads them: the widened buffer (int32 or
    /// int64 per token) when widening is on, else the raw tokens.
    pub fn ids(&self) -> &CudaSlice<u8> {
        self.wide
            .as_ref()
            .or(self.raw.as_ref())
            .expect("a target holds its ids")
    }
}

/// Rows gathered by the GPU from the mapped dataset itself
/// ([`CudaBackend::gather_on_device`], [`CudaBackend::gather_by_copies`]):
/// the shards' mappings registered with the driver (page-locked in place,
/// read-only), and what copies each row of a batch, given its address,
/// into device memory.
struct DeviceGather {
    dataset: Arc<Dataset>,
    /// The registered ranges' first bytes, unregistered when the backend drops.
    registered: Vec<usize>,
    read: RowRead,
    /// Tokens per row.
    row_tokens: u64,
}

/// What reads the rows of a batch from the registered dataset.
enum RowRead {
    /// The gather kernel: it widens as it writes.
    Kernel(CudaFunction),
    /// The copy engines, one batched copy per batch, into the raw buffer.
    Copies(BatchCopy),
}

fn driver_error(what: &str) -> impl Fn(DriverError) -> LoaderError + '_ {
    move |e| LoaderError::Backend(format!("CUDA: {what}: {e}"))
}

/// True when the CUDA driver library can be loaded on this machine.
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the shared library (dlopen) and reports
    // whether it could; no driver function is called.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// The GPUs this machine has: 0 when there is no driver library or the
/// driver reports no device (`CUDA_ERROR_NO_DEVICE`), the only two cases
/// in which GPU work may be skipped. Any other failure (a driver that
/// cannot initialise, say) is an error: a machine with a GPU whose driver
/// is broken must not pass for one without a GPU.
pub fn device_count() -> Result<usize, LoaderError> {
    if !driver_present() {
        return Ok(0);
    }
    match CudaContext::device_count() {
        Ok(n) => Ok(n.max(0) as usize),
        Err(DriverError(CUresult::CUDA_ERROR_NO_DEVICE)) => Ok(0),
        Err(e) => Err(driver_error("counting devices")(e)),
    }
}

/// The flags of every event the backend makes: a host wait sleeps instead
/// of spinning (timing stays on: the reference copy is timed with them).
const EVENT_FLAGS: CUevent_flags = CUevent_flags::CU_EVENT_BLOCKING_SYNC;

/// Tokens per block of the widening kernel.
const WIDEN_BLOCK: u32 = 256;

/// The launch of the widening kernel over `n` tokens: one thread per token,
/// in blocks of 256, with a 64-bit thread index in the kernel. An error,
/// never a truncated grid, for more tokens than one launch covers
/// (2^31 - 1 blocks: 2^39 tokens, far beyond any device's memory).
pub fn widen_launch(n: u64) -> Result<LaunchConfig, LoaderError> {
    let blocks = n.div_ceil(u64::from(WIDEN_BLOCK));
    let grid = u32::try_from(blocks)
        .ok()
        .filter(|&b| b <= i32::MAX as u32)
        .ok_or_else(|| {
            LoaderError::Usage(format!(
                "a batch of {n} tokens is more than one widening launch covers"
            ))
        })?;
    Ok(LaunchConfig {
        grid_dim: (grid.max(1), 1, 1),
        block_dim: (WIDEN_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    })
}

impl CudaBackend {
    /// A backend for GPU `ordinal`, copying tokens of `dtype` and widening
    /// them as asked. An error, not a panic, on a machine without the
    /// driver or without that GPU.
    pub fn new(ordinal: usize, dtype: Dtype, widen: Widen) -> Result<CudaBackend, LoaderError> {
        if !driver_present() {
            return Err(LoaderError::Backend(
                "no CUDA driver on this machine (libcuda.so was not found): use --device cpu"
                    .into(),
            ));
        }
        let count = device_count()?;
        if ordinal >= count {
            return Err(LoaderError::Backend(format!(
                "no GPU cuda:{ordinal}: this machine has {count}"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(driver_error("creating a context"))?;
        let stream = ctx
            .new_stream()
            .map_err(driver_error("creating the loader's stream"))?;
        let kernel = match widen {
            Widen::None => None,
            _ => {
                let (name, ptx) = widen_ptx(dtype, widen);
                let module = ctx
                    .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
                    .map_err(driver_error("loading the widening kernel"))?;
                Some(
                    module
                        .load_function(&name)
                        .map_err(driver_error("finding the widening kernel"))?,
                )
            }
        };
        Ok(CudaBackend {
            ctx,
            pinned: Pinned::default(),
            stream,
            dtype,
            widen,
            kernel,
            gather: None,
            events: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// Staging buffers (and the reference copy's source) of `pinned`
    /// memory, for buffers allocated from now on.
    pub fn with_pinned(mut self, pinned: Pinned) -> CudaBackend {
        self.pinned = pinned;
        self
    }

    /// Has rows gathered as `gather` says: by the loader's threads (the
    /// backend as it is), by a kernel ([`CudaBackend::gather_on_device`])
    /// or by the copy engines ([`CudaBackend::gather_by_copies`]).
    pub fn gather_with(
        self,
        gather: Gather,
        dataset: Arc<Dataset>,
    ) -> Result<CudaBackend, LoaderError> {
        match gather {
            Gather::Host => Ok(self),
            Gather::Device => self.gather_on_device(dataset),
            Gather::Dma => self.gather_by_copies(dataset),
        }
    }

    /// Has the GPU gather each batch's rows itself, from `dataset`'s mapped
    /// shards, instead of the producer's threads copying them into staging
    /// buffers: the host's memory is read once per byte (by the GPU, over
    /// the bus) rather than three times (the gather's read and write, then
    /// the copy's read). The shards are registered with the driver, which
    /// page-locks them in place for the backend's life: the whole dataset
    /// must fit in the machine's memory beside everything else.
    ///
    /// An error when the GPU or driver cannot read registered read-only
    /// memory at its host address, when registering fails (too little
    /// memory to lock, say), or for rows under 8 bytes.
    pub fn gather_on_device(self, dataset: Arc<Dataset>) -> Result<CudaBackend, LoaderError> {
        let (name, ptx) = gather_ptx(self.dtype, self.widen);
        let kernel = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
            .and_then(|m| m.load_function(&name))
            .map_err(driver_error("loading the gather kernel"))?;
        let mut backend = self.register(dataset, RowRead::Kernel(kernel))?;
        // The gather kernel widens as it writes: the widening kernel of a
        // staged copy is not needed.
        backend.kernel = None;
        Ok(backend)
    }

    /// Has the GPU's copy engines copy each batch's rows from `dataset`'s
    /// mapped shards, registered in place as for
    /// [`CudaBackend::gather_on_device`]: one batched copy
    /// (`cuMemcpyBatchAsync`) per batch, a copy per row, into the batch's
    /// device buffer, which the widening kernel then widens. Host memory
    /// is read once per byte, by DMA, as by a plain pinned copy.
    ///
    /// An error where the driver has no batched copies (before CUDA 12.8),
    /// and in the cases of [`CudaBackend::gather_on_device`].
    pub fn gather_by_copies(self, dataset: Arc<Dataset>) -> Result<CudaBackend, LoaderError> {
        let copies = BatchCopy::find()?;
        self.register(dataset, RowRead::Copies(copies))
    }

    /// Registers `dataset`'s shards with the driver for `read` to read rows
    /// from: page-locked in place, read-only, mapped for the device.
    fn register(
        mut self,
        dataset: Arc<Dataset>,
        read: RowRead,
    ) -> Result<CudaBackend, LoaderError> {
        use cudarc::driver::sys::CUdevice_attribute as A;
        let name = dataset.dir().display().to_string();
        if dataset.dtype() != self.dtype {
            return Err(LoaderError::Usage(format!(
                "{name}: tokens are {:?}, the backend was made for {:?}",
                dataset.dtype(),
                self.dtype
            )));
        }
        let row_tokens = super::row_length(&dataset)? as u64;
        if row_tokens * (self.dtype.size() as u64) < (super::ADDRESS as u64) {
            return Err(LoaderError::Usage(format!(
                "{name}: rows of {row_tokens} tokens are too short to gather on the device"
            )));
        }
        for (attribute, what) in [
            (
                A::CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED,
                "register read-only host memory",
            ),
            (
                A::CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
                "read registered host memory at its host address",
            ),
        ] {
            let supported = self
                .ctx
                .attribute(attribute)
                .map_err(driver_error("reading a device attribute"))?;
            if supported != 1 {
                return Err(LoaderError::Backend(format!(
                    "this GPU or driver cannot {what}: gather rows on the host instead"
                )));
            }
        }
        self.ctx
            .bind_to_thread()
            .map_err(driver_error("binding the context"))?;
        let mut gather = DeviceGather {
            dataset: dataset.clone(),
            registered: Vec::new(),
            read,
            row_tokens,
        };
        for s in 0..dataset.n_shards() {
            let bin = dataset.shard_bin(s);
            if bin.is_empty() {
                continue;
            }
            let len = bin.len().div_ceil(REGISTER_ALIGN) * REGISTER_ALIGN;
            let flags = cudarc::driver::sys::CU_MEMHOSTREGISTER_DEVICEMAP
                | cudarc::driver::sys::CU_MEMHOSTREGISTER_READ_ONLY;
            // SAFETY: `bin` is a read-only mapping of the shard, which
            // starts on a page boundary and covers whole pages, so the
            // rounded length stays inside it; it lives as long as
            // `dataset`, which the backend holds until it unregisters it
            // (drop). Read-only: the driver and the GPU never write it.
            let result = unsafe {
                cudarc::driver::sys::cuMemHostRegister_v2(bin.as_ptr() as *mut _, len, flags)
            };
            if let Err(e) = result.result() {
                // `gather` drops here, unregistering what was registered.
                self.gather = Some(gather);
                return Err(LoaderError::Backend(format!(
                    "CUDA: registering {} ({} bytes) for the GPU to gather from: {e} (gathering on the device page-locks the whole dataset in place)",
                    dataset.dir().display(),
                    bin.len()
                )));
            }
            gather.registered.push(bin.as_ptr() as usize);
        }
        self.gather = Some(gather);
        Ok(self)
    }

    /// Allocates `bytes` of page-locked host memory of the backend's kind.
    ///
    /// # Safety
    /// The memory is uninitialised: write it before reading it.
    unsafe fn alloc_host(&self, bytes: usize) -> Result<PinnedHostSlice<u8>, LoaderError> {
        self.ctx
            .alloc_pinned_with_flags::<u8>(bytes, pinned_flags(self.pinned))
            .map_err(driver_error("allocating pinned memory"))
    }

    /// The context, for the consumer's own streams.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The loader's copy stream.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// How the ids arrive on the device.
    pub fn widen(&self) -> Widen {
        self.widen
    }

    fn new_event(&self) -> Result<CudaEvent, LoaderError> {
        self.ctx
            .new_event(Some(EVENT_FLAGS))
            .map_err(driver_error("creating an event"))
    }

    /// The time the GPU takes for `n` back-to-back copies of `bytes` bytes
    /// from pinned host memory (of the staging buffers' kind) to device memory on a stream of their own,
    /// timed with events on the device (not by the host issuing them): the
    /// ceiling the loader's copies are measured against. Each copy is one
    /// driver call (`cuMemcpyHtoDAsync`), queued while the previous runs.
    pub fn pinned_copy_time(&self, bytes: usize, n: usize) -> Result<Duration, LoaderError> {
        let stream = self
            .ctx
            .new_stream()
            .map_err(driver_error("creating a stream"))?;
        // SAFETY: the memory is written right below, before any read.
        let mut host = unsafe { self.alloc_host(bytes.max(1)) }?;
        host.as_mut_slice()
            .map_err(driver_error("writing pinned memory"))?
            .fill(1);
        let mut dev = stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(driver_error("allocating device memory"))?;
        let (start, end) = (self.new_event()?, self.new_event()?);
        {
            let src = host
                .as_slice()
                .map_err(driver_error("reading pinned memory"))?;
            let (dst, _record) = dev.device_ptr_mut(&stream);
            // One copy first, so the timed ones find the stream warm.
            copy_htod(dst, src, &stream)?;
            start
                .record(&stream)
                .map_err(driver_error("recording an event"))?;
            for _ in 0..n {
                copy_htod(dst, src, &stream)?;
            }
            end.record(&stream)
                .map_err(driver_error("recording an event"))?;
        }
        let ms = start
            .elapsed_ms(&end)
            .map_err(driver_error("timing the copies"))?;
        Ok(Duration::from_secs_f64(f64::from(ms) / 1e3))
    }
}

impl Drop for CudaBackend {
    /// Unregisters the dataset a device gather read, once no kernel that
    /// reads it can still run.
    fn drop(&mut self) {
        let Some(gather) = &self.gather else {
            return;
        };
        if gather.registered.is_empty() || self.ctx.bind_to_thread().is_err() {
            return;
        }
        let _ = self.ctx.synchronize();
        for &at in &gather.registered {
            // SAFETY: `at` was registered by `gather_on_device`, the context
            // is idle (synchronised above), and the mapping is still alive
            // (`gather.dataset` drops after this).
            let _ = unsafe { cudarc::driver::sys::cuMemHostUnregister(at as *mut _) };
        }
    }
}

/// The length a registered range is rounded up to a multiple of: the
/// smallest page size; a mapping covers whole pages of the machine's size,
/// a multiple of it, so the rounded range stays inside the mapping.
const REGISTER_ALIGN: usize = 4096;

/// Queues a copy of `src` (pinned host memory) to device address `dst`.
fn copy_htod(
    dst: cudarc::driver::sys::CUdeviceptr,
    src: &[u8],
    stream: &CudaStream,
) -> Result<(), LoaderError> {
    // SAFETY: `dst` is a device allocation of at least `src.len()` bytes
    // on `stream`'s context, and `src` is pinned memory that the caller
    // keeps alive, unwritten, until the stream has run the copy (it waits
    // on an event recorded after it before dropping either).
    unsafe { cudarc::driver::result::memcpy_htod_async(dst, src, stream.cu_stream()) }
        .map_err(driver_error("copying to the device"))
}

/// The copies of one batch's rows, as `cuMemcpyBatchAsync` takes them: a
/// copy per row. Rows are not joined where they happen to lie one after
/// another: in sampler order (a permutation) that is rare, and a copy that
/// ran from one shard's registered range into the next is not one the
/// driver promises to take.
#[derive(Debug, PartialEq, Eq)]
pub struct CopyPlan {
    /// Where each copy writes, on the device.
    pub dsts: Vec<u64>,
    /// Where each copy reads, in the registered dataset.
    pub srcs: Vec<u64>,
    /// Bytes per copy.
    pub sizes: Vec<usize>,
}

impl CopyPlan {
    /// The plan for the rows whose addresses `addresses` holds (8 bytes
    /// each, little-endian, as the producer writes them), `row_bytes` each,
    /// written row after row from device address `base`.
    pub fn new(addresses: &[u8], base: u64, row_bytes: usize) -> CopyPlan {
        let srcs: Vec<u64> = addresses
            .chunks_exact(super::ADDRESS)
            .map(|a| u64::from_le_bytes(a.try_into().expect("8 bytes")))
            .collect();
        CopyPlan {
            dsts: (0..srcs.len() as u64)
                .map(|k| base + k * row_bytes as u64)
                .collect(),
            sizes: vec![row_bytes; srcs.len()],
            srcs,
        }
    }
}

/// `CUmemcpyAttributes` (CUDA 12.8 and 13): how the copies of a batched
/// copy may read their sources. cudarc's bindings for CUDA 12.4, which
/// prep builds against so that older drivers load it, do not have it.
#[repr(C)]
#[derive(Clone, Copy)]
struct MemcpyAttributes {
    /// `CUmemcpySrcAccessOrder`.
    src_access_order: u32,
    src_loc_hint: cudarc::driver::sys::CUmemLocation,
    dst_loc_hint: cudarc::driver::sys::CUmemLocation,
    /// `CUmemcpyFlags`.
    flags: u32,
}

/// `CU_MEMCPY_SRC_ACCESS_ORDER_STREAM`: sources are read in stream order.
const SRC_ACCESS_ORDER_STREAM: u32 = 1;

type BatchCopy12080 = unsafe extern "C" fn(
    dsts: *mut u64,
    srcs: *mut u64,
    sizes: *mut usize,
    count: usize,
    attrs: *mut MemcpyAttributes,
    attrs_idxs: *mut usize,
    num_attrs: usize,
    fail_idx: *mut usize,
    stream: CUstream,
) -> CUresult;

/// CUDA 13 dropped `failIdx`.
type BatchCopy13000 = unsafe extern "C" fn(
    dsts: *mut u64,
    srcs: *mut u64,
    sizes: *mut usize,
    count: usize,
    attrs: *mut MemcpyAttributes,
    attrs_idxs: *mut usize,
    num_attrs: usize,
    stream: CUstream,
) -> CUresult;

/// The driver's `cuMemcpyBatchAsync`, found at run time in the version the
/// driver has: its parameters changed between CUDA 12.8 and 13.
enum BatchCopy {
    V12080(BatchCopy12080),
    V13000(BatchCopy13000),
}

impl BatchCopy {
    /// The driver's batched copy; an error where it has none.
    fn find() -> Result<BatchCopy, LoaderError> {
        use cudarc::driver::sys as cu;
        let mut version = 0;
        // SAFETY: writes one int.
        unsafe { cu::cuDriverGetVersion(&mut version) }
            .result()
            .map_err(driver_error("reading the driver's version"))?;
        let ask = match version {
            v if v >= 13000 => 13000,
            v if v >= 12080 => 12080,
            v => {
                return Err(LoaderError::Backend(format!(
                    "the CUDA driver ({}.{}) has no batched copies (CUDA 12.8 or newer): gather rows on the host, or with a kernel (--gather device)",
                    v / 1000,
                    v % 1000 / 10
                )))
            }
        };
        let mut pfn = std::ptr::null_mut();
        let mut status = cu::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        // SAFETY: looks a symbol up by name, writing its address and the
        // lookup's status.
        unsafe {
            cu::cuGetProcAddress_v2(
                c"cuMemcpyBatchAsync".as_ptr(),
                &mut pfn,
                ask,
                cu::CUdriverProcAddress_flags::CU_GET_PROC_ADDRESS_DEFAULT as u64,
                &mut status,
            )
        }
        .result()
        .map_err(driver_error("finding cuMemcpyBatchAsync"))?;
        if pfn.is_null()
            || status != cu::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS
        {
            return Err(LoaderError::Backend(format!(
                "the CUDA driver has no cuMemcpyBatchAsync for CUDA {}.{} ({status:?})",
                ask / 1000,
                ask % 1000 / 10
            )));
        }
        // SAFETY: the driver returned the function of the version asked
        // for, whose parameters are those of the type it becomes.
        Ok(unsafe {
            if ask >= 13000 {
                BatchCopy::V13000(std::mem::transmute::<*mut std::ffi::c_void, BatchCopy13000>(pfn))
            } else {
                BatchCopy::V12080(std::mem::transmute::<*mut std::ffi::c_void, BatchCopy12080>(pfn))
            }
        })
    }

    /// Queues `plan`'s copies on `stream`, from host memory to device
    /// `ordinal`'s memory, the sources read in stream order.
    ///
    /// # Safety
    /// Each source range must be registered (or pinned) host memory that
    /// stays alive and unchanged until the stream has run the copies, and
    /// each destination range device memory of `stream`'s context that
    /// nothing else touches until then.
    unsafe fn run(
        &self,
        plan: &mut CopyPlan,
        ordinal: usize,
        stream: &CudaStream,
    ) -> Result<(), LoaderError> {
        use cudarc::driver::sys::{CUmemLocation, CUmemLocationType};
        let mut attrs = [MemcpyAttributes {
            src_access_order: SRC_ACCESS_ORDER_STREAM,
            src_loc_hint: CUmemLocation {
                type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST,
                id: 0,
            },
            dst_loc_hint: CUmemLocation {
                type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: ordinal as i32,
            },
            flags: 0,
        }];
        let mut first = [0usize];
        // The driver reads the arrays during the call and never writes them.
        let CopyPlan { dsts, srcs, sizes } = plan;
        let count = sizes.len();
        let result = match self {
            BatchCopy::V13000(f) => f(
                dsts.as_mut_ptr(),
                srcs.as_mut_ptr(),
                sizes.as_mut_ptr(),
                count,
                attrs.as_mut_ptr(),
                first.as_mut_ptr(),
                1,
                stream.cu_stream(),
            ),
            BatchCopy::V12080(f) => {
                let mut failed = usize::MAX;
                f(
                    dsts.as_mut_ptr(),
                    srcs.as_mut_ptr(),
                    sizes.as_mut_ptr(),
                    count,
                    attrs.as_mut_ptr(),
                    first.as_mut_ptr(),
                    1,
                    &mut failed,
                    stream.cu_stream(),
                )
            }
        };
        result
            .result()
            .map_err(driver_error("copying a batch's rows to the device"))
    }
}

impl Backend for CudaBackend {
    type Staging = Staging;
    type Target = Target;
    type Fence = CudaEvent;

    fn alloc_staging(&self, bytes: usize) -> Result<Staging, LoaderError> {
        // SAFETY: the memory is uninitialised until zeroed right below; a
        // partial last batch copies stale bytes past its rows, which the
        // consumer does not look at, but never uninitialised ones.
        let mut host = unsafe { self.alloc_host(bytes) }?;
        host.as_mut_slice()
            .map_err(driver_error("writing pinned memory"))?
            .fill(0);
        Ok(Staging { host })
    }

    fn alloc_target(&self, bytes: usize) -> Result<Target, LoaderError> {
        // The gather kernel writes the ids straight where the consumer
        // reads them: the raw buffer is needed only unwidened.
        let kernel_gather = matches!(
            self.gather,
            Some(DeviceGather {
                read: RowRead::Kernel(_),
                ..
            })
        );
        let raw = match (kernel_gather, self.widen) {
            (true, Widen::I32 | Widen::I64) => None,
            _ => Some(
                self.stream
                    .alloc_zeros::<u8>(bytes)
                    .map_err(driver_error("allocating device memory"))?,
            ),
        };
        let wide = match self.widen {
            Widen::None => None,
            w => Some(
                self.stream
                    .alloc_zeros::<u8>(bytes / self.dtype.size() * w.bytes(self.dtype))
                    .map_err(driver_error("allocating device memory"))?,
            ),
        };
        Ok(Target { raw, wide })
    }

    fn fence(&self) -> Result<CudaEvent, LoaderError> {
        self.new_event()
    }

    fn staging_mut<'a>(&self, staging: &'a mut Staging) -> Result<&'a mut [u8], LoaderError> {
        // The ring has waited on this buffer's staging event; cudarc's own
        // event on the slice (recorded only with event tracking) is
        // complete too, so this returns at once.
        staging
            .host
            .as_mut_slice()
            .map_err(driver_error("writing a staging buffer"))
    }

    fn copy(
        &self,
        staging: &mut Staging,
        target: &mut Target,
        bytes: usize,
        after: Option<CudaEvent>,
        staged: &mut CudaEvent,
    ) -> Result<CudaEvent, LoaderError> {
        if let Some(done) = after {
            // The consumer's last work on this target, ordered on the
            // device: a stream wait, not a host sync.
            self.stream
                .wait(&done)
                .map_err(driver_error("ordering after the consumer"))?;
        }
        let raw = match &self.gather {
            Some(
                gather @ DeviceGather {
                    read: RowRead::Kernel(kernel),
                    ..
                },
            ) => {
                self.gather_rows(gather, kernel, staging, target, bytes / super::ADDRESS)?;
                staged
                    .record(&self.stream)
                    .map_err(driver_error("recording the staging event"))?;
                return self.ready_event();
            }
            Some(
                gather @ DeviceGather {
                    read: RowRead::Copies(copies),
                    ..
                },
            ) => {
                let raw = target
                    .raw
                    .as_mut()
                    .expect("a copied target holds its raw buffer");
                self.copy_rows(gather, copies, staging, raw, bytes / super::ADDRESS)?;
                raw
            }
            None => {
                let raw = target
                    .raw
                    .as_mut()
                    .expect("a staged target holds its raw buffer");
                // The whole buffer, always: a partial last batch copies
                // stale bytes past its rows, which the consumer does not
                // read.
                self.stream
                    .memcpy_htod(&staging.host, raw)
                    .map_err(driver_error("copying a batch to the device"))?;
                raw
            }
        };
        // The staging buffer is free again once this point is reached: the
        // ring waits on it before the next gather into the buffer.
        staged
            .record(&self.stream)
            .map_err(driver_error("recording the staging event"))?;
        if let (Some(kernel), Some(wide)) = (&self.kernel, target.wide.as_mut()) {
            let n = (raw.len() / self.dtype.size()) as u64;
            let config = widen_launch(n)?;
            let mut launch = self.stream.launch_builder(kernel);
            launch.arg(&*raw).arg(wide).arg(&n);
            // SAFETY: the kernel reads `n` tokens of the dtype it was built
            // for from `raw` (exactly its length) and writes `n` ids of the
            // widened size into `wide` (allocated for that many), and does
            // nothing for threads at or past `n`; the grid covers `n`.
            unsafe { launch.launch(config) }.map_err(driver_error("widening the ids"))?;
        }
        self.ready_event()
    }

    fn gathers(&self) -> Option<&Dataset> {
        self.gather.as_ref().map(|g| &*g.dataset)
    }

    fn wait(&self, fence: &CudaEvent) -> Result<(), LoaderError> {
        fence
            .synchronize()
            .map_err(driver_error("waiting for an event"))
    }

    fn retire(&self, target: Target, done: Option<CudaEvent>) {
        if let Some(done) = done {
            // The free below is queued on the loader's stream (where the
            // target was allocated): after this wait, whatever cudarc
            // tracks. If the wait cannot be queued, wait on the host.
            if self.stream.wait(&done).is_err() {
                let _ = done.synchronize();
            }
        }
        drop(target);
    }

    fn recycle(&self, fence: CudaEvent) {
        if let Ok(mut events) = self.events.lock() {
            events.push(fence);
        }
    }

    fn check(&self, name: &str, manifest: &Manifest) -> Result<(), LoaderError> {
        if manifest.dtype != self.dtype {
            return Err(LoaderError::Usage(format!(
                "{name}: tokens are {:?}, the backend was made for {:?}",
                manifest.dtype, self.dtype
            )));
        }
        check_widen(self.dtype, self.widen, manifest.vocab_size)
    }
}

impl CudaBackend {
    /// Queues the gather of `rows` rows, whose addresses are the first
    /// `rows` entries of `staging`, into `target`'s ids, by `kernel`.
    fn gather_rows(
        &self,
        gather: &DeviceGather,
        kernel: &CudaFunction,
        staging: &Staging,
        target: &mut Target,
        rows: usize,
    ) -> Result<(), LoaderError> {
        let addresses = staging
            .host
            .as_ptr()
            .map_err(driver_error("reading a staging buffer"))? as u64;
        let ids = match target.wide.as_mut() {
            Some(wide) => wide,
            None => target
                .raw
                .as_mut()
                .expect("an unwidened target holds its raw buffer"),
        };
        let config = gather_launch(rows)?;
        let mut launch = self.stream.launch_builder(kernel);
        launch.arg(&addresses).arg(ids).arg(&gather.row_tokens);
        // SAFETY: block b reads the address at `addresses + 8b` (pinned
        // staging memory, mapped for the device: the host pointer is its
        // device address under unified addressing; the producer wrote one
        // per row, `rows` of them), then `row_tokens` tokens from there (a
        // row of the registered dataset, which the producer checked is that
        // long), and writes them, converted as the kernel was built to, at
        // row b of `ids` (allocated for a whole batch: at least `rows`
        // rows). The grid is exactly `rows` blocks.
        unsafe { launch.launch(config) }.map_err(driver_error("gathering rows on the device"))?;
        Ok(())
    }

    /// Queues the copies of `rows` rows, whose addresses are the first
    /// `rows` entries of `staging`, into `raw`, row after row, by the copy
    /// engines: one batched copy, a copy per row.
    fn copy_rows(
        &self,
        gather: &DeviceGather,
        copies: &BatchCopy,
        staging: &Staging,
        raw: &mut CudaSlice<u8>,
        rows: usize,
    ) -> Result<(), LoaderError> {
        let row_bytes = gather.row_tokens as usize * self.dtype.size();
        assert!(
            rows * row_bytes <= raw.len(),
            "a batch's rows fit its device buffer"
        );
        let addresses = staging
            .host
            .as_slice()
            .map_err(driver_error("reading a staging buffer"))?;
        let (base, _record) = raw.device_ptr_mut(&self.stream);
        let mut plan = CopyPlan::new(&addresses[..rows * super::ADDRESS], base, row_bytes);
        // SAFETY: copy i reads a row (`row_bytes`) at `srcs[i]`, in the
        // registered dataset (the producer wrote each row's address after
        // checking the row is that long), mapped for the device and alive
        // while the backend is; and writes it at `dsts[i]`, row i of `raw`
        // (rows 0..rows, which fit it: the assert above), on the loader's
        // stream, which orders it after the consumer's last use of `raw`.
        unsafe { copies.run(&mut plan, self.ctx.ordinal(), &self.stream) }
    }

    /// The batch's ready event, recorded now on the loader's stream.
    fn ready_event(&self) -> Result<CudaEvent, LoaderError> {
        // A spent event can be recorded again: a stream that waited on it
        // waited on the work recorded then, not on what is recorded now.
        let spent = self.events.lock().ok().and_then(|mut e| e.pop());
        let event = match spent {
            Some(event) => event,
            None => self.new_event()?,
        };
        event
            .record(&self.stream)
            .map_err(driver_error("recording the copy's event"))?;
        Ok(event)
    }
}

/// A batch's ids in device memory, described for a zero-copy hand-off to
/// another framework: the fields of DLPack's `DLTensor` and of
/// `__cuda_array_interface__` (version 3).
///
/// # Stream ordering
///
/// The memory holds the batch once the batch's ready event is complete;
/// nothing orders the consumer's stream after it but the consumer:
///
/// 1. Before any work reads the tensor, make the stream it runs on wait on
///    the ready event: [`DeviceView::order_stream`] (what DLPack's
///    `__dlpack__(stream=s)` asks of a producer) or, from Rust,
///    `stream.wait(batch.ready())`. It is a device-side wait; the host goes on.
/// 2. The memory is the batch's until it is released: do not keep the
///    tensor (or a view of it) past [`Batch::release`].
/// 3. Release it with an event recorded on that stream after the last work
///    that reads the tensor: `batch.release(Some(stream.record_event(..)?))`.
///    The next copy into the buffer, or its free when the loader is gone,
///    waits on that event on the device. Work on other streams must be
///    joined into that stream before the event is recorded.
///
/// `__cuda_array_interface__`'s `stream` field names the stream the data
/// is valid on *after* its last queued work; handing out the loader's
/// stream there would make a consumer wait for copies of later batches
/// too, so a binding should pass `stream: None` and call `order_stream`
/// on the consumer's stream instead.
#[derive(Debug, Clone, Copy)]
pub struct DeviceView {
    /// The device address of the first id.
    pub ptr: u64,
    /// The CUDA device ordinal (DLPack's `device_id`, device type `kDLCUDA`).
    pub device: usize,
    /// Rows and tokens per row; contiguous, row after row (no strides).
    pub shape: [i64; 2],
    /// The ids' type.
    pub dtype: IdType,
    /// The batch's ready event (`CUevent`), for [`DeviceView::order_stream`].
    ready: cudarc::driver::sys::CUevent,
}

/// The type of the ids on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdType {
    /// Stored uint16 ids.
    U16,
    /// Stored uint32 ids.
    U32,
    /// Widened to int32.
    I32,
    /// Widened to int64.
    I64,
}

impl IdType {
    /// DLPack's `DLDataType` as (code, bits, lanes): code 0 is `kDLInt`,
    /// 1 is `kDLUInt`.
    pub fn dlpack(self) -> (u8, u8, u16) {
        match self {
            IdType::U16 => (1, 16, 1),
            IdType::U32 => (1, 32, 1),
            IdType::I32 => (0, 32, 1),
            IdType::I64 => (0, 64, 1),
        }
    }

    /// `__cuda_array_interface__`'s `typestr`.
    pub fn typestr(self) -> &'static str {
        match self {
            IdType::U16 => "<u2",
            IdType::U32 => "<u4",
            IdType::I32 => "<i4",
            IdType::I64 => "<i8",
        }
    }

    /// Bytes per id.
    pub fn size(self) -> usize {
        match self {
            IdType::U16 => 2,
            IdType::U32 | IdType::I32 => 4,
            IdType::I64 => 8,
        }
    }

    fn of(dtype: Dtype, widen: Widen) -> IdType {
        match (widen, dtype) {
            (Widen::I64, _) => IdType::I64,
            (Widen::I32, _) => IdType::I32,
            (Widen::None, Dtype::U16) => IdType::U16,
            (Widen::None, Dtype::U32) => IdType::U32,
        }
    }
}

impl DeviceView {
    /// Makes `stream` wait, on the device, until the batch is in memory.
    ///
    /// # Safety
    /// `stream` must be a live stream (or 0, the legacy default stream) of
    /// the loader's context, and the batch this view came from must not
    /// have been released yet (its event may be recorded again after).
    pub unsafe fn order_stream(&self, stream: CUstream) -> Result<(), LoaderError> {
        cudarc::driver::result::stream::wait_event(
            stream,
            self.ready,
            cudarc::driver::sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
        )
        .map_err(driver_error("ordering a stream after a batch"))
    }
}

impl Batch<CudaBackend> {
    /// The batch's ids as a tensor description for DLPack or
    /// `__cuda_array_interface__`; see [`DeviceView`] for the stream
    /// ordering a consumer must keep. Valid until the batch is released.
    pub fn device_view(&self) -> DeviceView {
        let backend = self.backend();
        let ids = self.target().ids();
        let (ptr, _record) = ids.device_ptr(backend.stream());
        DeviceView {
            ptr,
            device: backend.ctx.ordinal(),
            shape: [self.rows() as i64, self.row_tokens() as i64],
            dtype: IdType::of(backend.dtype, backend.widen),
            ready: self.ready().cu_event(),
        }
    }
}

/// A stream handle from outside cudarc: a framework's stream (PyTorch's
/// `torch.cuda.Stream.cuda_stream`), or 0 for the legacy default stream.
pub use cudarc::driver::sys::CUstream;

/// Records `event` on `stream`: the fence a consumer releases a batch with
/// when its work runs on a stream that cudarc does not own.
///
/// # Safety
/// `stream` must be a live stream (or 0) of the context `event` was made in.
pub unsafe fn record_on(event: &CudaEvent, stream: CUstream) -> Result<(), LoaderError> {
    cudarc::driver::result::event::record(event.cu_event(), stream)
        .map_err(driver_error("recording an event"))
}

/// Waits on the host until the work queued on `stream` is complete.
///
/// # Safety
/// `stream` must be a live stream (or 0) of a context that is current or
/// primary on this device.
pub unsafe fn synchronize(stream: CUstream) -> Result<(), LoaderError> {
    cudarc::driver::result::stream::synchronize(stream)
        .map_err(driver_error("waiting for a stream"))
}

/// Threads per block of the gather kernel: a block copies one row, its
/// threads a token each, stride by stride.
const GATHER_BLOCK: u32 = 256;

/// The launch of the gather kernel over `rows` rows: one block per row.
pub fn gather_launch(rows: usize) -> Result<LaunchConfig, LoaderError> {
    let grid = u32::try_from(rows)
        .ok()
        .filter(|&r| r <= i32::MAX as u32)
        .ok_or_else(|| {
            LoaderError::Usage(format!(
                "a batch of {rows} rows is more than one gather launch covers"
            ))
        })?;
    Ok(LaunchConfig {
        grid_dim: (grid.max(1), 1, 1),
        block_dim: (GATHER_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// The gather kernel for `dtype` into `widen` as PTX text. Block `b`
/// copies row `b`: it reads the row's address (the `b`-th u64 at `addrs`),
/// then its threads read the row from there in 16-byte loads (the bus
/// carries whole 16-byte reads far faster than 2-byte ones) and write each
/// token to row `b` of `dst`, widened or as stored. A row need not start on
/// 16 bytes (rows of 2,049 uint16 tokens do not): the tokens before the
/// first 16-byte boundary and after the last whole 16 bytes are copied one
/// each by the first threads. One piece, over 120 lines: most of it is the
/// kernel's text, which reads top to bottom as the GPU runs it.
fn gather_ptx(dtype: Dtype, widen: Widen) -> (String, String) {
    // Bytes per stored token as a shift; tokens per 16 bytes as a shift.
    let (load, shift_in, per_shift) = match dtype {
        Dtype::U16 => ("u16", 1, 3),
        Dtype::U32 => ("u32", 2, 2),
    };
    let (shift_out, name_out) = match (widen, dtype) {
        (Widen::I64, _) => (3, "i64"),
        (Widen::I32, _) => (2, "i32"),
        (Widen::None, Dtype::U16) => (1, "u16"),
        (Widen::None, Dtype::U32) => (2, "u32"),
    };
    let out_bytes = 1u32 << shift_out;
    // Stores the token in %v (zero-extended to 32 bits) at [addr+offset].
    let store = |addr: &str, offset: u32| -> String {
        let at = if offset == 0 {
            format!("[{addr}]")
        } else {
            format!("[{addr}+{offset}]")
        };
        match shift_out {
            3 => format!("cvt.u64.u32 %a20, %v;\n    st.global.u64 {at}, %a20;"),
            2 => format!("st.global.u32 {at}, %v;"),
            _ => format!("cvt.u16.u32 %h, %v;\n    st.global.u16 {at}, %h;"),
        }
    };
    // Copies token %a14 of the row alone.
    let scalar = {
        let widen_in = match dtype {
            Dtype::U16 => "ld.global.u16 %h, [%a18];\n    cvt.u32.u16 %v, %h;",
            Dtype::U32 => "ld.global.u32 %v, [%a18];",
        };
        format!(
            "shl.b64 %a18, %a14, {shift_in};\n    add.u64 %a18, %a6, %a18;\n    {widen_in}\n    \
             shl.b64 %a19, %a14, {shift_out};\n    add.u64 %a19, %a7, %a19;\n    {}",
            store("%a19", 0)
        )
    };
    // Writes the tokens of the 16 bytes in %x0..%x3 from [%a17] on.
    let mut body = String::new();
    for k in 0..4u32 {
        match dtype {
            Dtype::U16 => {
                body += &format!(
                    "and.b32 %v, %x{k}, 65535;\n    {}\n    ",
                    store("%a17", 2 * k * out_bytes)
                );
                body += &format!(
                    "shr.u32 %v, %x{k}, 16;\n    {}\n    ",
                    store("%a17", (2 * k + 1) * out_bytes)
                );
            }
            Dtype::U32 => {
                body += &format!(
                    "mov.b32 %v, %x{k};\n    {}\n    ",
                    store("%a17", k * out_bytes)
                );
            }
        }
    }
    let name = format!("prep_gather_{load}_{name_out}");
    let ptx = format!(
        r#".version 7.0
.target sm_52
.address_size 64

.visible .entry {name}(
    .param .u64 addrs,
    .param .u64 dst,
    .param .u64 row
)
{{
    .reg .pred %p;
    .reg .b16 %h;
    .reg .b32 %x<4>, %v, %r<4>;
    .reg .b64 %a<24>;

    ld.param.u64 %a1, [addrs];
    ld.param.u64 %a2, [dst];
    ld.param.u64 %a3, [row];
    cvta.to.global.u64 %a1, %a1;
    cvta.to.global.u64 %a2, %a2;
    // The row's address, and where it goes.
    mov.u32 %r1, %ctaid.x;
    cvt.u64.u32 %a4, %r1;
    shl.b64 %a5, %a4, 3;
    add.u64 %a5, %a1, %a5;
    ld.global.u64 %a6, [%a5];
    cvta.to.global.u64 %a6, %a6;
    mul.lo.u64 %a7, %a4, %a3;
    shl.b64 %a7, %a7, {shift_out};
    add.u64 %a7, %a2, %a7;
    mov.u32 %r2, %tid.x;
    cvt.u64.u32 %a8, %r2;
    mov.u32 %r3, %ntid.x;
    cvt.u64.u32 %a9, %r3;
    // a10: the first 16-byte boundary; a11: tokens before it; a12: whole
    // 16 bytes after it; a13: the first token after those.
    add.u64 %a10, %a6, 15;
    and.b64 %a10, %a10, -16;
    sub.u64 %a11, %a10, %a6;
    shr.u64 %a11, %a11, {shift_in};
    min.u64 %a11, %a11, %a3;
    sub.u64 %a12, %a3, %a11;
    shl.b64 %a12, %a12, {shift_in};
    shr.u64 %a12, %a12, 4;
    shl.b64 %a13, %a12, {per_shift};
    add.u64 %a13, %a13, %a11;
    // The head: token t, for t below a11.
    setp.lt.u64 %p, %a8, %a11;
    @!%p bra TAIL;
    mov.u64 %a14, %a8;
    {scalar}
TAIL:
    // The tail: token a13 + t, while below the row's length.
    add.u64 %a14, %a13, %a8;
    setp.lt.u64 %p, %a14, %a3;
    @!%p bra BODY;
    {scalar}
BODY:
    mov.u64 %a15, %a8;
LOOP:
    setp.ge.u64 %p, %a15, %a12;
    @%p bra DONE;
    shl.b64 %a16, %a15, 4;
    add.u64 %a16, %a10, %a16;
    ld.global.v4.u32 {{%x0, %x1, %x2, %x3}}, [%a16];
    shl.b64 %a17, %a15, {per_shift};
    add.u64 %a17, %a17, %a11;
    shl.b64 %a17, %a17, {shift_out};
    add.u64 %a17, %a7, %a17;
    {body}add.u64 %a15, %a15, %a9;
    bra LOOP;
DONE:
    ret;
}}
"#
    );
    (name, ptx)
}

/// The widening kernel for `dtype` into `widen` as PTX text (loaded by the
/// driver, which compiles it for the GPU at hand; no NVRTC needed): thread
/// `i` reads token `i` and writes it zero-extended.
fn widen_ptx(dtype: Dtype, widen: Widen) -> (String, String) {
    let (load, shift_in, reg_in) = match dtype {
        Dtype::U16 => ("u16", 1, "%h"),
        Dtype::U32 => ("u32", 2, "%w"),
    };
    let (store, shift_out, name_out) = match widen {
        Widen::I64 => ("u64", 3, "i64"),
        _ => ("u32", 2, "i32"),
    };
    let name = format!("prep_widen_{load}_{name_out}");
    let convert = match (load, store) {
        ("u16", "u64") => "cvt.u64.u16 %rd8, %h;\n    st.global.u64 [%rd9], %rd8;",
        ("u32", "u64") => "cvt.u64.u32 %rd8, %w;\n    st.global.u64 [%rd9], %rd8;",
        ("u16", _) => "cvt.u32.u16 %v, %h;\n    st.global.u32 [%rd9], %v;",
        _ => "mov.u32 %v, %w;\n    st.global.u32 [%rd9], %v;",
    };
    let ptx = format!(
        r#".version 7.0
.target sm_52
.address_size 64

.visible .entry {name}(
    .param .u64 src,
    .param .u64 dst,
    .param .u64 n
)
{{
    .reg .pred %p;
    .reg .b16 %h;
    .reg .b32 %w, %v, %r<4>;
    .reg .b64 %rd<10>;

    ld.param.u64 %rd1, [src];
    ld.param.u64 %rd2, [dst];
    ld.param.u64 %rd3, [n];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mul.wide.u32 %rd4, %r1, %r2;
    cvt.u64.u32 %rd5, %r3;
    add.u64 %rd4, %rd4, %rd5;
    setp.ge.u64 %p, %rd4, %rd3;
    @%p bra DONE;
    shl.b64 %rd6, %rd4, {shift_in};
    add.u64 %rd7, %rd1, %rd6;
    ld.global.{load} {reg_in}, [%rd7];
    shl.b64 %rd6, %rd4, {shift_out};
    add.u64 %rd9, %rd2, %rd6;
    {convert}
DONE:
    ret;
}}
"#
    );
    (name, ptx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_are_named_and_typed_for_each_case() {
        for (dtype, widen, load, store) in [
            (Dtype::U16, Widen::I64, "ld.global.u16", "st.global.u64"),
            (Dtype::U32, Widen::I64, "ld.global.u32", "st.global.u64"),
            (Dtype::U16, Widen::I32, "ld.global.u16", "st.global.u32"),
            (Dtype::U32, Widen::I32, "ld.global.u32", "st.global.u32"),
        ] {
            let (name, ptx) = widen_ptx(dtype, widen);
            assert!(ptx.contains(&format!(".entry {name}(")), "{ptx}");
            assert!(ptx.contains(load) && ptx.contains(store), "{ptx}");
        }
    }

    #[test]
    fn gather_kernels_load_the_stored_type_and_store_the_asked_one() {
        for (dtype, widen, load, store) in [
            (Dtype::U16, Widen::I64, "ld.global.u16", "st.global.u64"),
            (Dtype::U32, Widen::I64, "ld.global.u32", "st.global.u64"),
            (Dtype::U16, Widen::I32, "ld.global.u16", "st.global.u32"),
            (Dtype::U32, Widen::I32, "ld.global.u32", "st.global.u32"),
            (Dtype::U16, Widen::None, "ld.global.u16", "st.global.u16"),
            (Dtype::U32, Widen::None, "ld.global.u32", "st.global.u32"),
        ] {
            let (name, ptx) = gather_ptx(dtype, widen);
            assert!(ptx.contains(&format!(".entry {name}(")), "{ptx}");
            assert!(ptx.contains(load) && ptx.contains(store), "{ptx}");
        }
        assert!(gather_launch(0).is_ok() && gather_launch(1 << 31).is_err());
    }

    #[test]
    fn a_copy_plan_copies_each_row_to_its_place_in_the_batch() {
        let row = 4100usize;
        let base = 1 << 40;
        // Rows 7 and 8 of a shard lie one after another: still two copies.
        let at = |r: u64| (1u64 << 32) + r * row as u64;
        let order = [7u64, 8, 3, 21, 20];
        let addresses: Vec<u8> = order.iter().flat_map(|&r| at(r).to_le_bytes()).collect();
        let plan = CopyPlan::new(&addresses, base, row);
        assert_eq!(plan.srcs, order.map(at).to_vec());
        assert_eq!(plan.sizes, vec![row; order.len()]);
        let dsts: Vec<u64> = (0..order.len() as u64)
            .map(|k| base + k * row as u64)
            .collect();
        assert_eq!(plan.dsts, dsts);
        assert_eq!(CopyPlan::new(&[], base, row).sizes, Vec::<usize>::new());
    }

    #[test]
    fn memcpy_attributes_have_the_drivers_layout() {
        // CUmemcpyAttributes: an enum, two CUmemLocation (enum, int), a uint.
        assert_eq!(std::mem::size_of::<MemcpyAttributes>(), 24);
        assert_eq!(std::mem::align_of::<MemcpyAttributes>(), 4);
        assert_eq!(std::mem::offset_of!(MemcpyAttributes, src_loc_hint), 4);
        assert_eq!(std::mem::offset_of!(MemcpyAttributes, dst_loc_hint), 12);
        assert_eq!(std::mem::offset_of!(MemcpyAttributes, flags), 20);
    }

    #[test]
    fn widen_launch_covers_2_pow_32_tokens_without_truncating() {
        for n in [
            0u64,
            1,
            255,
            256,
            257,
            (1 << 32) - 1,
            1 << 32,
            (1 << 32) + 1,
            (1 << 39) - 256,
        ] {
            let c = widen_launch(n).unwrap();
            let (grid, block) = (u64::from(c.grid_dim.0), u64::from(c.block_dim.0));
            assert!(grid * block >= n, "{n} tokens: the grid covers them all");
            assert!(n == 0 || (grid - 1) * block < n, "{n}: no idle block");
        }
        assert!(widen_launch(1 << 40).is_err(), "too many for one launch");
    }

    #[test]
    fn id_types_describe_themselves_for_dlpack_and_the_array_interface() {
        assert_eq!(IdType::of(Dtype::U16, Widen::I64), IdType::I64);
        assert_eq!(IdType::of(Dtype::U32, Widen::I32), IdType::I32);
        assert_eq!(IdType::of(Dtype::U16, Widen::None), IdType::U16);
        for t in [IdType::U16, IdType::U32, IdType::I32, IdType::I64] {
            let (code, bits, lanes) = t.dlpack();
            assert_eq!(usize::from(bits) / 8, t.size());
            assert_eq!(lanes, 1);
            let signed = t.typestr().starts_with("<i");
            assert_eq!(code == 0, signed, "{t:?}");
            assert!(t.typestr().ends_with(&t.size().to_string()));
        }
    }

    #[test]
    fn no_driver_is_an_error_not_a_panic() {
        if driver_present() {
            return; // a machine with a GPU: tests/it/gpu.rs covers it
        }
        let err = CudaBackend::new(0, Dtype::U16, Widen::I64).err().unwrap();
        assert!(err.to_string().contains("no CUDA driver"), "{err}");
        assert_eq!(
            device_count().unwrap(),
            0,
            "no driver: no device, not an error"
        );
    }
}
