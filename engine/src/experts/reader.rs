//! The I/O side of the native expert cache: a bounded pool of reader threads that load
//! experts while the MoE block computes the resident ones, a pool of 4 KiB-aligned
//! buffers (what O_DIRECT needs, and reused so a miss does not allocate), and the slot a
//! finished read is handed over in.
//!
//! Threads exist only natively; on wasm32 the cache reads synchronously and this module
//! is not compiled.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::error::{Error, Result};

/// Alignment of expert buffers: the container's expert alignment and the page size.
pub const ALIGN: usize = crate::hugemem::PAGE;

/// A zeroed, `ALIGN`-aligned buffer (crate::hugemem: its own mapping on unix, so an
/// evicted expert's memory goes back to the system at once instead of lingering in a malloc
/// arena, which would let RSS creep above the budget; 2 MiB-aligned and advised for huge
/// pages when at least that long).
pub struct AlignedBuf {
    ptr: *mut u8,
    cap: usize,
    /// Bytes that hold data (the rest is padding up to `cap`).
    len: usize,
    pool: Option<Arc<BufferPool>>,
}

// SAFETY: the buffer is uniquely owned heap memory, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access is read-only (`AsRef<[u8]>`).
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    fn alloc(cap: usize) -> Result<Self> {
        let cap = cap.max(1).div_ceil(ALIGN) * ALIGN;
        let ptr = crate::hugemem::alloc(cap)?;
        Ok(AlignedBuf { ptr, cap, len: 0, pool: None })
    }

    /// The whole buffer, padding included (a multiple of `ALIGN` bytes).
    pub fn full_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr points to cap initialised (zeroed) bytes owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.cap) }
    }

    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.cap);
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: ptr points to cap >= len initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            if pool.give_back(self.ptr, self.cap) {
                return;
            }
        }
        crate::hugemem::free(self.ptr, self.cap)
    }
}

/// Free aligned buffers of one size class, so that evicting one expert and reading the
/// next reuses memory instead of going back to the allocator. Holds at most `keep`.
pub struct BufferPool {
    free: Mutex<Vec<(usize, usize)>>,
    keep: usize,
}

impl BufferPool {
    pub fn new(keep: usize) -> Arc<Self> {
        Arc::new(BufferPool { free: Mutex::new(Vec::new()), keep })
    }

    /// A buffer of at least `len` bytes (rounded up to `ALIGN`), contents unspecified.
    pub fn take(self: &Arc<Self>, len: usize) -> Result<AlignedBuf> {
        let cap = len.max(1).div_ceil(ALIGN) * ALIGN;
        let reuse = {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            free.iter().position(|&(_, c)| c == cap).map(|i| free.swap_remove(i))
        };
        let mut buf = match reuse {
            Some((p, c)) => AlignedBuf { ptr: p as *mut u8, cap: c, len: 0, pool: None },
            None => AlignedBuf::alloc(cap)?,
        };
        buf.pool = Some(self.clone());
        buf.len = len;
        Ok(buf)
    }

    /// Keeps the allocation for reuse; false if the pool is full (the caller frees it).
    fn give_back(&self, ptr: *mut u8, cap: usize) -> bool {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() >= self.keep {
            return false;
        }
        free.push((ptr as usize, cap));
        true
    }
}

impl Drop for BufferPool {
    fn drop(&mut self) {
        let free = self.free.get_mut().unwrap_or_else(|e| e.into_inner());
        for &(p, cap) in free.iter() {
            crate::hugemem::free(p as *mut u8, cap);
        }
    }
}

/// Where one asynchronous read delivers its result; whoever needs it waits here. A read
/// still queued can be cancelled: its job then does nothing.
pub struct LoadSlot<T> {
    value: Mutex<Option<Result<T>>>,
    ready: Condvar,
    /// QUEUED, RUNNING or CANCELLED.
    state: AtomicU8,
}

const QUEUED: u8 = 0;
const RUNNING: u8 = 1;
const CANCELLED: u8 = 2;

impl<T> Default for LoadSlot<T> {
    fn default() -> Self {
        LoadSlot { value: Mutex::new(None), ready: Condvar::new(), state: AtomicU8::new(QUEUED) }
    }
}

