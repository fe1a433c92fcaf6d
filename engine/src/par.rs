//! The engine's parallel regions, below every kernel that uses them (`qdot`, `kernels`,
//! the model's attention and DeltaNet): how many threads, a region in which the calling
//! thread takes part (`joined`, `region::run`), and the
//! output pointer the tasks of one region share (`OutPtr`).

#[cfg(feature = "parallel")]
mod region;

/// Whether a parallel region started here runs on [`region::run`], this thread taking part
/// and the pool's other threads polling for the next region instead of sleeping. In the
/// browser (wasm) when the engine's worker is outside the pool, where every blocking
/// hand-off is a futex call through the browser. Natively always (the caller is usually a
/// pool worker: the helper's `flags::on_pool`; the team's helpers are then the other
/// workers): with rayon's regions, which wake the other worker each time, two threads
/// read a lone 1024 x 2048 int4 matrix (1.2 MB, some 80 microseconds of work) at 14.7 GB/s
/// where one read 14.4, and at 20.8 on the team (qdot_bench, Intel Xeon, 2 cores;
/// docs/benchmarks.md).
/// `COLIBRI_PAR=rayon` keeps rayon's regions natively (for comparison).
#[cfg(feature = "parallel")]
fn caller_joins() -> bool {
    if cfg!(target_arch = "wasm32") {
        return rayon::current_thread_index().is_none();
    }
    static RAYON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    !*RAYON.get_or_init(|| std::env::var("COLIBRI_PAR").is_ok_and(|v| v.trim() == "rayon"))
}

/// Runs `body(i)` for every `i < n` with this thread taking part ([`region::run`]) when
/// [`caller_joins`]; false when it did not run (the caller then starts its rayon region).
#[cfg(feature = "parallel")]
pub(crate) fn joined(n: usize, body: &(dyn Fn(usize) + Sync)) -> bool {
    threads() > 1 && caller_joins() && region::run(n, threads() - 1, body)
}

/// Says that this thread is about to block for a while (an expert's read): the threads
/// polling for its next parallel region give their CPUs back instead ([`region::rest`]).
/// Native: the browser reads experts without blocking its engine worker.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn rest() {
    #[cfg(feature = "parallel")]
    region::rest();
}

/// Number of threads the parallel kernels may use.
pub fn threads() -> usize {
    #[cfg(feature = "parallel")]
    {
        rayon::current_num_threads()
    }
    #[cfg(not(feature = "parallel"))]
    {
        1
    }
}

/// Output pointer shared by the tasks of one parallel region ([`matmul_many`]'s outputs,
/// the chunks of a slice).
pub(crate) struct OutPtr<T = f32>(pub(crate) *mut T);
// SAFETY: the tasks of a region write disjoint elements (distinct (job, row) pairs,
// distinct chunks) of outputs that outlive the region, and nothing reads them until it ends.
unsafe impl<T> Send for OutPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for OutPtr<T> {}

impl<T> Clone for OutPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for OutPtr<T> {}

impl<T> OutPtr<T> {
    /// Elements `start..start + len` (a method, so that closures capture the whole
    /// `OutPtr`).
    ///
    /// SAFETY (caller): they lie inside the pointed-to slice, and no other task of the
    /// region touches them while the returned slice lives.
    #[cfg(feature = "parallel")]
    pub(crate) unsafe fn slice<'a>(self, start: usize, len: usize) -> &'a mut [T] {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(start), len) }
    }
}
