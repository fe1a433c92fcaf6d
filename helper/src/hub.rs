//! The Hugging Face hub as `coli pull` uses it: a repository's file list, each file's size
//! and LFS sha256, and resumable, verified downloads.
//!
//! - `GET {endpoint}/api/models/{repo}/revision/{rev}`: `siblings[].rfilename`.
//! - `HEAD {endpoint}/{repo}/resolve/{rev}/{path}` without following redirects: an LFS file
//!   answers 302 to its CDN URL with `X-Linked-Etag` (its sha256) and `X-Linked-Size`; a
//!   small file answers 200 with `Content-Length` (its ETag is a git hash, not checked).
//!   A redirect without these headers is followed (HEAD again, the token not sent on)
//!   to the answer that has a `Content-Length`. Sizes above [`MAX_FILE_BYTES`] are refused.
//! - `GET` of the same URL, following redirects, with `Range: bytes=N-` to resume a
//!   `.part` file; a dropped connection resumes where it stopped, after a pause that
//!   doubles from 0.25 s to 8 s, while tries bring bytes (5 in a row that bring none fail).
//! - Every other read (the file list, HEAD, a small file, a byte range such as a
//!   safetensors header) is tried 5 times with the same pauses when the connection fails,
//!   times out or the server answers 408, 429 or 5xx; other statuses fail at once.
//!
//! `HF_ENDPOINT` (default <https://huggingface.co>) and `HF_TOKEN` (sent as a bearer token to
//! the endpoint; not forwarded to the CDN a redirect leads to) are honoured.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sha2::{Digest, Sha256};
use ureq::Agent;

/// Longest JSON answer accepted from the API.
const MAX_API_BYTES: u64 = 64 << 20;
/// Tries of one network read (or, for a download, tries in a row that bring no byte)
/// before a dropped connection is an error.
const MAX_ATTEMPTS: usize = 5;
/// Tries of one download in all, progress or not.
const MAX_TRIES: usize = 100;
/// Redirects followed (by downloads, and by HEAD when the answer has no size).
const MAX_REDIRECTS: u32 = 5;
/// The largest file `coli pull` accepts the hub's word for: five times the hub's own limit
/// of 50 GB a file (huggingface.co/docs/hub/storage-limits), so that an absurd
/// `X-Linked-Size` is refused before anything is allocated.
pub const MAX_FILE_BYTES: u64 = 256 << 30;

/// One file of a repository revision.
#[derive(Clone, Debug)]
pub struct RemoteFile {
    pub path: String,
    pub size: u64,
    /// Lower-case hex sha256 (LFS files).
    pub sha256: Option<String>,
}

/// Told of a download's progress: the file, its bytes on disk, its size.
pub type Progress = std::sync::Arc<dyn Fn(&RemoteFile, u64) + Send + Sync>;

pub struct Hub {
    /// Besides the progress bar on stderr (`/api/pull` streams it to its client).
    progress: Option<Progress>,
    endpoint: String,
    token: Option<String>,
    /// Follows redirects (downloads).
    agent: Agent,
    /// Does not (HEAD: the hub's own headers).
    no_redirect: Agent,
}

/// `rev` with the characters a URL path segment cannot hold escaped.
fn escape_rev(rev: &str) -> String {
    rev.replace('%', "%25").replace('/', "%2F")
}

fn agent(max_redirects: u32) -> Agent {
    ureq::config::Config::builder()
        .http_status_as_error(false)
        .max_redirects(max_redirects)
        .max_redirects_will_error(false)
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_recv_response(Some(Duration::from_secs(60)))
        .timeout_per_read(Some(Duration::from_secs(60)))
        .user_agent(concat!("colibri/", env!("CARGO_PKG_VERSION")))
        .build()
        .new_agent()
}

/// An ETag holding a sha256: `"<64 hex>"` or `W/"<64 hex>"`.
fn sha256_of_etag(etag: &str) -> Option<String> {
    let t = etag.trim().trim_start_matches("W/").trim_matches('"').to_ascii_lowercase();
    (t.len() == 64 && t.bytes().all(|b| b.is_ascii_hexdigit())).then_some(t)
}

