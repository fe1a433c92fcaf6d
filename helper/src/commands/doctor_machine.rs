//! `coli doctor`'s checks of the machine: what the chat page, the widget and the native
//! commands need before any model is involved. A missing piece is a warning (with what to
//! do), never a failure: each one only disables part of colibri.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use crate::commands::doctor_report::Report;
use crate::commands::info::human;

/// Free space below which `disk` warns: room for a small converted model.
const LOW_DISK: u64 = 2 << 30;
/// The disk-speed probe: a scratch file this large, read back in pieces of an expert's
/// size, a few at a time (as the expert cache reads).
const SPEED_PROBE_BYTES: u64 = 32 << 20;
const SPEED_PROBE_CHUNK: usize = 256 << 10;
const SPEED_PROBE_THREADS: usize = 4;
/// Random-read speed below which `disk speed` warns (a slow USB stick, a network share).
const SLOW_DISK: f64 = 100e6;

/// The memory the automatic budgets (`--ram`, the server's conversation caches) are taken
/// from: the tightest of MemAvailable, the memory cgroup's limit less its usage, and
/// COLI_MEM_LIMIT, and where it comes from. A cgroup limit is a warning when it leaves less
/// than `SMALL_LIMIT`: models then stream most experts from disk.
pub fn memory_limit(r: &mut Report) {
    let l = colibri_engine::memlimit::detect(None);
    let Some(t) = l.tightest() else { return r.warn("memory limit", "unknown on this platform") };
    let reads = if t.kind.is_cgroup() {
        "; expert reads bypass the page cache (O_DIRECT) for models larger than that"
    } else {
        ""
    };
    let line = format!("{} free for colibri's budgets: {}{reads}", human(t.available()), t.describe());
    if t.kind.is_cgroup() && t.available() < SMALL_LIMIT {
        r.warn("memory limit", format!("{line}; a small limit: most experts will stream from disk"))
    } else {
        r.ok("memory limit", line)
    }
}

/// A cgroup limit below this leaves little room for an expert cache.
const SMALL_LIMIT: u64 = 1 << 30;

/// The browser engine (web/pkg, web/pkg-threads) embedded in this binary.
pub fn web_engine(r: &mut Report) {
    let (one, threads) = crate::serve::embedded_engine();
    match (one, threads) {
        (Some(a), Some(b)) => r.ok("web engine", format!("built in: one-thread {}, threaded {}", human(a), human(b))),
        (Some(a), None) => r.ok(
            "web engine",
            format!("built in: one-thread {} (no threaded build: pages run the CPU backend on one thread)", human(a)),
        ),
        _ => r.warn(
            "web engine",
            "not built into this coli: the chat page and the widget cannot run models; run tools/build-web.sh, then rebuild coli",
        ),
    }
}

/// The Vulkan adapter `--backend wgpu` would use: its name, or why there is none.
pub fn adapter() -> std::result::Result<String, String> {
    #[cfg(feature = "wgpu")]
    {
        // As in crate::backend: Mesa's device-select layer only reorders adapters.
        if std::env::var_os("NODEVICE_SELECT").is_none() {
            std::env::set_var("NODEVICE_SELECT", "1");
        }
        colibri_engine::gpu::GpuContext::new_blocking().map(|ctx| ctx.adapter_name).map_err(|e| e.to_string())
    }
    #[cfg(not(feature = "wgpu"))]
    Err("this coli was built without the wgpu feature: --backend wgpu is not available".into())
}

/// A Vulkan adapter for `--backend wgpu`.
pub fn gpu(r: &mut Report) {
    match adapter() {
        Ok(name) => r.ok("vulkan", format!("{name} (--backend wgpu works)")),
        Err(e) => r.warn("vulkan", format!("{e}: --backend wgpu will not work; the CPU backend does")),
    }
}