impl<T> LoadSlot<T> {
    /// Called by the job before it reads: false if the read was cancelled while queued.
    pub fn begin(&self) -> bool {
        self.state.compare_exchange(QUEUED, RUNNING, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// Cancels the read if no reader has begun it (true: it will never read, and the slot
    /// is never filled, so only a slot nobody waits on may be cancelled).
    pub fn cancel(&self) -> bool {
        self.state.compare_exchange(QUEUED, CANCELLED, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    pub fn put(&self, v: Result<T>) {
        *self.value.lock().unwrap_or_else(|e| e.into_inner()) = Some(v);
        self.ready.notify_all();
    }

    pub fn is_ready(&self) -> bool {
        self.value.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    /// Blocks until the read is done and takes its result (once).
    pub fn wait(&self) -> Result<T> {
        let mut v = self.value.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(r) = v.take() {
                return r;
            }
            crate::par::rest();
            v = self.ready.wait(v).unwrap_or_else(|e| e.into_inner());
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

struct Queue {
    jobs: VecDeque<Job>,
    closed: bool,
}

/// A fixed number of threads running read jobs; urgent jobs (what the current layer
/// waits for) go before speculative ones (lookahead prefetches).
pub struct ReaderPool {
    queue: Arc<(Mutex<Queue>, Condvar)>,
    threads: Vec<JoinHandle<()>>,
}

impl ReaderPool {
    pub fn new(n: usize) -> Result<Self> {
        let queue = Arc::new((Mutex::new(Queue { jobs: VecDeque::new(), closed: false }), Condvar::new()));
        let mut threads = Vec::new();
        for i in 0..n.max(1) {
            let q = queue.clone();
            let t = std::thread::Builder::new()
                .name(format!("colibri-reader-{i}"))
                .spawn(move || loop {
                    let job = {
                        let mut g = q.0.lock().unwrap_or_else(|e| e.into_inner());
                        loop {
                            if let Some(j) = g.jobs.pop_front() {
                                break j;
                            }
                            if g.closed {
                                return;
                            }
                            g = q.1.wait(g).unwrap_or_else(|e| e.into_inner());
                        }
                    };
                    job();
                })
                .map_err(|e| Error::Invalid(format!("cannot start a reader thread: {e}")))?;
            threads.push(t);
        }
        Ok(ReaderPool { queue, threads })
    }

    pub fn threads(&self) -> usize {
        self.threads.len()
    }

    /// Queues `jobs` in order: at the front (before every waiting job) if `urgent`.
    pub fn submit(&self, jobs: Vec<Job>, urgent: bool) {
        if jobs.is_empty() {
            return;
        }
        let mut g = self.queue.0.lock().unwrap_or_else(|e| e.into_inner());
        if urgent {
            for j in jobs.into_iter().rev() {
                g.jobs.push_front(j);
            }
        } else {
            g.jobs.extend(jobs);
        }
        drop(g);
        self.queue.1.notify_all();
    }
}

impl Drop for ReaderPool {
    fn drop(&mut self) {
        self.queue.0.lock().unwrap_or_else(|e| e.into_inner()).closed = true;
        self.queue.1.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_and_reused() {
        let pool = BufferPool::new(2);
        let mut a = pool.take(5000).unwrap();
        assert_eq!(a.full_mut().len(), 8192);
        assert_eq!(a.as_ref().len(), 5000);
        assert_eq!(a.full_mut().as_ptr() as usize % ALIGN, 0);
        let p = a.full_mut().as_ptr();
        drop(a);
        let mut b = pool.take(6000).unwrap();
        assert_eq!(b.full_mut().as_ptr(), p);
        let c = pool.take(100).unwrap();
        assert_eq!(c.as_ref().len(), 100);
    }

    #[test]
    fn pool_runs_urgent_jobs_first_and_slots_deliver() {
        let pool = ReaderPool::new(1).unwrap();
        let gate = Arc::new(LoadSlot::<()>::default());
        let order = Arc::new(Mutex::new(Vec::new()));
        let g = gate.clone();
        // Block the only thread until every job is queued.
        pool.submit(vec![Box::new(move || g.wait().unwrap())], false);
        let mk = |i: u32| -> Job {
            let o = order.clone();
            Box::new(move || o.lock().unwrap().push(i))
        };
        pool.submit(vec![mk(1), mk(2)], false);
        pool.submit(vec![mk(3), mk(4)], true);
        let done = Arc::new(LoadSlot::<u32>::default());
        let d = done.clone();
        pool.submit(vec![Box::new(move || d.put(Ok(7)))], false);
        gate.put(Ok(()));
        assert_eq!(done.wait().unwrap(), 7);
        assert_eq!(*order.lock().unwrap(), vec![3, 4, 1, 2]);
    }
}
