//! How much memory this process may still take: the tightest of the machine's
//! MemAvailable, the memory cgroup it runs in (v2 `memory.max` and `memory.high`, v1
//! `memory.limit_in_bytes`, each level up to the hierarchy's root, minus what the cgroup
//! already uses) and a limit given by the user. Every automatic budget (the expert cache's
//! `--ram`, the server's conversation caches, the map-or-read choice for checkpoints) is
//! taken from here, so that a helper in a container, a systemd unit with `MemoryMax=` or a
//! Kubernetes pod sizes itself to its limit, not to the host.
//!
//! Everything is read below a root directory (`/` in production, a fixture tree in tests):
//! `proc/self/cgroup` says which cgroup the process is in, `proc/self/mountinfo` where each
//! hierarchy is mounted, and the cgroup's own files give the limits and the usage.

use std::path::{Path, PathBuf};

/// Limits at or above this are "no limit" (cgroup v1 writes 2^63 rounded down to a page).
const UNLIMITED: u64 = 1 << 62;

/// What set a limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// /proc/meminfo's MemAvailable: the whole machine's free memory.
    MemAvailable,
    /// cgroup v2 `memory.max` (the OOM killer's limit).
    CgroupV2Max,
    /// cgroup v2 `memory.high` (above it the kernel throttles and reclaims hard).
    CgroupV2High,
    /// cgroup v1 `memory.limit_in_bytes`.
    CgroupV1,
    /// A limit given by the user (`--mem-limit`, `COLI_MEM_LIMIT`).
    Explicit,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::MemAvailable => "MemAvailable",
            Kind::CgroupV2Max => "cgroup v2 memory.max",
            Kind::CgroupV2High => "cgroup v2 memory.high",
            Kind::CgroupV1 => "cgroup v1 memory.limit_in_bytes",
            Kind::Explicit => "--mem-limit",
        }
    }

    /// Whether the kernel charges the page cache to this limit (a cgroup's does).
    pub fn is_cgroup(self) -> bool {
        matches!(self, Kind::CgroupV2Max | Kind::CgroupV2High | Kind::CgroupV1)
    }
}

/// One limit found: its size, what already counts against it, and where it was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub kind: Kind,
    /// The limit (for MemAvailable: MemAvailable itself).
    pub limit: u64,
    /// What already counts against it and cannot simply be reclaimed: a cgroup's usage
    /// minus its inactive page cache; the process's resident memory for an explicit
    /// limit; 0 for MemAvailable (already net of everything in use).
    pub used: u64,
    /// The cgroup directory whose file set it (None for MemAvailable and explicit ones).
    pub path: Option<PathBuf>,
}

impl Found {
    /// Bytes still free under this limit.
    pub fn available(&self) -> u64 {
        self.limit.saturating_sub(self.used)
    }

    /// "cgroup v1 memory.limit_in_bytes 1.00 GiB at /sys/fs/cgroup/memory/x, 12.0 MiB in use".
    pub fn describe(&self) -> String {
        let mut s = format!("{} {}", self.kind.name(), human(self.limit));
        if let Some(p) = &self.path {
            s += &format!(" at {}", p.display());
        }
        if self.used > 0 {
            s += &format!(", {} in use", human(self.used));
        }
        s
    }
}

/// Every limit found, and the tightest of them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryLimit {
    pub found: Vec<Found>,
}

impl MemoryLimit {
    /// The limit that leaves the least memory free (None: nothing known, e.g. not Linux).
    pub fn tightest(&self) -> Option<&Found> {
        self.found.iter().min_by_key(|f| f.available())
    }

    /// Bytes this process may still take (None: unknown).
    pub fn available(&self) -> Option<u64> {
        self.tightest().map(Found::available)
    }

    /// The tightest cgroup limit (page cache counts against it).
    pub fn cgroup(&self) -> Option<&Found> {
        self.found.iter().filter(|f| f.kind.is_cgroup()).min_by_key(|f| f.available())
    }

    /// One line: how much is free and which limit says so.
    pub fn describe(&self) -> String {
        match self.tightest() {
            Some(f) => format!("{} free: {}", human(f.available()), f.describe()),
            None => "unknown (no /proc/meminfo, no cgroup limit)".into(),
        }
    }

    /// Whether expert reads should bypass the page cache (O_DIRECT) for a model data file
    /// of `file_bytes`: when a cgroup limit leaves less free memory than the file. The
    /// kernel charges a cgroup for the page cache its reads fill; under a limit smaller
    /// than the model, buffered reads keep every expert twice (page cache and expert
    /// cache), and reclaiming the page cache to make room stalls each allocation and pushes
    /// out the pages that matter. Without a cgroup limit the page cache is the machine's
    /// and a warm one speeds up the next run, so reads stay buffered.
    pub fn direct_by_default(&self, file_bytes: u64) -> bool {
        self.cgroup().is_some_and(|c| c.available() < file_bytes)
    }
}

