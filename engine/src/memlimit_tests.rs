//! memlimit against fixture file trees: the files a kernel shows for cgroup v2, v1,
//! hybrid mounts, containers' subtree mounts and nested cgroups.

use super::*;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A scratch root with `files` (relative path, contents) written into it.
fn tree(tag: &str, files: &[(&str, String)]) -> PathBuf {
    let root = std::env::temp_dir().join(format!("colibri-memlimit-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    for (rel, text) in files {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    root
}

fn meminfo(avail: u64) -> (&'static str, String) {
    ("proc/meminfo", format!("MemTotal:       {} kB\nMemAvailable:   {} kB\n", 64 * GIB / 1024, avail / 1024))
}

const V2_MOUNT: &str = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
const V1_MOUNTS: &str = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n\
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n\
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

#[test]
fn v2_nested_takes_the_tightest_level_and_memory_high() {
    let d = "sys/fs/cgroup/user.slice/app.service";
    let root = tree(
        "v2",
        &[
            meminfo(20 * GIB),
            ("proc/self/cgroup", "0::/user.slice/app.service\n".into()),
            ("proc/self/mountinfo", V2_MOUNT.into()),
            // The service itself: no max, a memory.high of 768 MiB, 100 MiB charged of
            // which 40 MiB inactive page cache.
            (&format!("{d}/memory.max"), "max\n".into()),
            (&format!("{d}/memory.high"), format!("{}\n", 768 * MIB)),
            (&format!("{d}/memory.current"), format!("{}\n", 100 * MIB)),
            (&format!("{d}/memory.stat"), format!("anon 60000000\nfile 1000\ninactive_file {}\n", 40 * MIB)),
            // The slice above: memory.max of 1 GiB, 900 MiB in use by everything in it.
            ("sys/fs/cgroup/user.slice/memory.max", format!("{}\n", GIB)),
            ("sys/fs/cgroup/user.slice/memory.high", "max\n".into()),
            ("sys/fs/cgroup/user.slice/memory.current", format!("{}\n", 900 * MIB)),
            ("sys/fs/cgroup/user.slice/memory.stat", "inactive_file 0\n".into()),
            // The root cgroup has no limit files at all.
            ("sys/fs/cgroup/memory.stat", "inactive_file 0\n".into()),
        ],
    );
    let m = detect_at(&root, None);
    let kinds: Vec<Kind> = m.found.iter().map(|f| f.kind).collect();
    assert_eq!(kinds, [Kind::MemAvailable, Kind::CgroupV2High, Kind::CgroupV2Max], "{m:?}");
    let high = &m.found[1];
    assert_eq!((high.limit, high.used), (768 * MIB, 60 * MIB));
    assert_eq!(high.path.as_deref(), Some(root.join(d).as_path()));
    // The slice's limit leaves less (1 GiB - 900 MiB) than the service's own.
    let t = m.tightest().unwrap();
    assert_eq!((t.kind, t.available()), (Kind::CgroupV2Max, 124 * MIB));
    assert_eq!(m.available(), Some(124 * MIB));
    assert!(m.describe().contains("cgroup v2 memory.max 1.00 GiB at"), "{}", m.describe());
    assert!(m.describe().contains("user.slice"), "{}", m.describe());
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn v2_max_everywhere_is_no_limit() {
    let root = tree(
        "v2max",
        &[
            meminfo(8 * GIB),
            ("proc/self/cgroup", "0::/a\n".into()),
            ("proc/self/mountinfo", V2_MOUNT.into()),
            ("sys/fs/cgroup/a/memory.max", "max\n".into()),
            ("sys/fs/cgroup/a/memory.high", "max\n".into()),
            ("sys/fs/cgroup/a/memory.current", "5000\n".into()),
        ],
    );
    let m = detect_at(&root, None);
    assert_eq!(m.found.len(), 1);
    assert_eq!(m.tightest().unwrap().kind, Kind::MemAvailable);
    assert_eq!(m.available(), Some(8 * GIB));
    assert!(m.cgroup().is_none());
    assert!(!m.direct_by_default(100 * GIB), "no cgroup limit: reads stay buffered");
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn v1_hybrid_reads_the_memory_hierarchy_and_subtracts_usage() {
    let d = "sys/fs/cgroup/memory/process_api/abc";
    let root = tree(
        "v1",
        &[
            meminfo(20 * GIB),
            ("proc/self/cgroup", "9:name=systemd:/\n5:devices:/\n4:memory:/process_api/abc\n1:cpu:/\n0::/\n".into()),
            ("proc/self/mountinfo", V1_MOUNTS.into()),
            (&format!("{d}/memory.limit_in_bytes"), format!("{}\n", GIB)),
            (&format!("{d}/memory.usage_in_bytes"), format!("{}\n", 300 * MIB)),
            (
                &format!("{d}/memory.stat"),
                format!(
                    "cache 1\ninactive_file 7\nhierarchical_memory_limit {}\ntotal_inactive_file {}\n",
                    GIB,
                    100 * MIB
                ),
            ),
            // Unlimited above (2^63 rounded down to a page, as v1 writes it).
            ("sys/fs/cgroup/memory/process_api/memory.limit_in_bytes", "9223372036854771712\n".into()),
            ("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n".into()),
            // The unified hierarchy exists but holds no memory controller (hybrid mode).
            ("sys/fs/cgroup/unified/cgroup.controllers", "\n".into()),
        ],
    );
    let m = detect_at(&root, None);
    let c = m.cgroup().expect("the v1 limit");
    assert_eq!((c.kind, c.limit, c.used), (Kind::CgroupV1, GIB, 200 * MIB));
    assert_eq!(c.path.as_deref(), Some(root.join(d).as_path()));
    assert_eq!(m.available(), Some(824 * MIB));
    assert_eq!(m.found.len(), 2, "{m:?}");
    // A 2 GB model does not fit what the cgroup leaves: O_DIRECT; a 500 MB one does.
    assert!(m.direct_by_default(2_000_000_000));
    assert!(!m.direct_by_default(500_000_000));
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn v1_container_view_uses_the_mount_root_and_the_hierarchical_limit() {
    // Inside a container: the mount shows the container's own subtree, /proc/self/cgroup
    // the full path; the limit is set above what is visible, so only memory.stat's
    // hierarchical_memory_limit knows it.
    let root = tree(
        "v1ns",
        &[
            meminfo(20 * GIB),
            ("proc/self/cgroup", "4:memory:/docker/0123abcd\n".into()),
            (
                "proc/self/mountinfo",
                "35 31 0:32 /docker/0123abcd /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n".into(),
            ),
            ("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n".into()),
            ("sys/fs/cgroup/memory/memory.usage_in_bytes", format!("{}\n", 10 * MIB)),
            ("sys/fs/cgroup/memory/memory.stat", format!("hierarchical_memory_limit {}\n", 512 * MIB)),
        ],
    );
    let m = detect_at(&root, None);
    let c = m.cgroup().expect("the hierarchical limit");
    assert_eq!((c.limit, c.used), (512 * MIB, 10 * MIB));
    assert_eq!(c.path.as_deref(), Some(root.join("sys/fs/cgroup/memory").as_path()));
    assert_eq!(m.available(), Some(502 * MIB));
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn v1_namespaced_path_falls_back_to_the_mount_point_and_unescapes_it() {
    // A cgroup namespace shows "/" in /proc/self/cgroup; the mount point has a space.
    let root = tree(
        "v1esc",
        &[
            ("proc/self/cgroup", "4:memory:/\n".into()),
            ("proc/self/mountinfo", "35 31 0:32 / /cg\\040mem rw - cgroup cgroup rw,memory,nosuid\n".into()),
            ("cg mem/memory.limit_in_bytes", format!("{}\n", 256 * MIB)),
        ],
    );
    let m = detect_at(&root, None);
    assert_eq!(m.found.len(), 1, "no meminfo in this tree: only the cgroup");
    assert_eq!(m.available(), Some(256 * MIB));
    assert_eq!(m.tightest().unwrap().path.as_deref(), Some(root.join("cg mem").as_path()));
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn explicit_limit_counts_the_process_resident_memory() {
    let root = tree(
        "explicit",
        &[meminfo(20 * GIB), ("proc/self/status", "Name: coli\nVmHWM:  9000 kB\nVmRSS:  10240 kB\n".into())],
    );
    let m = detect_at(&root, Some(GIB));
    let t = m.tightest().unwrap();
    assert_eq!((t.kind, t.limit, t.used), (Kind::Explicit, GIB, 10 * MIB));
    assert!(!m.direct_by_default(100 * GIB), "an explicit limit does not charge the page cache");
    // A limit above what the machine has free changes nothing.
    let m = detect_at(&root, Some(100 * GIB));
    assert_eq!(m.tightest().unwrap().kind, Kind::MemAvailable);
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn nothing_readable_is_unknown() {
    let root = tree("empty", &[("proc/self/cgroup", "garbage\n0::\n".into())]);
    let m = detect_at(&root, None);
    assert!(m.found.is_empty());
    assert_eq!(m.available(), None);
    assert!(m.describe().starts_with("unknown"));
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn sizes_parse() {
    assert_eq!(parse_size("512M"), Ok(512 * MIB));
    assert_eq!(parse_size("1.5GiB"), Ok(3 * GIB / 2));
    assert_eq!(parse_size("1073741824"), Ok(GIB));
    assert!(parse_size("lots").is_err());
    assert!(parse_size("5Q").unwrap_err().contains("unknown unit"));
}

#[cfg(target_os = "linux")]
#[test]
fn this_machine_has_meminfo() {
    let m = detect(None);
    assert!(m.found.iter().any(|f| f.kind == Kind::MemAvailable), "{m:?}");
    assert!(m.available().unwrap() > 0);
}