/// A helper answering `/health` on 127.0.0.1:`port` (what the chat page and the widget use).
pub fn helper(r: &mut Report, port: u16) {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let url = format!("http://127.0.0.1:{port}");
    let start = if port == 7878 { "coli serve".to_string() } else { format!("coli serve --port {port}") };
    let conn = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1));
    if conn.is_err() {
        r.warn(
            "helper",
            format!("none on {url}: start one with `{start}` (or `coli service install`) to chat in a browser"),
        );
        return;
    }
    drop(conn);
    let health = crate::serve::client::Conn::open(addr).and_then(|mut c| {
        c.stream().set_read_timeout(Some(Duration::from_secs(3)))?;
        c.request("GET", "/health", &[], b"")
    });
    match health {
        Ok(resp) if resp.status == 200 && resp.json()["status"] == "ok" => {
            let v = resp.json();
            let version = v["version"].as_str().unwrap_or("?").to_string();
            let up = v["uptime_s"].as_u64().unwrap_or(0);
            r.ok("helper", format!("coli {version} answers at {url} (up {}); open it to chat", uptime(up)));
        }
        _ => r.warn(
            "helper",
            format!(
                "something on {url} is not a colibri helper: start coli on another port with `coli serve --port N`"
            ),
        ),
    }
}

fn uptime(s: u64) -> String {
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        _ => format!("{} h", s / 3600),
    }
}

/// Installed models (and the built-in demo, installed on first use).
pub fn models(r: &mut Report, models_dir: Option<&Path>) {
    let installed = models_dir.map(crate::paths::installed_models).unwrap_or_default();
    let dir =
        models_dir.map_or("(no models directory: set COLI_HOME or HOME)".to_string(), |d| d.display().to_string());
    if installed.is_empty() {
        let hint = "; the built-in demo model is there (`--model demo`)";
        r.warn("models", format!("none installed in {dir}: `coli pull REPO` adds one{hint}"));
        return;
    }
    let mut ids: Vec<&str> = installed.iter().map(|(id, _)| id.as_str()).collect();
    let n = ids.len();
    ids.truncate(6);
    let more = if n > ids.len() { format!(", and {} more", n - ids.len()) } else { String::new() };
    let demo = if !installed.iter().any(|(id, _)| id == "demo") { "; and the built-in demo" } else { "" };
    r.ok("models", format!("{n} installed in {dir}: {}{more}{demo}", ids.join(", ")));
}

/// Free space where models are installed (or the nearest existing folder above it).
pub fn disk(r: &mut Report, models_dir: Option<&Path>) {
    let Some(mut at) = models_dir.map(Path::to_path_buf).or_else(|| std::env::current_dir().ok()) else {
        return r.warn("disk", "no models directory to check");
    };
    while !at.exists() {
        match at.parent() {
            Some(p) => at = p.to_path_buf(),
            None => break,
        }
    }
    match free_bytes(&at) {
        Some(free) if free < LOW_DISK => r.warn(
            "disk",
            format!("only {} free at {}: models need room (coli pull, coli convert)", human(free), at.display()),
        ),
        Some(free) => r.ok("disk", format!("{} free at {}", human(free), at.display())),
        None => r.warn("disk", format!("cannot tell the free space at {}", at.display())),
    }
    disk_speed(r, &at);
}

/// How fast the disk under `at` reads what the expert cache reads: the O_DIRECT probe of
/// `coli plan` (crate::probe::scratch_reads) on a small scratch file, deleted afterwards.
fn disk_speed(r: &mut Report, at: &Path) {
    if free_bytes(at).is_some_and(|f| f < 4 * SPEED_PROBE_BYTES) {
        return r.warn("disk speed", format!("not measured: too little free space at {}", at.display()));
    }
    let what = format!("random {} KiB reads", SPEED_PROBE_CHUNK >> 10);
    match crate::probe::scratch_reads(at, SPEED_PROBE_BYTES, SPEED_PROBE_CHUNK, SPEED_PROBE_THREADS) {
        Ok((speed, how)) if speed < SLOW_DISK => r.warn(
            "disk speed",
            format!(
                "{}/s ({what}, {how}) at {}: slow; experts read from it will limit decoding (give more --ram)",
                human(speed as u64),
                at.display()
            ),
        ),
        Ok((speed, how)) => {
            r.ok("disk speed", format!("{}/s ({what}, {how}) at {}", human(speed as u64), at.display()))
        }
        Err(e) => r.warn("disk speed", format!("not measured at {}: {e:#}", at.display())),
    }
}

#[cfg(unix)]
fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs only writes the struct it is given; all-zero bytes are a valid value
    // of this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path that outlives the call; `st` is a valid out-pointer.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    #[allow(clippy::unnecessary_cast)] // the field types differ between platforms
    (rc == 0).then(|| st.f_bavail as u64 * st.f_frsize as u64)
}

#[cfg(not(unix))]
fn free_bytes(_: &Path) -> Option<u64> {
    None
}
