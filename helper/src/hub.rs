//! The Hugging Face hub as `coli pull` uses it: a repository's file list, each file's size
//! and LFS sha256, and resumable, verified downloads.
//!
//! - `GET {endpoint}/api/models/{repo}/revision/{rev}`: `siblings[].rfilename`.
//! - `HEAD {endpoint}/{repo}/resolve/{rev}/{path}` without following redirects: an LFS file
//!   answers 302 to its CDN URL with `X-Linked-Etag` (its sha256) and `X-Linked-Size`; a
//!   small file answers 200 with `Content-Length` (its ETag is a git hash, not checked).
//! - `GET` of the same URL, following redirects, with `Range: bytes=N-` to resume a
//!   `.part` file; a dropped connection resumes where it stopped (a few times).
//!
//! `HF_ENDPOINT` (default https://huggingface.co) and `HF_TOKEN` (sent as a bearer token to
//! the endpoint; not forwarded to the CDN a redirect leads to) are honoured.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sha2::{Digest, Sha256};
use ureq::Agent;

/// Longest JSON answer accepted from the API.
const MAX_API_BYTES: u64 = 64 << 20;
/// Attempts per file before a dropped connection is an error.
const MAX_ATTEMPTS: usize = 5;

/// One file of a repository revision.
#[derive(Clone, Debug)]
pub struct RemoteFile {
    pub path: String,
    pub size: u64,
    /// Lower-case hex sha256 (LFS files).
    pub sha256: Option<String>,
}

pub struct Hub {
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

fn header(r: &ureq::http::Response<ureq::Body>, name: &str) -> Option<String> {
    r.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
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
        Hub { endpoint, token, agent: agent(5), no_redirect: agent(0) }
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
        let mut r = self.get(&self.agent, &url).call().with_context(|| format!("cannot reach {}", self.endpoint))?;
        if r.status() != 200 {
            return Err(status_error(&format!("{repo}@{rev}"), r.status().as_u16()));
        }
        let text = r.body_mut().with_config().limit(MAX_API_BYTES).read_to_string()?;
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

    /// Size and sha256 of one file from the hub's headers.
    pub fn stat(&self, repo: &str, rev: &str, path: &str) -> Result<RemoteFile> {
        let url = self.resolve_url(repo, rev, path);
        let mut req = self.no_redirect.head(&url);
        if let Some(t) = &self.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let r = req.call().with_context(|| format!("cannot reach {}", self.endpoint))?;
        let status = r.status().as_u16();
        if !(200..400).contains(&status) {
            return Err(status_error(path, status));
        }
        let sha256 = header(&r, "x-linked-etag").and_then(|e| sha256_of_etag(&e));
        let size = header(&r, "x-linked-size")
            .or_else(|| header(&r, "content-length"))
            .and_then(|s| s.trim().parse::<u64>().ok())
            .with_context(|| format!("{path}: the hub sent no size"))?;
        Ok(RemoteFile { path: path.to_string(), size, sha256 })
    }

    /// A small file (config.json, the safetensors index) whole, at most `limit` bytes.
    pub fn read_small(&self, repo: &str, rev: &str, path: &str, limit: u64) -> Result<Vec<u8>> {
        let url = self.resolve_url(repo, rev, path);
        let r = self.get(&self.agent, &url).call().with_context(|| format!("cannot reach {}", self.endpoint))?;
        let status = r.status().as_u16();
        if status != 200 {
            return Err(status_error(path, status));
        }
        let mut buf = Vec::new();
        r.into_body().into_with_config().limit(limit + 1).reader().read_to_end(&mut buf)?;
        if buf.len() as u64 > limit {
            bail!("{path}: larger than {limit} bytes");
        }
        Ok(buf)
    }

    /// Bytes `start..start+len` of a file (a safetensors header, say).
    pub fn read_range(&self, repo: &str, rev: &str, path: &str, start: u64, len: u64) -> Result<Vec<u8>> {
        let url = self.resolve_url(repo, rev, path);
        let r = self.get(&self.agent, &url).header("Range", format!("bytes={start}-{}", start + len - 1)).call()?;
        let status = r.status().as_u16();
        let mut body = r.into_body().into_with_config().limit(len + 1).reader();
        let mut buf = Vec::new();
        body.read_to_end(&mut buf).with_context(|| format!("{path}: reading bytes {start}..{}", start + len))?;
        match status {
            206 if buf.len() as u64 == len => Ok(buf),
            200 => bail!("{path}: the server does not answer Range requests"),
            206 => bail!("{path}: short range answer ({} of {len} bytes)", buf.len()),
            s => Err(status_error(path, s)),
        }
    }

    /// Downloads `f` to `dest`, resuming `dest.part`, and verifies its size and sha256. A
    /// checksum mismatch deletes the download and fetches it once more before failing.
    pub fn download(&self, repo: &str, rev: &str, f: &RemoteFile, dest: &Path) -> Result<()> {
        let part = dest.with_file_name(format!("{}.part", dest.file_name().and_then(|n| n.to_str()).unwrap_or("file")));
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

    fn fetch_part(&self, repo: &str, rev: &str, f: &RemoteFile, part: &Path) -> Result<()> {
        let url = self.resolve_url(repo, rev, &f.path);
        let bar = ProgressBar::with_draw_target(Some(f.size), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{msg:<24!} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_message(f.path.clone());
        let mut failures = 0;
        loop {
            let mut have = std::fs::metadata(part).map(|m| m.len()).unwrap_or(0);
            if have > f.size {
                std::fs::remove_file(part)?;
                have = 0;
            }
            bar.set_position(have);
            if have == f.size {
                bar.finish_and_clear();
                return Ok(());
            }
            let mut req = self.get(&self.agent, &url);
            if have > 0 {
                req = req.header("Range", format!("bytes={have}-"));
            }
            let result = (|| -> Result<u64> {
                let r = req.call()?;
                let status = r.status().as_u16();
                let mut file = match status {
                    206 if have > 0 => OpenOptions::new().append(true).open(part)?,
                    200 => File::create(part)?,
                    s => return Err(status_error(&f.path, s)),
                };
                let mut body = r.into_body().into_with_config().limit(f.size + 1).reader();
                let mut buf = vec![0u8; 1 << 20];
                let mut got = 0;
                loop {
                    let n = body.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    file.write_all(&buf[..n])?;
                    got += n as u64;
                    bar.inc(n as u64);
                }
                file.sync_data()?;
                Ok(got)
            })();
            match result {
                Ok(_) => {
                    let now = std::fs::metadata(part).map(|m| m.len()).unwrap_or(0);
                    if now < f.size {
                        failures += 1;
                        if failures >= MAX_ATTEMPTS {
                            bail!("{}: the connection keeps closing early ({now} of {} bytes)", f.path, f.size);
                        }
                    }
                }
                Err(e) => {
                    let fatal =
                        e.downcast_ref::<ureq::Error>().is_some_and(|u| matches!(u, ureq::Error::StatusCode(_)))
                            || e.to_string().contains("HTTP ");
                    failures += 1;
                    if fatal || failures >= MAX_ATTEMPTS {
                        bar.finish_and_clear();
                        return Err(e.context(format!("downloading {}", f.path)));
                    }
                    bar.println(format!("{}: {e:#}; resuming", f.path));
                }
            }
        }
    }
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
