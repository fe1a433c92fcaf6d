//! Reading files that come from outside: only regular files (a FIFO or a device would
//! block or never end), at most a stated number of bytes, read in full into owned memory.

use std::io::Read;
use std::path::Path;

use crate::error::{Error, Result};

/// Largest config.json, generation_config.json, safetensors index or usage file.
pub const MAX_JSON_BYTES: u64 = 64 << 20;
/// Largest tokenizer.json / tokenizer_config.json (a 256K-token vocabulary with its merges
/// is about 20 MiB).
pub const MAX_TOKENIZER_BYTES: u64 = 512 << 20;

/// Opens `path` for reading if it is a regular file, without blocking on a FIFO.
pub fn open_regular(path: &Path) -> Result<std::fs::File> {
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // A FIFO opened for reading blocks until a writer appears; O_NONBLOCK returns at
        // once, and the type check below refuses it. Regular files ignore the flag.
        opts.custom_flags(libc::O_NONBLOCK);
    }
    let f = opts.open(path).map_err(|e| Error::io(path, e))?;
    let md = f.metadata().map_err(|e| Error::io(path, e))?;
    if !md.is_file() {
        return Err(Error::io(
            path,
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file (a FIFO, device or directory)"),
        ));
    }
    Ok(f)
}

/// Reads the regular file `path` whole, refusing one larger than `max` bytes.
pub fn read_limited(path: &Path, max: u64) -> Result<Vec<u8>> {
    let f = open_regular(path)?;
    let len = f.metadata().map_err(|e| Error::io(path, e))?.len();
    let too_big =
        || Error::io(path, std::io::Error::new(std::io::ErrorKind::InvalidData, format!("larger than {max} bytes")));
    if len > max {
        return Err(too_big());
    }
    let mut buf = Vec::with_capacity(len as usize);
    // The file may grow after the size check: never read more than the limit.
    f.take(max + 1).read_to_end(&mut buf).map_err(|e| Error::io(path, e))?;
    if buf.len() as u64 > max {
        return Err(too_big());
    }
    Ok(buf)
}

/// [`read_limited`], with None for a file that does not exist.
pub fn read_optional(path: &Path, max: u64) -> Result<Option<Vec<u8>>> {
    match read_limited(path, max) {
        Ok(b) => Ok(Some(b)),
        Err(Error::Io { io, .. }) if io.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// [`read_limited`] as UTF-8 text.
pub fn read_text(path: &Path, max: u64) -> Result<String> {
    String::from_utf8(read_limited(path, max)?)
        .map_err(|_| Error::io(path, std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text")))
}

/// A field of /proc/meminfo ("MemTotal", "MemAvailable") in bytes; None where there is
/// no such file (not Linux, wasm) or field. For reports (`coli doctor`, `coli bench`,
/// `coli plan`); the automatic budgets take the memory they may use from
/// [`crate::memlimit`], which also reads the cgroup's limit.
pub fn meminfo(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo(&text, field)
}

fn parse_meminfo(text: &str, field: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.strip_prefix(field).is_some_and(|rest| rest.starts_with(':')))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn fifos_and_big_files_are_refused_without_blocking() {
        let dir = std::env::temp_dir().join(format!("colibri-fsio-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read_limited(&fifo, 10).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        assert!(read_limited(&dir, 10).is_err());
        let f = dir.join("f");
        std::fs::write(&f, b"0123456789").unwrap();
        assert_eq!(read_limited(&f, 10).unwrap(), b"0123456789");
        assert!(read_limited(&f, 9).unwrap_err().to_string().contains("larger than 9"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn meminfo_fields_in_bytes() {
        let text = "MemTotal:       16318644 kB\nMemFree:          1000 kB\nMemAvailable:    8000000 kB\n";
        assert_eq!(parse_meminfo(text, "MemTotal"), Some(16318644 * 1024));
        assert_eq!(parse_meminfo(text, "MemAvailable"), Some(8000000 * 1024));
        assert_eq!(parse_meminfo(text, "Mem"), None);
        assert_eq!(parse_meminfo(text, "SwapTotal"), None);
        assert_eq!(parse_meminfo("MemTotal: 99999999999999999999 kB", "MemTotal"), None);
    }
}
