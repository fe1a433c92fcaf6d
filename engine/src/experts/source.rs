//! Where expert bytes are read from: [`ByteSource`], the one small interface that a local
//! file ([`FileSource`], pread, optionally O_DIRECT), bytes in memory ([`MemorySource`]) and
//! the browser (its disk tier, then HTTP Range fetches from the helper) all implement, so
//! the expert cache above never touches a file system or a network itself.

#[cfg(not(target_arch = "wasm32"))]
use super::reader;

use crate::error::{Error, Result};
use crate::tensor::Bytes;

/// Name of the manifest file; its presence marks a directory as a converted model.
pub const MANIFEST_FILE: &str = "colibri.json";

/// Random-access reads from a model's data file (a local file, an HTTP server, OPFS).
pub trait ByteSource: Send + Sync {
    /// Fills `buf` with the bytes at `offset`; an error if any of them is missing.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()>;
    /// Names the source in error messages (a path or URL).
    fn name(&self) -> String;
    /// Hint: these (offset, length) ranges are about to be read, each by one `read_at`.
    /// A remote source can fetch them all in one request; local files ignore it.
    fn prefetch(&self, _ranges: &[(u64, usize)]) -> Result<()> {
        Ok(())
    }
    /// Reads the `need` bytes at `offset` into `buf` (`buf` may be longer: a 4 KiB-aligned
    /// buffer of a length rounded up to 4 KiB, which O_DIRECT reads need; what follows
    /// the first `need` bytes is unspecified afterwards).
    fn read_aligned(&self, offset: u64, buf: &mut [u8], need: usize) -> Result<()> {
        let n = need.min(buf.len());
        self.read_at(offset, &mut buf[..n])
    }
    /// Whether reads bypass the operating system's page cache (O_DIRECT).
    fn direct(&self) -> bool {
        false
    }
    /// Whether the bytes this source hands out for the expert at (`offset`, `len`) were
    /// already checked against the manifest's checksum (the browser source checks each
    /// expert as it arrives from the helper or its disk tier), so that the expert cache
    /// does not hash them a second time.
    fn checks_expert(&self, _offset: u64, _len: usize) -> bool {
        false
    }
    /// Whether a local tier of this source (the browser's disk tier: OPFS or IndexedDB)
    /// holds the expert at (`offset`, `len`), so that reading it needs no network. Local
    /// files and memory answer false: natively only the expert cache's RAM tiers count as
    /// held ([`ExpertSource::local`](super::ExpertSource::local)).
    fn holds_locally(&self, _offset: u64, _len: usize) -> bool {
        false
    }
}

/// A [`ByteSource`] over bytes already in memory (tests, small models, fetched files).
pub struct MemorySource {
    pub bytes: Bytes,
    pub name: String,
}

impl ByteSource for MemorySource {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let start =
            usize::try_from(offset).map_err(|_| Error::Invalid(format!("{}: offset {offset} too large", self.name)))?;
        let src = self.bytes.slice(start, buf.len()).map_err(|e| Error::Invalid(format!("{}: {e}", self.name)))?;
        buf.copy_from_slice(src.as_ref());
        Ok(())
    }

    fn name(&self) -> String {
        self.name.clone()
    }
}

/// Positioned reads from a local file (pread on unix; no shared cursor, so concurrent
/// reads need no lock).
#[cfg(not(target_arch = "wasm32"))]
pub struct FileSource {
    file: std::fs::File,
    path: std::path::PathBuf,
    /// A second handle opened with O_DIRECT (`--direct`), while the file system takes it.
    direct: Option<std::fs::File>,
    direct_ok: std::sync::atomic::AtomicBool,
    /// Why O_DIRECT is not in use, when it was asked for.
    pub direct_note: Option<String>,
    #[cfg(not(any(unix, windows)))]
    lock: std::sync::Mutex<()>,
}

#[cfg(not(target_arch = "wasm32"))]
impl FileSource {
    pub fn open(path: &std::path::Path) -> Result<Self> {
        Self::open_with(path, false)
    }

    /// Opens `path`; with `direct`, also with O_DIRECT so that expert reads bypass the
    /// page cache. A file system that refuses O_DIRECT (tmpfs answers EINVAL) leaves
    /// plain reads in place and says why in `direct_note`.
    pub fn open_with(path: &std::path::Path, direct: bool) -> Result<Self> {
        let file = crate::fsio::open_regular(path)?;
        let (direct, direct_note) = if direct { open_direct(path) } else { (None, None) };
        Ok(FileSource {
            file,
            path: path.to_path_buf(),
            direct_ok: std::sync::atomic::AtomicBool::new(direct.is_some()),
            direct,
            direct_note,
            #[cfg(not(any(unix, windows)))]
            lock: std::sync::Mutex::new(()),
        })
    }

    pub fn len(&self) -> Result<u64> {
        Ok(self.file.metadata().map_err(|e| Error::io(&self.path, e))?.len())
    }

    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    pub fn file(&self) -> &std::fs::File {
        &self.file
    }
}