/// The limits of this process: [`detect_at`] on `/`, with `explicit` (`--mem-limit`) or
/// else the `COLI_MEM_LIMIT` environment variable (a byte count) as the user's limit.
pub fn detect(explicit: Option<u64>) -> MemoryLimit {
    let explicit = explicit.or_else(|| std::env::var("COLI_MEM_LIMIT").ok().and_then(|v| parse_size(&v).ok()));
    detect_at(Path::new("/"), explicit)
}

/// The limits as read below `root`: MemAvailable, the cgroup's, and `explicit` (its
/// `used` is the process's resident memory).
pub fn detect_at(root: &Path, explicit: Option<u64>) -> MemoryLimit {
    let mut found = Vec::new();
    if let Some(avail) = read(root, "proc/meminfo").and_then(|t| meminfo_field(&t, "MemAvailable")) {
        found.push(Found { kind: Kind::MemAvailable, limit: avail, used: 0, path: None });
    }
    found.extend(cgroup_limits(root));
    if let Some(limit) = explicit {
        let used = read(root, "proc/self/status").and_then(|t| status_bytes(&t, "VmRSS")).unwrap_or(0);
        found.push(Found { kind: Kind::Explicit, limit, used, path: None });
    }
    MemoryLimit { found }
}

/// Every cgroup memory limit on the process: for each hierarchy that holds the memory
/// controller (v1, v2, or both in hybrid mode), the limit of its cgroup and of every
/// ancestor up to the mount's root (ancestors' limits bind their descendants).
pub fn cgroup_limits(root: &Path) -> Vec<Found> {
    let mut out = Vec::new();
    for g in memory_cgroups(root) {
        if g.v2 {
            walk_up(&g.dir, &g.top, |d| limits_v2(d, &mut out));
        } else {
            walk_up(&g.dir, &g.top, |d| limits_v1(d, &mut out));
        }
    }
    out
}

/// The process's cgroup in a hierarchy that may hold the memory controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryCgroup {
    /// Its directory (under the root given).
    pub dir: PathBuf,
    /// The hierarchy's mount point, where walks up stop.
    pub top: PathBuf,
    /// cgroup v2 (else v1 with the memory controller).
    pub v2: bool,
}

