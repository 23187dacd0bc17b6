//! Small helpers with no better home: thread counts, peak memory, panics
//! caught, a prefetch; and the format's timestamps, re-exported.

// The times a manifest records are the format's (prep_reader::time); the
// command line checks SOURCE_DATE_EPOCH through the same function.
pub use prep_reader::time::{created_time, now_rfc3339, source_date_epoch};

/// Worker threads for a `--threads` value: the value itself, or one per
/// core when it is 0.
pub(crate) fn thread_count(requested: usize) -> usize {
    if requested > 0 {
        requested
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

/// The process's peak resident memory in bytes (Linux `VmHWM`), if known.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

thread_local! {
    /// Set while [`catch_panic`] runs its closure on this thread.
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, turning a panic inside it into `Err(message)`: for calls into
/// a dependency that panics on malformed input (the Arrow IPC reader does,
/// on a buffer length past the end of its message) instead of returning an
/// error, so that a damaged input file is reported like any other bad input.
/// The panic's own message is not printed while `f` runs (a hook installed
/// once passes every other panic on to the hook before it).
pub fn catch_panic<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(std::cell::Cell::get) {
                previous(info);
            }
        }));
    });
    let was = QUIET.with(|q| q.replace(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was));
    result.map_err(|payload| {
        payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".into())
    })
}

/// Asks the CPU to fetch the first cache lines of `items` (and their
/// page's address translation) into its caches, for a read from there a
/// little later: for reads that jump from place to place in a large
/// mapping, where each new place would otherwise stall the copy. A hint
/// only, a no-op off x86-64; it never faults and changes no result.
#[inline]
pub fn prefetch<T>(items: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let bytes = std::mem::size_of_val(items);
        let start = items.as_ptr().cast::<i8>();
        // Two lines: a record rarely starts at a line's start.
        for at in [0, 64] {
            if at < bytes {
                // SAFETY: a prefetch reads nothing the program sees and
                // cannot fault; the address is inside `items`.
                unsafe { _mm_prefetch(start.add(at), _MM_HINT_T0) };
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = items;
}
