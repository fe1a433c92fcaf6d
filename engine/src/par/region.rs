//! Parallel regions in which the calling thread takes part. In the browser the engine runs
//! on its own Web Worker, and wasm-bindgen-rayon's pool threads are other workers: rayon
//! runs a region started there entirely on its workers while the caller blocks on a
//! mutex-and-condvar latch, and every wake-up on the way (the sleeping workers, the latch,
//! the latch's contended mutex) is a futex call through the browser
//! (`Atomics.wait`/`notify`), several per region and about 80 regions per decoded token.
//! Natively the caller is a pool worker, but a rayon region still wakes the other workers,
//! asleep since the last one (a futex call, and in a virtual machine the host's wake-up
//! of an idle CPU): tens of microseconds, a quarter of the time of a lone 1.2 MB int4
//! matrix at two threads (qdot_bench).
//!
//! Here the caller claims tasks itself and `threads - 1` helper jobs on the pool claim the
//! rest. A helper that runs out of tasks polls for the next region for a while (about a
//! millisecond; natively spinning for the first 50 microseconds, then yielding its CPU
//! between polls) before it gives its worker back to rayon, so the regions of one decode
//! step (a few to tens of microseconds apart) need no wake-up at all; the caller waits for
//! the helpers' last tasks spinning, then parked. Each task is one call of the same body,
//! so results do not depend on which thread ran it.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// The one region in flight: its tasks are claimed through `word` = epoch (32 bits) | n
/// (16 bits) | next task (16 bits), so a claim can only succeed for the region that is
/// current, and while it is, its caller is waiting for that task.
struct Team {
    /// A caller owns the team (a region started inside a task runs on rayon instead).
    busy: AtomicBool,
    word: AtomicU64,
    done: AtomicUsize,
    /// The current region's body: a pointer to the caller's `&dyn Fn`, on its stack. Read
    /// only after a claim succeeded, when [`run`] cannot have returned (it waits for the
    /// claimed task).
    body: AtomicPtr<Body<'static>>,
    /// Helpers in their polling loop.
    helpers: AtomicUsize,
    /// Set by [`rest`]: polling helpers leave now; cleared when a region starts.
    rest: AtomicBool,
    /// Set when the caller stopped spinning and parks: the last task unparks it.
    parked: AtomicBool,
    /// The thread of the current region's caller (set by [`run`] while it owns the team).
    caller: std::sync::Mutex<Option<std::thread::Thread>>,
}

type Body<'a> = &'a (dyn Fn(usize) + Sync);

static TEAM: Team = Team {
    busy: AtomicBool::new(false),
    word: AtomicU64::new(0),
    done: AtomicUsize::new(0),
    body: AtomicPtr::new(std::ptr::null_mut()),
    helpers: AtomicUsize::new(0),
    rest: AtomicBool::new(false),
    parked: AtomicBool::new(false),
    caller: std::sync::Mutex::new(None),
};

/// Most tasks in one region (16 bits of `word`); larger ones run on rayon.
pub(crate) const MAX_TASKS: usize = u16::MAX as usize;

/// Polls of an idle helper before it returns its worker to rayon, and of the caller
/// before it parks, in the browser (an atomic load each: on the order of a millisecond).
#[cfg(target_arch = "wasm32")]
const SPINS: u32 = 1 << 18;

/// Natively, how long an idle helper or a waiting caller spins before it starts yielding
/// its CPU between polls, and how long a helper polls in all before it returns its worker
/// to rayon. A count of polls would not do: a `pause` takes 10 cycles on some x86 CPUs and
/// 140 on others, and a helper that spun for milliseconds while the caller waited for an
/// expert's read took the CPU the reader threads needed (`coli serve` streaming experts on
/// 2 cores: docs/benchmarks.md, "Parallel regions that do not sleep").
#[cfg(not(target_arch = "wasm32"))]
const SPIN: Duration = Duration::from_micros(50);
#[cfg(not(target_arch = "wasm32"))]
const IDLE: Duration = Duration::from_micros(1000);

