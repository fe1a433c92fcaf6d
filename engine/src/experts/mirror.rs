//! Two (or more) copies of a model's data file on different devices, read as one source
//! (`COLI_MODEL_MIRROR`, issue #34): each expert read goes to the copy expected to finish
//! it first — the bytes it already has in flight plus this read, over the speed measured
//! on its own reads so far — so the reads split by each device's speed. A copy that fails a
//! read is left out from then on (the caller hears why once) and the read is retried on
//! another; only when every copy fails is the read an error. The copies hold the same
//! bytes (the caller checks their manifests and sizes), so placement never changes output.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use super::source::ByteSource;
use crate::error::{Error, Result};

/// A copy and what its reads measured.
struct Copy {
    src: Box<dyn ByteSource>,
    bytes: AtomicU64,
    nanos: AtomicU64,
    in_flight: AtomicU64,
    failed: AtomicBool,
    /// The read count of the mirror when this copy last took a read.
    last_read: AtomicU64,
}

/// Bytes and nanoseconds every copy starts with (one 1 GB/s read of 1 MiB), so that each
/// copy's own reads soon outweigh the prior.
const PRIOR_BYTES: u64 = 1 << 20;
const PRIOR_NANOS: u64 = 1_048_576;

/// A copy that has taken none of the last this many reads takes the next one: every copy
/// stays measured (a device that got faster, or one that failed, is noticed).
const EXPLORE_EVERY: u64 = 16;

/// Past this many bytes measured, a copy's totals are halved: its speed follows what
/// recent reads saw.
const DECAY_BYTES: u64 = 1 << 30;

/// One copy's reads so far.
#[derive(Clone, Debug, PartialEq)]
pub struct CopyStats {
    pub name: String,
    pub bytes: u64,
    pub seconds: f64,
    pub failed: bool,
}

/// A [`ByteSource`] over copies of the same bytes.
pub struct MirrorSource {
    copies: Vec<Copy>,
    reads: AtomicU64,
    on_failure: Box<dyn Fn(&str) + Send + Sync>,
}

impl MirrorSource {
    /// Reads from `copies` (at least one); `on_failure(message)` hears once per copy why it
    /// was left out.
    pub fn new(copies: Vec<Box<dyn ByteSource>>, on_failure: Box<dyn Fn(&str) + Send + Sync>) -> Result<Self> {
        if copies.is_empty() {
            return Err(Error::Invalid("a mirror needs at least one copy".into()));
        }
        let copies = copies
            .into_iter()
            .map(|src| Copy {
                src,
                bytes: AtomicU64::new(0),
                nanos: AtomicU64::new(0),
                in_flight: AtomicU64::new(0),
                failed: AtomicBool::new(false),
                last_read: AtomicU64::new(0),
            })
            .collect();
        Ok(MirrorSource { copies, reads: AtomicU64::new(0), on_failure })
    }