#[cfg(target_os = "linux")]
fn open_direct(path: &std::path::Path) -> (Option<std::fs::File>, Option<String>) {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path) {
        Ok(f) => (Some(f), None),
        Err(e) => (None, Some(format!("O_DIRECT refused ({e}); using buffered reads"))),
    }
}

#[cfg(all(not(target_os = "linux"), not(target_arch = "wasm32")))]
fn open_direct(_: &std::path::Path) -> (Option<std::fs::File>, Option<String>) {
    (None, Some("O_DIRECT is only supported on Linux; using buffered reads".into()))
}

/// pread on an O_DIRECT handle until `need` bytes are in (a short read happens at the end
/// of the file, where the rounded-up length reaches past it).
#[cfg(target_os = "linux")]
fn read_direct(f: &std::fs::File, offset: u64, buf: &mut [u8], need: usize) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut done = 0;
    while done < need {
        match f.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof)),
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(not(target_arch = "wasm32"))]
impl ByteSource for FileSource {
    fn read_aligned(&self, offset: u64, buf: &mut [u8], need: usize) -> Result<()> {
        #[cfg(target_os = "linux")]
        if let Some(d) = &self.direct {
            let aligned = |v: usize| v.is_multiple_of(reader::ALIGN);
            if self.direct_ok.load(std::sync::atomic::Ordering::Relaxed)
                && aligned(offset as usize)
                && aligned(buf.as_ptr() as usize)
                && aligned(buf.len())
                && need <= buf.len()
            {
                match read_direct(d, offset, buf, need) {
                    Ok(()) => return Ok(()),
                    // Some file systems open with O_DIRECT but refuse the reads: fall back for good.
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                        self.direct_ok.store(false, std::sync::atomic::Ordering::Relaxed);
                    }
                    Err(e) => return Err(Error::io(&self.path, e)),
                }
            }
        }
        let n = need.min(buf.len());
        self.read_at(offset, &mut buf[..n])
    }

    fn direct(&self) -> bool {
        self.direct.is_some() && self.direct_ok.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        #[cfg(unix)]
        let r = std::os::unix::fs::FileExt::read_exact_at(&self.file, buf, offset);
        #[cfg(windows)]
        let r = {
            use std::os::windows::fs::FileExt;
            let mut done = 0;
            let mut r = Ok(());
            while done < buf.len() {
                match self.file.seek_read(&mut buf[done..], offset + done as u64) {
                    Ok(0) => {
                        r = Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
                        break;
                    }
                    Ok(n) => done += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        r = Err(e);
                        break;
                    }
                }
            }
            r
        };
        #[cfg(not(any(unix, windows)))]
        let r = {
            use std::io::{Read, Seek};
            let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            let mut f = &self.file;
            f.seek(std::io::SeekFrom::Start(offset)).and_then(|_| f.read_exact(buf))
        };
        r.map_err(|e| {
            let e = if e.kind() == std::io::ErrorKind::UnexpectedEof {
                std::io::Error::new(
                    e.kind(),
                    format!("bytes {offset}+{} are past the end of the file (truncated?)", buf.len()),
                )
            } else {
                e
            };
            Error::io(&self.path, e)
        })
    }

    fn name(&self) -> String {
        self.path.display().to_string()
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn direct_falls_back_where_the_file_system_refuses_it() {
        // procfs refuses O_DIRECT with EINVAL (as tmpfs did before Linux 6.6).
        let f = FileSource::open_with(std::path::Path::new("/proc/self/status"), true).unwrap();
        assert!(f.direct_note.as_deref().unwrap_or("").contains("O_DIRECT refused"), "{:?}", f.direct_note);
        assert!(!f.direct());
        let mut buf = reader::BufferPool::new(1).take(4).unwrap();
        f.read_aligned(0, buf.full_mut(), 5).unwrap();
        buf.set_len(5);
        assert_eq!(buf.as_ref(), b"Name:");
    }

    #[test]
    fn direct_reads_give_the_same_bytes() {
        let path = std::env::temp_dir().join(format!("colibri-direct-{}", std::process::id()));
        let data: Vec<u8> = (0..3 * 4096 + 100).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let f = FileSource::open_with(&path, true).unwrap();
        let pool = reader::BufferPool::new(2);
        for (off, need) in [(0usize, 4096usize), (4096, 5000), (8192, 4196), (100, 10)] {
            let mut buf = pool.take(need).unwrap();
            f.read_aligned(off as u64, buf.full_mut(), need).unwrap();
            buf.set_len(need);
            assert_eq!(buf.as_ref(), &data[off..off + need], "offset {off}");
        }
        let mut buf = pool.take(8192).unwrap();
        assert!(f.read_aligned(8192, buf.full_mut(), 8192).is_err(), "reading past the end must fail");
        let _ = std::fs::remove_file(&path);
    }
}
