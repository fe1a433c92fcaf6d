//! Page-aligned, zeroed weight memory that the kernel may back with 2 MiB pages.
//!
//! Decode streams every weight of a token once, hundreds of megabytes in 4 KiB pages: one
//! TLB miss and page walk per 4 KiB read. Transparent huge pages cut that 512-fold. Linux
//! gives them to anonymous memory only where asked (`madvise` is the common
//! `/sys/kernel/mm/transparent_hugepage/enabled` setting) and only for whole 2 MiB-aligned
//! spans inside a mapping, so a weight buffer of 2 MiB or more is mapped at a 2 MiB
//! boundary and marked `MADV_HUGEPAGE`. Measured on the bench_peers OLMoE shape (Intel
//! Xeon, default conversion): decode 12.0 -> 13.0-13.3 tok/s at one thread, 20.0-20.5 ->
//! 22.7-23.1 at two (docs/benchmarks.md "Weights in huge pages").
//!
//! The mapping is exactly the buffer's size (rounded to 4 KiB), so nothing beyond it is
//! ever resident: the tail that is not a whole 2 MiB span stays in small pages. Where huge
//! pages are off or unknown (`never`, other systems) the advice is a no-op.

use crate::error::{Error, Result};

/// Small-page size and the alignment every buffer here has.
pub const PAGE: usize = 4096;
/// The huge-page span: buffers at least this long start on such a boundary.
pub const HUGE: usize = 2 << 20;

/// Zeroed memory of `cap` bytes (`cap` a multiple of [`PAGE`]), 2 MiB-aligned and advised
/// for huge pages when `cap >= HUGE`. Free with [`free`] and the same `cap`.
#[cfg(unix)]
pub fn alloc(cap: usize) -> Result<*mut u8> {
    debug_assert!(cap > 0 && cap.is_multiple_of(PAGE));
    let slack = if cap >= HUGE { HUGE - PAGE } else { 0 };
    let total = cap.checked_add(slack).ok_or_else(|| Error::Invalid(format!("a {cap}-byte buffer is too large")))?;
    // SAFETY: an anonymous private mapping; no file or existing memory is involved.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(Error::Invalid(format!("cannot map {cap} bytes: {}", std::io::Error::last_os_error())));
    }
    let base = p as usize;
    let start = if slack == 0 { base } else { base.div_ceil(HUGE) * HUGE };
    let (head, tail) = (start - base, total - (start - base) - cap);
    // SAFETY: both spans lie inside the mapping just made and outside [start, start + cap);
    // each is a multiple of PAGE (mmap returns page-aligned addresses, HUGE is one too).
    unsafe {
        if head > 0 {
            libc::munmap(p, head);
        }
        if tail > 0 {
            libc::munmap((start + cap) as *mut libc::c_void, tail);
        }
    }
    #[cfg(target_os = "linux")]
    if slack > 0 {
        // SAFETY: advice on the mapping made above; failure (no THP in this kernel) only
        // leaves small pages, so its result is ignored.
        unsafe { libc::madvise(start as *mut libc::c_void, cap, libc::MADV_HUGEPAGE) };
    }
    Ok(start as *mut u8)
}

/// Gives back memory from [`alloc`].
#[cfg(unix)]
pub fn free(ptr: *mut u8, cap: usize) {
    // SAFETY: ptr/cap describe exactly the mapping `alloc` kept, not yet unmapped.
    unsafe { libc::munmap(ptr as *mut libc::c_void, cap) };
}

#[cfg(not(unix))]
pub fn alloc(cap: usize) -> Result<*mut u8> {
    let layout = std::alloc::Layout::from_size_align(cap, PAGE)
        .map_err(|e| Error::Invalid(format!("buffer of {cap} bytes: {e}")))?;
    // SAFETY: the layout has a non-zero size (callers pass cap > 0).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return Err(Error::Invalid(format!("out of memory allocating {cap} bytes")));
    }
    Ok(ptr)
}