/// The waiting of an idle helper or of a caller whose tasks are all claimed: [`Idle::poll`]
/// once per unsuccessful look, [`Idle::reset`] after work came.
struct Idle {
    polls: u32,
    #[cfg(not(target_arch = "wasm32"))]
    since: Option<std::time::Instant>,
}

impl Idle {
    fn new() -> Self {
        Idle {
            polls: 0,
            #[cfg(not(target_arch = "wasm32"))]
            since: None,
        }
    }

    fn reset(&mut self) {
        *self = Idle::new();
    }

    /// Waits a little; false when the waiting has lasted long enough to stop polling.
    fn poll(&mut self) -> bool {
        self.polls = self.polls.saturating_add(1);
        #[cfg(target_arch = "wasm32")]
        {
            std::hint::spin_loop();
            self.polls < SPINS
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            // The first polls without reading the clock: most waits are that short.
            if self.polls < 64 {
                std::hint::spin_loop();
                return true;
            }
            let waited = self.since.get_or_insert_with(std::time::Instant::now).elapsed();
            if waited < SPIN {
                std::hint::spin_loop();
            } else if waited < IDLE {
                std::thread::yield_now();
            } else {
                return false;
            }
            true
        }
    }
}

fn unpack(w: u64) -> (u64, usize, usize) {
    (w >> 32, ((w >> 16) & 0xffff) as usize, (w & 0xffff) as usize)
}

impl Team {
    /// Claims one task of the current region and runs it; false when there was none.
    fn run_one(&self) -> bool {
        let mut w = self.word.load(Ordering::Acquire);
        let (n, i) = loop {
            let (_, n, i) = unpack(w);
            if i >= n {
                return false;
            }
            match self.word.compare_exchange_weak(w, w + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break (n, i),
                Err(now) => w = now,
            }
        };
        // SAFETY: the claim succeeded, so the region is current and its caller waits in
        // `run` for task i: the body it published is alive.
        let body = unsafe { &*self.body.load(Ordering::Acquire) };
        body(i);
        if self.done.fetch_add(1, Ordering::AcqRel) + 1 == n && self.parked.load(Ordering::SeqCst) {
            if let Some(t) = self.caller.lock().ok().and_then(|c| c.clone()) {
                t.unpark();
            }
        }
        true
    }

    /// A helper: runs tasks as regions come, until none came for a while ([`Idle`]).
    fn help(&self) {
        let mut idle = Idle::new();
        loop {
            if self.run_one() {
                idle.reset();
            } else if self.rest.load(Ordering::Relaxed) || !idle.poll() {
                break;
            }
        }
        self.helpers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Sends the polling helpers back to the pool (they leave at their next look; the next
/// region starts new ones): the caller is about to block, on an expert's read, and
/// polling would take the CPU that the reader threads need.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn rest() {
    if TEAM.helpers.load(Ordering::Relaxed) > 0 {
        TEAM.rest.store(true, Ordering::Relaxed);
    }
}

/// Aborts if a task unwinds through [`run`] on the calling thread: the helpers may still
/// be running tasks that borrow the caller's stack.
struct AbortOnUnwind;

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        if std::thread::panicking() {
            std::process::abort();
        }
    }
}

