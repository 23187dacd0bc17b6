//! The CUDA backend of the loader (feature `cuda`): pinned staging buffers,
//! asynchronous host-to-device copies on the loader's own stream, optional
//! widening of the ids on the device, and events as fences.
//!
//! cudarc loads the driver library at run time (feature `dynamic-loading`),
//! so prep builds without a CUDA toolkit; [`CudaBackend::new`] checks that
//! the library is there before touching it (cudarc panics when it is not)
//! and returns an error instead.
//!
//! Staging buffers come from `cuMemHostAlloc` with the write-combined flag
//! (cudarc's default for pinned memory). Write-combined memory is fast to
//! write and to copy over PCIe but very slow for the CPU to read; the
//! loader only ever writes each staging buffer once per batch (the row
//! gather) and never reads it back, which is the access it suits.
//!
//! This is the crate's second place with `unsafe` (the first is
//! `format::mmap`): calls into the CUDA driver that the compiler cannot check.

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PinnedHostSlice,
    PushKernelArg,
};

use super::{Backend, LoaderError};
use crate::format::Dtype;

/// The ids as the consumer receives them on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Widen {
    /// As stored: 2 or 4 bytes per token.
    None,
    /// Widened on the device to int32.
    I32,
    /// Widened on the device to int64 (what `torch.nn.Embedding` takes).
    I64,
}

/// Copies batches into the memory of one GPU.
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    dtype: Dtype,
    widen: Widen,
    kernel: Option<CudaFunction>,
    /// Copy events the consumer is done with, recorded again by the next
    /// copies: after the first `depth` steps no event is created.
    events: std::sync::Mutex<Vec<CudaEvent>>,
}

/// A pinned, write-combined host buffer.
pub struct Staging {
    host: PinnedHostSlice<u8>,
}

/// A batch's device memory: the staged bytes, and the widened ids when
/// widening is on.
pub struct Target {
    raw: CudaSlice<u8>,
    wide: Option<CudaSlice<u8>>,
}

impl Target {
    /// The ids as the consumer reads them: the widened buffer (int32 or
    /// int64 per token) when widening is on, else the raw tokens.
    pub fn ids(&self) -> &CudaSlice<u8> {
        self.wide.as_ref().unwrap_or(&self.raw)
    }
}

fn driver_error(what: &str) -> impl Fn(cudarc::driver::DriverError) -> LoaderError + '_ {
    move |e| LoaderError::Backend(format!("CUDA: {what}: {e}"))
}

/// True when the CUDA driver library can be loaded on this machine.
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the shared library (dlopen) and reports
    // whether it could; no driver function is called.
    unsafe { cudarc::driver::sys::is_culib_present() }
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
        let count = CudaContext::device_count().map_err(driver_error("counting devices"))?;
        if ordinal >= count.max(0) as usize {
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
            stream,
            dtype,
            widen,
            kernel,
            events: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// The context, for the consumer's own streams.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The loader's copy stream.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    fn wide_bytes(&self) -> usize {
        match self.widen {
            Widen::None => 0,
            Widen::I32 => 4,
            Widen::I64 => 8,
        }
    }
}

impl Backend for CudaBackend {
    type Staging = Staging;
    type Target = Target;
    type Fence = CudaEvent;

    fn alloc_staging(&self, bytes: usize) -> Result<Staging, LoaderError> {
        // SAFETY: the memory is uninitialised until the first batch is
        // gathered into it; it is never read before then (the copy of a
        // partial last batch reads stale bytes past the rows, which the
        // consumer does not look at, but never uninitialised ones: `fill`
        // zeroes the buffer once, below).
        let mut host = unsafe { self.ctx.alloc_pinned::<u8>(bytes) }
            .map_err(driver_error("allocating pinned memory"))?;
        host.as_mut_slice()
            .map_err(driver_error("writing pinned memory"))?
            .fill(0);
        Ok(Staging { host })
    }

    fn alloc_target(&self, bytes: usize) -> Result<Target, LoaderError> {
        let raw = self
            .stream
            .alloc_zeros::<u8>(bytes)
            .map_err(driver_error("allocating device memory"))?;
        let wide = match self.widen {
            Widen::None => None,
            _ => Some(
                self.stream
                    .alloc_zeros::<u8>(bytes / self.dtype.size() * self.wide_bytes())
                    .map_err(driver_error("allocating device memory"))?,
            ),
        };
        Ok(Target { raw, wide })
    }

    fn fill<'a>(&self, staging: &'a mut Staging) -> Result<&'a mut [u8], LoaderError> {
        // Waits for the last copy out of this buffer (cudarc records an
        // event on the pinned slice at every copy).
        staging
            .host
            .as_mut_slice()
            .map_err(driver_error("waiting for a staging buffer"))
    }

    fn copy(
        &self,
        staging: &mut Staging,
        target: &mut Target,
        _bytes: usize,
        after: Option<CudaEvent>,
    ) -> Result<CudaEvent, LoaderError> {
        if let Some(done) = after {
            // The consumer's last work on this target, ordered on the
            // device: a stream wait, not a host sync.
            self.stream
                .wait(&done)
                .map_err(driver_error("ordering after the consumer"))?;
        }
        // The whole buffer, always: a partial last batch copies stale bytes
        // past its rows, and the pinned slice's own event then covers it.
        self.stream
            .memcpy_htod(&staging.host, &mut target.raw)
            .map_err(driver_error("copying a batch to the device"))?;
        if let (Some(kernel), Some(wide)) = (&self.kernel, target.wide.as_mut()) {
            let n = (target.raw.len() / self.dtype.size()) as u64;
            let config = LaunchConfig::for_num_elems(n as u32);
            let mut launch = self.stream.launch_builder(kernel);
            launch.arg(&target.raw).arg(wide).arg(&n);
            // SAFETY: the kernel reads `n` tokens of the dtype it was built
            // for from `raw` (exactly its length) and writes `n` ids of the
            // widened size into `wide` (allocated for that many), and does
            // nothing for threads at or past `n`.
            unsafe { launch.launch(config) }.map_err(driver_error("widening the ids"))?;
        }
        // A spent event can be recorded again: a stream that waited on it
        // waited on the work recorded then, not on what is recorded now.
        let spent = self.events.lock().ok().and_then(|mut e| e.pop());
        match spent {
            Some(event) => {
                event
                    .record(&self.stream)
                    .map_err(driver_error("recording the copy's event"))?;
                Ok(event)
            }
            None => self
                .stream
                .record_event(Some(
                    cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING,
                ))
                .map_err(driver_error("recording the copy's event")),
        }
    }

    fn recycle(&self, fence: CudaEvent) {
        if let Ok(mut events) = self.events.lock() {
            events.push(fence);
        }
    }
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
    fn no_driver_is_an_error_not_a_panic() {
        if driver_present() {
            return; // a machine with a GPU: tests/gpu.rs covers it
        }
        let err = CudaBackend::new(0, Dtype::U16, Widen::I64).err().unwrap();
        assert!(err.to_string().contains("no CUDA driver"), "{err}");
    }
}