#[cfg(not(unix))]
pub fn free(ptr: *mut u8, cap: usize) {
    // SAFETY: allocated in `alloc` with exactly this layout (checked there).
    unsafe { std::alloc::dealloc(ptr, std::alloc::Layout::from_size_align_unchecked(cap, PAGE)) }
}

/// An owned weight buffer from [`alloc`]: `len` bytes in use of a zeroed, page-rounded
/// mapping.
pub struct WeightBuf {
    ptr: *mut u8,
    cap: usize,
    len: usize,
}

// SAFETY: the buffer is uniquely owned memory, like a Vec<u8>.
unsafe impl Send for WeightBuf {}
// SAFETY: shared access is read-only (`AsRef<[u8]>`); writes need `&mut`.
unsafe impl Sync for WeightBuf {}

impl WeightBuf {
    /// `len` zero bytes (`len` may be 0).
    pub fn zeroed(len: usize) -> Result<Self> {
        let cap = len.max(1).div_ceil(PAGE) * PAGE;
        Ok(WeightBuf { ptr: alloc(cap)?, cap, len })
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr points to cap >= len zero-initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl AsRef<[u8]> for WeightBuf {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: as in `as_mut_slice`, shared.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for WeightBuf {
    fn drop(&mut self) {
        free(self.ptr, self.cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_zeroed_aligned_and_writable() {
        for len in [0, 1, PAGE, HUGE - 1, HUGE, 3 * HUGE + 5 * PAGE + 7] {
            let mut b = WeightBuf::zeroed(len).unwrap();
            let at = b.as_ref().as_ptr() as usize;
            assert_eq!(at % if cfg!(unix) && len >= HUGE { HUGE } else { PAGE }, 0, "len {len}");
            assert_eq!(b.as_ref().len(), len);
            assert!(b.as_ref().iter().all(|&x| x == 0));
            for (i, x) in b.as_mut_slice().iter_mut().enumerate() {
                *x = i as u8;
            }
            assert!(b.as_ref().iter().enumerate().all(|(i, &x)| x == i as u8));
        }
    }

    /// The advice is on the mapping: /proc/self/smaps lists `hg` (MADV_HUGEPAGE) in the
    /// flags of the buffer's mapping wherever the kernel has transparent huge pages, whether
    /// or not it found a free huge page (so this cannot flake on fragmented memory). Not
    /// under qemu-user (tools/test.sh's aarch64 step leaves it out): its madvise ignores
    /// the advice, and this test then fails, rightly.
    #[cfg(target_os = "linux")]
    #[test]
    fn large_buffers_are_advised_for_huge_pages() {
        if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists() {
            // A kernel without THP refuses the advice; nothing to check.
            eprintln!("no transparent huge pages in this kernel");
            return;
        }
        let flags_at = |addr: usize| -> String {
            let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
            let mut inside = false;
            for line in smaps.lines() {
                // A mapping's header line starts with its range "lo-hi" in hex; the field
                // lines after it ("Size:", ..., "VmFlags:") have no such first word.
                let range = line.split_whitespace().next().and_then(|r| r.split_once('-'));
                if let Some((Ok(lo), Ok(hi))) =
                    range.map(|(l, h)| (usize::from_str_radix(l, 16), usize::from_str_radix(h, 16)))
                {
                    inside = (lo..hi).contains(&addr);
                    continue;
                }
                if inside {
                    if let Some(f) = line.strip_prefix("VmFlags:") {
                        return f.to_string();
                    }
                }
            }
            panic!("no mapping at {addr:#x} in /proc/self/smaps")
        };
        let big = WeightBuf::zeroed(2 * HUGE + PAGE).unwrap();
        let small = WeightBuf::zeroed(HUGE / 2).unwrap();
        let (fb, fs) = (flags_at(big.as_ref().as_ptr() as usize), flags_at(small.as_ref().as_ptr() as usize));
        assert!(fb.split_whitespace().any(|f| f == "hg"), "2 MiB+ buffer without MADV_HUGEPAGE: {fb}");
        assert!(!fs.split_whitespace().any(|f| f == "hg"), "small buffer advised: {fs}");
    }
}
