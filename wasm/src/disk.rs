//! The browser's persistent expert tier: OPFS (synchronous access handles) where the
//! browser has it, IndexedDB otherwise. One interface for `BrowserSource`.

use crate::idb::{Idb, Read};
use crate::opfs::Opfs;

pub enum Disk {
    Opfs(Opfs),
    Idb(Idb),
}

/// Which store `storage` asks for: "auto" (OPFS, else IndexedDB), "opfs", "indexeddb".
pub async fn open(storage: &str, name: &str, n_experts: usize) -> Result<Disk, String> {
    match storage {
        "opfs" => Opfs::open(name, n_experts).await.map(Disk::Opfs),
        "indexeddb" => Idb::open(name).await.map(Disk::Idb),
        "auto" => match Opfs::open(name, n_experts).await {
            Ok(o) => Ok(Disk::Opfs(o)),
            // OPFS is there but busy: this tab runs on RAM (the error says why).
            Err(opfs) if opfs.starts_with(crate::opfs::IN_USE) => Err(opfs),
            Err(opfs) => Idb::open(name).await.map(Disk::Idb).map_err(|idb| format!("OPFS: {opfs}; IndexedDB: {idb}")),
        },
        other => Err(format!("unknown storage {other:?} (auto, opfs or indexeddb)")),
    }
}

impl Disk {
    pub fn kind(&self) -> &'static str {
        match self {
            Disk::Opfs(_) => "opfs",
            Disk::Idb(_) => "indexeddb",
        }
    }

    pub fn mask(&self, n_experts: usize) -> Vec<bool> {
        match self {
            Disk::Opfs(o) => o.mask(),
            Disk::Idb(i) => i.mask(n_experts),
        }
    }

    pub fn count(&self) -> usize {
        match self {
            Disk::Opfs(o) => o.count(),
            Disk::Idb(i) => i.count(),
        }
    }

    pub fn read(&mut self, expert: usize, buf: &mut [u8]) -> Read {
        match self {
            Disk::Opfs(o) if o.read(expert, buf) => Read::Hit,
            Disk::Opfs(_) => Read::Miss,
            Disk::Idb(i) => i.read(expert, buf),
        }
    }

    pub fn write(&mut self, expert: usize, bytes: &[u8]) -> Result<(), String> {
        match self {
            Disk::Opfs(o) => o.write(expert, bytes),
            Disk::Idb(i) => i.write(expert, bytes),
        }
    }

    pub fn forget(&mut self, expert: usize) -> Result<(), String> {
        match self {
            Disk::Opfs(o) => o.forget(expert),
            Disk::Idb(i) => i.forget(expert),
        }
    }

    pub fn close(&self) {
        match self {
            Disk::Opfs(o) => o.close(),
            Disk::Idb(i) => i.close(),
        }
    }
}