fn status_error(what: &str, status: u16) -> anyhow::Error {
    match status {
        401 | 403 => anyhow::anyhow!("{what}: HTTP {status} (a gated or private repository: set HF_TOKEN)"),
        404 => anyhow::anyhow!("{what}: HTTP 404 (no such repository, revision or file)"),
        s => anyhow::anyhow!("{what}: HTTP {s}"),
    }
}

impl Hub {
    pub fn from_env() -> Hub {
        let endpoint = std::env::var("HF_ENDPOINT").ok().filter(|e| !e.is_empty());
        let endpoint = endpoint.unwrap_or_else(|| "https://huggingface.co".into()).trim_end_matches('/').to_string();
        let token = std::env::var("HF_TOKEN").ok().filter(|t| !t.is_empty());
        Hub { progress: None, endpoint, token, agent: agent(MAX_REDIRECTS), no_redirect: agent(0) }
    }

    /// Also tells `progress` how each download goes.
    pub fn with_progress(mut self, progress: Progress) -> Hub {
        self.progress = Some(progress);
        self
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn get(&self, agent: &Agent, url: &str) -> ureq::RequestBuilder<ureq::typestate::WithoutBody> {
        let r = agent.get(url);
        match &self.token {
            Some(t) if url.starts_with(&self.endpoint) => r.header("Authorization", format!("Bearer {t}")),
            _ => r,
        }
    }

    fn resolve_url(&self, repo: &str, rev: &str, path: &str) -> String {
        format!("{}/{repo}/resolve/{}/{path}", self.endpoint, escape_rev(rev))
    }

    /// Every file of `repo` at `rev`, with sizes and sha256s.
    pub fn list_files(&self, repo: &str, rev: &str) -> Result<Vec<RemoteFile>> {
        let url = format!("{}/api/models/{repo}/revision/{}", self.endpoint, escape_rev(rev));
        let text = with_retries(&format!("{repo}@{rev}"), || {
            let mut r = self.get(&self.agent, &url).call().map_err(|e| from_ureq(e, &self.endpoint))?;
            check_status(&format!("{repo}@{rev}"), r.status().as_u16())?;
            r.body_mut().with_config().limit(MAX_API_BYTES).read_to_string().map_err(|e| from_ureq(e, &url))
        })?;
        let v: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("{url}: the hub's answer is not JSON"))?;
        let siblings = v["siblings"].as_array().with_context(|| format!("{url}: no \"siblings\" list"))?;
        let mut names = Vec::new();
        for s in siblings {
            let name = s["rfilename"].as_str().context("a sibling without \"rfilename\"")?;
            names.push(name.to_string());
        }
        Ok(names.into_iter().map(|path| RemoteFile { path, size: 0, sha256: None }).collect())
    }

    /// Size and sha256 of one file from the hub's headers. An LFS file answers 302 with
    /// `X-Linked-Size` and `X-Linked-Etag`; a redirect without them (a renamed repository,
    /// a file served from elsewhere) is followed with HEAD to the answer that has the size.
    /// The size is bounded by [`MAX_FILE_BYTES`].
    pub fn stat(&self, repo: &str, rev: &str, path: &str) -> Result<RemoteFile> {
        let mut url = self.resolve_url(repo, rev, path);
        let mut sha256 = None;
        for hop in 0..=MAX_REDIRECTS {
            let (status, headers) = with_retries(path, || {
                let mut req = self.no_redirect.head(&url);
                // The token goes to the hub's own URL only, never where a redirect leads.
                if let (Some(t), 0) = (&self.token, hop) {
                    req = req.header("Authorization", format!("Bearer {t}"));
                }
                let r = req.call().map_err(|e| from_ureq(e, &self.endpoint))?;
                let status = r.status().as_u16();
                if !(200..400).contains(&status) {
                    check_status(path, status)?;
                }
                Ok((status, r.headers().clone()))
            })?;
            let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
            sha256 = sha256.or_else(|| get("x-linked-etag").and_then(|e| sha256_of_etag(&e)));
            let size = |v: String, what: &str| -> Result<u64> {
                let n = v.trim().parse::<u64>().map_err(|_| anyhow::anyhow!("{path}: {what} {v:?} is not a size"))?;
                check_size(path, n)
            };
            if let Some(v) = get("x-linked-size") {
                return Ok(RemoteFile { path: path.to_string(), size: size(v, "X-Linked-Size")?, sha256 });
            }
            if (300..400).contains(&status) {
                let loc = get("location").with_context(|| format!("{path}: HTTP {status} without a Location"))?;
                url = join_url(&url, &loc);
                continue;
            }
            let len = get("content-length").with_context(|| format!("{path}: the hub sent no size"))?;
            return Ok(RemoteFile { path: path.to_string(), size: size(len, "Content-Length")?, sha256 });
        }
        bail!("{path}: more than {MAX_REDIRECTS} redirects")
    }