    /// Each copy's reads: bytes and seconds measured (the recent ones: totals are halved
    /// past 1 GiB), and whether it was left out.
    pub fn stats(&self) -> Vec<CopyStats> {
        self.copies
            .iter()
            .map(|c| CopyStats {
                name: c.src.name(),
                bytes: c.bytes.load(Ordering::Relaxed),
                seconds: c.nanos.load(Ordering::Relaxed) as f64 / 1e9,
                failed: c.failed.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// The copy expected to finish `len` more bytes first, among those not failed; one that
    /// took none of the last [`EXPLORE_EVERY`] reads first.
    fn pick(&self, len: u64) -> Option<usize> {
        let n = self.reads.fetch_add(1, Ordering::Relaxed) + 1;
        let live = || (0..self.copies.len()).filter(|&i| !self.copies[i].failed.load(Ordering::Relaxed));
        if let Some(i) = live().find(|&i| n - self.copies[i].last_read.load(Ordering::Relaxed) > EXPLORE_EVERY) {
            return Some(i);
        }
        let finish = |c: &Copy| {
            let b = (c.bytes.load(Ordering::Relaxed) + PRIOR_BYTES) as f64;
            let ns = (c.nanos.load(Ordering::Relaxed) + PRIOR_NANOS) as f64;
            (c.in_flight.load(Ordering::Relaxed) + len) as f64 * ns / b
        };
        live().min_by(|&a, &b| finish(&self.copies[a]).total_cmp(&finish(&self.copies[b])))
    }

    /// Runs `read` on the copies, the fastest expected first, until one succeeds.
    fn read_with(&self, len: usize, read: &dyn Fn(&dyn ByteSource) -> Result<()>) -> Result<()> {
        let mut last = None;
        while let Some(i) = self.pick(len as u64) {
            let c = &self.copies[i];
            c.last_read.store(self.reads.load(Ordering::Relaxed), Ordering::Relaxed);
            c.in_flight.fetch_add(len as u64, Ordering::Relaxed);
            let t0 = Instant::now();
            let r = read(c.src.as_ref());
            c.in_flight.fetch_sub(len as u64, Ordering::Relaxed);
            match r {
                Ok(()) => {
                    let b = c.bytes.fetch_add(len as u64, Ordering::Relaxed) + len as u64;
                    c.nanos.fetch_add(t0.elapsed().as_nanos().max(1) as u64, Ordering::Relaxed);
                    if b > DECAY_BYTES {
                        // Racy halving is fine: the ratio is what matters.
                        c.bytes.store(b / 2, Ordering::Relaxed);
                        c.nanos.store(c.nanos.load(Ordering::Relaxed) / 2, Ordering::Relaxed);
                    }
                    return Ok(());
                }
                Err(e) => {
                    if !c.failed.swap(true, Ordering::Relaxed) {
                        let others = self.copies.iter().filter(|c| !c.failed.load(Ordering::Relaxed)).count();
                        (self.on_failure)(&format!(
                            "{}: {e}; reading the other {others} cop{} from now on",
                            c.src.name(),
                            if others == 1 { "y" } else { "ies" }
                        ));
                    }
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| Error::Invalid(format!("{}: every copy failed", self.name()))))
    }
}

impl ByteSource for MirrorSource {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let len = buf.len();
        let cell = std::cell::RefCell::new(buf);
        self.read_with(len, &|s| s.read_at(offset, &mut cell.borrow_mut()))
    }

    fn read_aligned(&self, offset: u64, buf: &mut [u8], need: usize) -> Result<()> {
        let cell = std::cell::RefCell::new(buf);
        self.read_with(need, &|s| s.read_aligned(offset, &mut cell.borrow_mut(), need))
    }

    fn name(&self) -> String {
        let names: Vec<String> = self.copies.iter().map(|c| c.src.name()).collect();
        names.join(" | ")
    }

    fn direct(&self) -> bool {
        self.copies.iter().all(|c| c.src.direct())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experts::source::MemorySource;
    use crate::tensor::Bytes;
    use std::sync::{Arc, Mutex};

    /// A copy that can be made to fail, or to take longer per read.
    struct Copy2 {
        inner: MemorySource,
        broken: Arc<AtomicBool>,
        delay: std::time::Duration,
    }

    impl ByteSource for Copy2 {
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
            if self.broken.load(Ordering::Relaxed) {
                return Err(Error::Invalid("device gone".into()));
            }
            std::thread::sleep(self.delay);
            self.inner.read_at(offset, buf)
        }
        fn name(&self) -> String {
            self.inner.name.clone()
        }
    }

    fn copy(name: &str, data: &[u8], delay_ms: u64) -> (Box<dyn ByteSource>, Arc<AtomicBool>) {
        let broken = Arc::new(AtomicBool::new(false));
        let c = Copy2 {
            inner: MemorySource { bytes: Bytes::from_vec(data.to_vec()), name: name.into() },
            broken: broken.clone(),
            delay: std::time::Duration::from_millis(delay_ms),
        };
        (Box::new(c), broken)
    }

    #[test]
    fn reads_split_by_speed_and_survive_a_copy_that_fails() {
        let data: Vec<u8> = (0..1 << 16).map(|i| (i * 31 % 251) as u8).collect();
        let (fast, _) = copy("fast", &data, 1);
        let (slow, slow_broken) = copy("slow", &data, 4);
        let said = Arc::new(Mutex::new(Vec::new()));
        let s2 = said.clone();
        let m = MirrorSource::new(vec![fast, slow], Box::new(move |w| s2.lock().unwrap().push(w.to_string()))).unwrap();
        // Four readers at once, as the expert cache's reader threads read.
        let read_some = |t: u64, n: u64| {
            for i in 0..n {
                let off = ((t * 64 + i) * 997) % (data.len() as u64 - 4096);
                let mut buf = vec![0u8; 4096];
                m.read_at(off, &mut buf).unwrap();
                assert_eq!(buf, data[off as usize..off as usize + 4096], "read {i}");
            }
        };
        std::thread::scope(|s| {
            for t in 0..4 {
                s.spawn(move || read_some(t, 16));
            }
        });
        let st = m.stats();
        assert!(st[0].bytes > st[1].bytes && st[1].bytes > 0, "both copies read, the faster more: {st:?}");
        assert_eq!(st[0].bytes + st[1].bytes, 64 * 4096);
        // The slow copy fails: every read still succeeds, from the other.
        slow_broken.store(true, Ordering::Relaxed);
        std::thread::scope(|s| {
            for t in 0..4 {
                s.spawn(move || read_some(t, 8));
            }
        });
        let said = said.lock().unwrap().clone();
        assert!(said.len() <= 1, "{said:?}");
        if let Some(w) = said.first() {
            assert!(w.contains("slow") && w.contains("device gone") && w.contains("other 1 copy"), "{w}");
        }
    }

    #[test]
    fn a_failing_copy_is_left_out_and_every_copy_failing_is_an_error() {
        let data: Vec<u8> = (0..8192).map(|i| (i % 253) as u8).collect();
        let (a, a_broken) = copy("a", &data, 0);
        let (b, b_broken) = copy("b", &data, 0);
        let said = Arc::new(Mutex::new(Vec::new()));
        let s2 = said.clone();
        let m = MirrorSource::new(vec![a, b], Box::new(move |w| s2.lock().unwrap().push(w.to_string()))).unwrap();
        a_broken.store(true, Ordering::Relaxed);
        for i in 0..10u64 {
            let mut buf = vec![0u8; 512];
            m.read_at(i * 512, &mut buf).unwrap();
            assert_eq!(buf, data[i as usize * 512..(i as usize + 1) * 512]);
        }
        let st = m.stats();
        assert!(st[0].failed && !st[1].failed, "{st:?}");
        assert_eq!(st[1].bytes, 10 * 512);
        assert_eq!(said.lock().unwrap().len(), 1, "said once: {:?}", said.lock().unwrap());
        b_broken.store(true, Ordering::Relaxed);
        let mut buf = vec![0u8; 16];
        let e = m.read_at(0, &mut buf).unwrap_err().to_string();
        assert!(e.contains("device gone"), "{e}");
        assert_eq!(said.lock().unwrap().len(), 2);
    }
}