/// The process's cgroups that may carry memory limits: the v1 memory hierarchy's and the
/// v2 one's (a v2 cgroup limits memory only where its files say so).
pub fn memory_cgroups(root: &Path) -> Vec<MemoryCgroup> {
    let (Some(cgroups), Some(mounts)) = (read(root, "proc/self/cgroup"), read(root, "proc/self/mountinfo")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in cgroups.lines() {
        // "hierarchy-id:controller-list:path"; v2 is "0::path".
        let mut f = line.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (f.next(), f.next(), f.next()) else { continue };
        let v2 = id == "0" && ctrls.is_empty();
        if !v2 && !ctrls.split(',').any(|c| c == "memory") {
            continue;
        }
        let Some(mount) = find_mount(&mounts, v2) else { continue };
        if let Some((dir, top)) = cgroup_dir(root, &mount, path) {
            out.push(MemoryCgroup { dir, top, v2 });
        }
    }
    out
}

/// A cgroup mount from mountinfo: its root within the hierarchy and where it is mounted.
struct Mount {
    root: String,
    point: String,
}

/// The mount of the v2 hierarchy, or of the v1 hierarchy with the memory controller.
fn find_mount(mountinfo: &str, v2: bool) -> Option<Mount> {
    mountinfo.lines().find_map(|l| {
        // "id parent maj:min root mountpoint options [optional...] - fstype source superoptions"
        let (left, right) = l.split_once(" - ")?;
        let left: Vec<&str> = left.split_whitespace().collect();
        let right: Vec<&str> = right.split_whitespace().collect();
        let fstype = *right.first()?;
        let ok = if v2 {
            fstype == "cgroup2"
        } else {
            fstype == "cgroup" && right.get(2).is_some_and(|o| o.split(',').any(|x| x == "memory"))
        };
        (ok && left.len() >= 5).then(|| Mount { root: unescape(left[3]), point: unescape(left[4]) })
    })
}

/// mountinfo escapes space, tab, newline and backslash as \ooo octal.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (b[i + 1] - b'0') as u32 * 64 + (b[i + 2] - b'0') as u32 * 8 + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The process's cgroup directory under `root` and the mount point above which the walk
/// stops. The path in /proc/self/cgroup is relative to the hierarchy's root; the mount may
/// show a subtree of it (a container's), whose root mountinfo gives. Where neither
/// reading leads to an existing directory (a cgroup namespace that hides the path), the
/// mount point itself is the process's cgroup.
fn cgroup_dir(root: &Path, m: &Mount, path: &str) -> Option<(PathBuf, PathBuf)> {
    let top = join(root, &m.point);
    let rel = if m.root == "/" {
        Some(path)
    } else {
        path.strip_prefix(m.root.as_str()).filter(|r| r.is_empty() || r.starts_with('/'))
    };
    let candidates = [rel.map(|r| join(&top, r)), Some(join(&top, path)), Some(top.clone())];
    let dir = candidates.into_iter().flatten().find(|d| d.is_dir())?;
    Some((dir, top))
}

fn join(base: &Path, rel: &str) -> PathBuf {
    let rel = rel.trim_start_matches('/');
    if rel.is_empty() {
        base.to_path_buf()
    } else {
        base.join(rel)
    }
}

/// Calls `f` on `dir` and each parent up to and including `top`.
fn walk_up(dir: &Path, top: &Path, mut f: impl FnMut(&Path)) {
    let mut d = dir.to_path_buf();
    loop {
        f(&d);
        if d == top || !d.starts_with(top) || !d.pop() {
            break;
        }
    }
}

/// `memory.max` and `memory.high` of one v2 cgroup ("max": none).
fn limits_v2(dir: &Path, out: &mut Vec<Found>) {
    let used = || {
        let current = read_num(&dir.join("memory.current")).unwrap_or(0);
        let inactive = std::fs::read_to_string(dir.join("memory.stat"))
            .ok()
            .and_then(|t| stat_field(&t, "inactive_file"))
            .unwrap_or(0);
        current.saturating_sub(inactive)
    };
    for (file, kind) in [("memory.max", Kind::CgroupV2Max), ("memory.high", Kind::CgroupV2High)] {
        if let Some(limit) = read_num(&dir.join(file)).filter(|&l| l < UNLIMITED) {
            out.push(Found { kind, limit, used: used(), path: Some(dir.to_path_buf()) });
        }
    }
}

/// `memory.limit_in_bytes` of one v1 cgroup (and, at the process's own level, the
/// hierarchical limit memory.stat reports, which covers ancestors above the mount).
fn limits_v1(dir: &Path, out: &mut Vec<Found>) {
    let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
    let usage = read_num(&dir.join("memory.usage_in_bytes")).unwrap_or(0);
    let inactive = stat_field(&stat, "total_inactive_file").or_else(|| stat_field(&stat, "inactive_file")).unwrap_or(0);
    let used = usage.saturating_sub(inactive);
    let own = read_num(&dir.join("memory.limit_in_bytes")).filter(|&l| l < UNLIMITED);
    let hier = stat_field(&stat, "hierarchical_memory_limit").filter(|&l| l < UNLIMITED);
    // The hierarchical limit can be tighter than every limit visible below the mount.
    if let Some(limit) = [own, hier].into_iter().flatten().min() {
        out.push(Found { kind: Kind::CgroupV1, limit, used, path: Some(dir.to_path_buf()) });
    }
}

fn read(root: &Path, rel: &str) -> Option<String> {
    std::fs::read_to_string(root.join(rel)).ok()
}

/// A file holding one number or "max" (None for "max", a missing file or garbage).
fn read_num(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// "name value" lines of memory.stat.
fn stat_field(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == name).then(|| v.trim().parse().ok()).flatten()
    })
}

/// A field of /proc/meminfo in bytes.
fn meminfo_field(text: &str, field: &str) -> Option<u64> {
    status_bytes(text, field)
}

/// "Field:   123 kB" lines (/proc/meminfo, /proc/self/status) in bytes.
fn status_bytes(text: &str, field: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.strip_prefix(field).is_some_and(|rest| rest.starts_with(':')))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// "1073741824", "512M", "1G", "1.5GiB" (binary units); the reason for anything else.
/// The one byte-count parser: `coli`'s flags (`--ram`, `--mem-limit`, ...) use it too.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let shift = match unit.trim().to_ascii_uppercase().trim_end_matches("IB").trim_end_matches('B') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(format!("{s:?}: unknown unit (use K, M, G or T)")),
    };
    let v: f64 = num.parse().map_err(|_| format!("{s:?} is not a byte count"))?;
    let b = v * (1u64 << shift) as f64;
    if !b.is_finite() || b < 0.0 || b >= u64::MAX as f64 {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(b as u64)
}

/// "1.00 GiB", "12.0 MiB".
pub fn human(b: u64) -> String {
    let f = b as f64;
    if f >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", f / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", f / (1u64 << 20) as f64)
    }
}

#[cfg(test)]
#[path = "memlimit_tests.rs"]
mod tests;