    /// A small file (config.json, the safetensors index) whole, at most `limit` bytes.
    pub fn read_small(&self, repo: &str, rev: &str, path: &str, limit: u64) -> Result<Vec<u8>> {
        let url = self.resolve_url(repo, rev, path);
        let buf = with_retries(path, || {
            let r = self.get(&self.agent, &url).call().map_err(|e| from_ureq(e, &self.endpoint))?;
            let status = r.status().as_u16();
            if status != 200 {
                check_status(path, status)?;
                return Err(Attempt::fatal(status_error(path, status)));
            }
            let mut buf = Vec::new();
            r.into_body().into_with_config().limit(limit + 1).reader().read_to_end(&mut buf).map_err(from_io)?;
            Ok(buf)
        })?;
        if buf.len() as u64 > limit {
            bail!("{path}: larger than {limit} bytes");
        }
        Ok(buf)
    }

    /// Bytes `start..start+len` of a file (a safetensors header, say), retried like every
    /// other read when the connection drops.
    pub fn read_range(&self, repo: &str, rev: &str, path: &str, start: u64, len: u64) -> Result<Vec<u8>> {
        let url = self.resolve_url(repo, rev, path);
        let what = format!("{path}: reading bytes {start}..{}", start + len);
        with_retries(&what, || {
            let r = self
                .get(&self.agent, &url)
                .header("Range", format!("bytes={start}-{}", start + len - 1))
                .call()
                .map_err(|e| from_ureq(e, &self.endpoint))?;
            let status = r.status().as_u16();
            match status {
                206 => {}
                200 => {
                    return Err(Attempt::fatal(anyhow::anyhow!("{path}: the server does not answer Range requests")))
                }
                s => {
                    check_status(path, s)?;
                    return Err(Attempt::fatal(status_error(path, s)));
                }
            }
            let mut body = r.into_body().into_with_config().limit(len + 1).reader();
            let mut buf = Vec::new();
            body.read_to_end(&mut buf).map_err(from_io)?;
            if buf.len() as u64 != len {
                // A connection closed early without an error: read it again.
                return Err(Attempt::again(anyhow::anyhow!("short range answer ({} of {len} bytes)", buf.len())));
            }
            Ok(buf)
        })
    }

    /// Downloads `f` to `dest`, resuming `dest.part`, and verifies its size and sha256. A
    /// checksum mismatch deletes the download and fetches it once more before failing.
    pub fn download(&self, repo: &str, rev: &str, f: &RemoteFile, dest: &Path) -> Result<()> {
        let part = part_path(dest);
        for attempt in 0..2 {
            self.fetch_part(repo, rev, f, &part)?;
            match verify(&part, f) {
                Ok(()) => {
                    std::fs::rename(&part, dest)
                        .with_context(|| format!("cannot move {} into place", part.display()))?;
                    return Ok(());
                }
                Err(e) => {
                    let _ = std::fs::remove_file(&part);
                    if attempt == 1 {
                        return Err(e.context(format!("{}: corrupted download (fetched twice)", f.path)));
                    }
                    eprintln!("{}: {e:#}; fetching it again", f.path);
                }
            }
        }
        bail!("{}: corrupted download", f.path)
    }