/// Runs `body(i)` once for every `i < n` on this thread and on up to `helpers` jobs of
/// rayon's global pool. False (nothing run) when the team is in use (a region inside a
/// task) or `n` is above [`MAX_TASKS`]: the caller then runs the region on rayon. The
/// caller may be a pool worker (the helpers then run on the pool's other workers; while it
/// waits for them it runs no other rayon job) or outside the pool.
pub(crate) fn run(n: usize, helpers: usize, body: Body<'_>) -> bool {
    if n > MAX_TASKS || TEAM.busy.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
        return false;
    }
    let guard = AbortOnUnwind;
    let team = &TEAM;
    if let Ok(mut c) = team.caller.lock() {
        if c.as_ref().map(|t| t.id()) != Some(std::thread::current().id()) {
            *c = Some(std::thread::current());
        }
    }
    let slot: *const Body<'_> = &body;
    // SAFETY: only the lifetime changes; `Team::body` says why no use outlives it.
    team.body.store(unsafe { std::mem::transmute::<*const Body<'_>, *mut Body<'static>>(slot) }, Ordering::Release);
    team.done.store(0, Ordering::Release);
    team.parked.store(false, Ordering::Release);
    team.rest.store(false, Ordering::Relaxed);
    let epoch = (unpack(team.word.load(Ordering::Acquire)).0 + 1) & 0xffff_ffff;
    team.word.store(epoch << 32 | (n as u64) << 16, Ordering::Release);
    // Helpers still polling from the last region take part at once; the missing ones start.
    let want = helpers.min(n.saturating_sub(1));
    while team.helpers.load(Ordering::Acquire) < want {
        team.helpers.fetch_add(1, Ordering::AcqRel);
        rayon::spawn(|| TEAM.help());
    }
    while team.run_one() {}
    let mut idle = Idle::new();
    let mut parked = false;
    while team.done.load(Ordering::Acquire) < n {
        if parked || !idle.poll() {
            parked = true;
            team.parked.store(true, Ordering::SeqCst);
            if team.done.load(Ordering::SeqCst) < n {
                std::thread::park_timeout(Duration::from_micros(500));
            }
        }
    }
    team.busy.store(false, Ordering::Release);
    drop(guard);
    true
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use super::*;

    #[test]
    fn every_task_runs_once() {
        // From one thread outside the pool, as the browser engine's worker is.
        std::thread::scope(|s| {
            s.spawn(|| {
                for n in [0usize, 1, 2, 7, 64, 1000] {
                    for helpers in [0usize, 1, 2, 5] {
                        let counts: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
                        let ran = run(n, helpers, &|i| {
                            counts[i].fetch_add(1, Ordering::Relaxed);
                        });
                        assert!(ran);
                        assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1), "n {n} helpers {helpers}");
                    }
                }
                // A region inside a task does not take the team.
                assert!(run(2, 1, &|_| assert!(!run(1, 1, &|_| {}))));
                assert!(!run(MAX_TASKS + 1, 1, &|_| {}));
            });
        });
    }

    #[test]
    fn regions_after_the_helpers_were_sent_to_rest_run_every_task() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("pool");
        for round in 0..20u32 {
            let counts: Vec<AtomicU32> = (0..50).map(|_| AtomicU32::new(0)).collect();
            let count = |i: usize| {
                counts[i].fetch_add(1, Ordering::Relaxed);
                if i.is_multiple_of(7) {
                    rest();
                }
            };
            if round.is_multiple_of(2) {
                rest();
            }
            let ran = (0..1000).any(|_| {
                let ran = pool.install(|| run(50, 1, &count));
                if !ran {
                    std::thread::sleep(Duration::from_millis(1));
                }
                ran
            });
            assert!(ran, "round {round}: the team stayed busy");
            assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1), "round {round}");
        }
    }

    #[test]
    fn a_pool_worker_and_then_another_thread_can_call() {
        // Natively the caller is a worker of the pool whose other workers help.
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("pool");
        for round in 0..3 {
            let counts: Vec<AtomicU32> = (0..37).map(|_| AtomicU32::new(0)).collect();
            let count = |i: usize| {
                counts[i].fetch_add(1, Ordering::Relaxed);
            };
            let call = || {
                if round == 1 {
                    std::thread::scope(|s| s.spawn(|| run(37, 1, &count)).join().expect("thread"))
                } else {
                    pool.install(|| run(37, 1, &count))
                }
            };
            // The team may be held by a test running beside this one for a moment.
            let ran = (0..1000).any(|_| {
                let ran = call();
                if !ran {
                    std::thread::sleep(Duration::from_millis(1));
                }
                ran
            });
            assert!(ran, "round {round}: the team stayed busy");
            assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1), "round {round}");
        }
    }
}