    /// Fetches `part` up to `f.size`, resuming with a Range request after a dropped
    /// connection (with a growing pause), as long as each try makes progress: up to
    /// [`MAX_ATTEMPTS`] tries in a row without a byte, [`MAX_TRIES`] in all. Errors writing
    /// the local file (a full disk) end it at once.
    fn fetch_part(&self, repo: &str, rev: &str, f: &RemoteFile, part: &Path) -> Result<()> {
        let url = self.resolve_url(repo, rev, &f.path);
        let bar = ProgressBar::with_draw_target(Some(f.size), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{msg:<24!} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_message(f.path.clone());
        let (mut stalled, mut tries) = (0usize, 0usize);
        loop {
            let mut have = std::fs::metadata(part).map(|m| m.len()).unwrap_or(0);
            if have > f.size {
                std::fs::remove_file(part)?;
                have = 0;
            }
            bar.set_position(have);
            if let Some(p) = &self.progress {
                p(f, have);
            }
            if have == f.size {
                bar.finish_and_clear();
                return Ok(());
            }
            let mut req = self.get(&self.agent, &url);
            if have > 0 {
                req = req.header("Range", format!("bytes={have}-"));
            }
            let mut got = 0u64;
            let result = (|| -> Result<(), Attempt> {
                let r = req.call().map_err(|e| from_ureq(e, &self.endpoint))?;
                let status = r.status().as_u16();
                let local = |e: std::io::Error| Attempt::fatal(anyhow::anyhow!("{}: {e}", part.display()));
                let (mut file, left) = match status {
                    206 if have > 0 => (OpenOptions::new().append(true).open(part).map_err(local)?, f.size - have),
                    200 => (File::create(part).map_err(local)?, f.size),
                    s => {
                        check_status(&f.path, s)?;
                        return Err(Attempt::fatal(status_error(&f.path, s)));
                    }
                };
                let mut body = r.into_body().into_with_config().limit(left + 1).reader();
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    let n = body.read(&mut buf).map_err(from_io)?;
                    if n == 0 {
                        break;
                    }
                    file.write_all(&buf[..n]).map_err(local)?;
                    got += n as u64;
                    bar.inc(n as u64);
                    if let Some(p) = &self.progress {
                        p(f, bar.position());
                    }
                }
                file.sync_data().map_err(local)?;
                Ok(())
            })();
            let now = std::fs::metadata(part).map(|m| m.len()).unwrap_or(0);
            let err = match result {
                Ok(()) if now >= f.size => continue,
                Ok(()) => Attempt::again(anyhow::anyhow!("the connection closed early ({now} of {} bytes)", f.size)),
                Err(e) => e,
            };
            tries += 1;
            stalled = if got > 0 { 0 } else { stalled + 1 };
            if !err.retry || stalled >= MAX_ATTEMPTS || tries >= MAX_TRIES {
                bar.finish_and_clear();
                return Err(err.err.context(format!("downloading {}", f.path)));
            }
            bar.println(format!("{}: {:#}; resuming", f.path, err.err));
            std::thread::sleep(backoff(stalled));
        }
    }
}

/// `dest.part`, where a download of `dest` is kept until it is verified.
pub fn part_path(dest: &Path) -> PathBuf {
    dest.with_file_name(format!("{}.part", dest.file_name().and_then(|n| n.to_str()).unwrap_or("file")))
}

/// One failed try of a network read: tried again, or not.
struct Attempt {
    err: anyhow::Error,
    retry: bool,
}

impl Attempt {
    fn again(err: anyhow::Error) -> Attempt {
        Attempt { err, retry: true }
    }

    fn fatal(err: anyhow::Error) -> Attempt {
        Attempt { err, retry: false }
    }
}

/// Transport failures (connection refused or dropped, timeouts, a garbled answer) are
/// tried again; a refused request, a body over its limit or a bad URL are not.
fn from_ureq(e: ureq::Error, what: &str) -> Attempt {
    use ureq::Error as E;
    let retry =
        matches!(e, E::Io(_) | E::Timeout(_) | E::ConnectionFailed | E::HostNotFound | E::Protocol(_) | E::BodyStalled);
    let err = anyhow::Error::new(e).context(format!("cannot reach {what}"));
    Attempt { err, retry }
}

/// An error reading a body: ureq's own (wrapped in an io::Error) as [`from_ureq`], any
/// other io error (the connection reset) tried again.
fn from_io(e: std::io::Error) -> Attempt {
    let over_limit = e
        .get_ref()
        .and_then(|i| i.downcast_ref::<ureq::Error>())
        .is_some_and(|u| matches!(u, ureq::Error::BodyExceedsLimit(_)));
    Attempt { err: e.into(), retry: !over_limit }
}

/// A server error or rate limit is tried again; other statuses are final.
fn check_status(what: &str, status: u16) -> std::result::Result<(), Attempt> {
    match status {
        200..=299 => Ok(()),
        408 | 429 | 500..=599 => Err(Attempt::again(status_error(what, status))),
        s => Err(Attempt::fatal(status_error(what, s))),
    }
}

/// The pause before try `n + 1`: 0.25 s, doubling, at most 8 s.
fn backoff(n: usize) -> Duration {
    Duration::from_millis(250u64 << n.min(5)).min(Duration::from_secs(8))
}

/// Runs `f` until it succeeds, fails for good, or fails [`MAX_ATTEMPTS`] times, pausing
/// ([`backoff`]) between tries.
fn with_retries<T>(what: &str, mut f: impl FnMut() -> std::result::Result<T, Attempt>) -> Result<T> {
    let mut n = 0;
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(a) if !a.retry || n + 1 >= MAX_ATTEMPTS => {
                return Err(if a.retry { a.err.context(format!("{what} ({MAX_ATTEMPTS} tries)")) } else { a.err })
            }
            Err(a) => {
                eprintln!("{what}: {:#}; trying again", a.err);
                std::thread::sleep(backoff(n));
                n += 1;
            }
        }
    }
}

/// `size` if no hub file is that large, else a clear error.
fn check_size(path: &str, size: u64) -> Result<u64> {
    if size > MAX_FILE_BYTES {
        bail!(
            "{path}: the hub says {size} bytes, more than any file colibri pulls ({} GiB; the hub's own limit is 50 GB a file)",
            MAX_FILE_BYTES >> 30
        );
    }
    Ok(size)
}

/// `loc` (a Location header) resolved against `base`.
fn join_url(base: &str, loc: &str) -> String {
    if loc.starts_with("http://") || loc.starts_with("https://") {
        return loc.to_string();
    }
    let (scheme, rest) = base.split_once("://").unwrap_or(("https", base));
    if let Some(l) = loc.strip_prefix("//") {
        return format!("{scheme}://{l}");
    }
    let host_end = rest.find('/').unwrap_or(rest.len());
    let origin = &base[..scheme.len() + 3 + host_end];
    if loc.starts_with('/') {
        return format!("{origin}{loc}");
    }
    let path = rest[host_end..].split(['?', '#']).next().unwrap_or("");
    let dir = &path[..path.rfind('/').map_or(0, |i| i + 1)];
    format!("{origin}{}{loc}", if dir.is_empty() { "/" } else { dir })
}

/// Bytes free to an unprivileged user on the file system that holds `path` (or its
/// nearest existing ancestor); None where that cannot be asked.
#[cfg(unix)]
pub fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let at = path.ancestors().find(|p| p.exists())?;
    let c = std::ffi::CString::new(at.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs only writes the struct it is given; all-zero bytes are a valid value
    // of this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path that outlives the call; `st` is a valid out-pointer.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    #[allow(clippy::unnecessary_cast)] // the field types differ between platforms
    (rc == 0).then(|| (st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

#[cfg(not(unix))]
pub fn free_bytes(_: &Path) -> Option<u64> {
    None
}

/// Size and (where the hub gave one) sha256 of a downloaded file.
fn verify(path: &Path, f: &RemoteFile) -> Result<()> {
    let len = std::fs::metadata(path)?.len();
    if len != f.size {
        bail!("{} bytes, the hub says {}", len, f.size);
    }
    let Some(want) = &f.sha256 else { return Ok(()) };
    let mut file = File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    let got: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    if &got != want {
        bail!("sha256 {got}, the hub says {want}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_with_a_sha256() {
        let h = "a".repeat(64);
        assert_eq!(sha256_of_etag(&format!("\"{h}\"")), Some(h.clone()));
        assert_eq!(sha256_of_etag(&format!("W/\"{}\"", h.to_uppercase())), Some(h));
        assert_eq!(sha256_of_etag("\"0123abcd\""), None);
        assert_eq!(escape_rev("refs/pr/1"), "refs%2Fpr%2F1");
    }
}
