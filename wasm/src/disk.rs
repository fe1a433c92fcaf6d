//! The browser's persistent expert tier: OPFS (synchronous access handles) where the
//! browser has it, IndexedDB otherwise, managed under a byte budget ([`DiskBudget`]:
//! pinned experts stay, the others are evicted least recently used first). One interface
//! for `BrowserSource`.

use crate::budget::DiskBudget;
use crate::idb::{Idb, Read};
use crate::opfs::{OpenFail, Opfs};

pub enum Store {
    Opfs(Opfs),
    Idb(Idb),
}

pub struct Disk {
    pub store: Store,
    pub policy: DiskBudget,
}

/// What storing one expert did.
#[derive(Default)]
pub struct Stored {
    /// Experts evicted to make room.
    pub evicted: u64,
    /// Not stored: the pinned experts fill the budget (or it is smaller than the expert).
    pub skipped: bool,
}

/// Which store `storage` asks for: "auto" (OPFS, else IndexedDB), "opfs", "indexeddb";
/// `lens`: bytes of each expert (manifest order); `budget`: bytes the tier may hold.
pub async fn open(storage: &str, name: &str, lens: &[u64], budget: Option<u64>) -> Result<Disk, String> {
    let store = match storage {
        "opfs" => Opfs::open(name, lens).await.map(Store::Opfs).map_err(OpenFail::message),
        "indexeddb" => Idb::open(name).await.map(Store::Idb),
        "auto" => match Opfs::open(name, lens).await {
            Ok(o) => Ok(Store::Opfs(o)),
            // OPFS is there but busy: this tab runs on RAM (the error says why).
            Err(OpenFail::InUse(opfs)) => Err(opfs),
            Err(OpenFail::Other(opfs)) => {
                Idb::open(name).await.map(Store::Idb).map_err(|idb| format!("OPFS: {opfs}; IndexedDB: {idb}"))
            }
        },
        other => Err(format!("unknown storage {other:?} (auto, opfs or indexeddb)")),
    }?;
    let policy = DiskBudget::new(lens.to_vec(), &store.mask(lens.len()), budget);
    let mut d = Disk { store, policy };
    // A budget lowered since the last visit: trim to it now.
    if let Some(v) = d.policy.victims(0) {
        for e in v {
            d.evict(e)?;
        }
    }
    Ok(d)
}

impl Store {
    fn mask(&self, n_experts: usize) -> Vec<bool> {
        match self {
            Store::Opfs(o) => o.mask(),
            Store::Idb(i) => i.mask(n_experts),
        }
    }
}

impl Disk {
    pub fn kind(&self) -> &'static str {
        match self.store {
            Store::Opfs(_) => "opfs",
            Store::Idb(_) => "indexeddb",
        }
    }

    pub fn mask(&self, n_experts: usize) -> Vec<bool> {
        self.store.mask(n_experts)
    }

    /// Whether expert `expert` (manifest order) is stored.
    pub fn holds(&self, expert: usize) -> bool {
        match &self.store {
            Store::Opfs(o) => o.holds(expert),
            Store::Idb(i) => i.holds(expert),
        }
    }

    pub fn count(&self) -> usize {
        match &self.store {
            Store::Opfs(o) => o.count(),
            Store::Idb(i) => i.count(),
        }
    }

    /// Bytes the store's files take (OPFS: the expert file; IndexedDB: the experts).
    pub fn file_bytes(&self) -> u64 {
        match &self.store {
            Store::Opfs(o) => o.file_bytes(),
            Store::Idb(_) => self.policy.stored_bytes(),
        }
    }

    pub fn read(&mut self, expert: usize, buf: &mut [u8]) -> Read {
        let r = match &mut self.store {
            Store::Opfs(o) if o.read(expert, buf) => Read::Hit,
            Store::Opfs(_) => Read::Miss,
            Store::Idb(i) => i.read(expert, buf),
        };
        if matches!(r, Read::Hit) {
            self.policy.touch(expert);
        }
        r
    }

    /// Stores `expert`, evicting others first if the budget needs room.
    pub fn write(&mut self, expert: usize, bytes: &[u8]) -> Result<Stored, String> {
        let Some(victims) = self.policy.victims(bytes.len() as u64) else {
            return Ok(Stored { evicted: 0, skipped: true });
        };
        for &e in &victims {
            self.evict(e)?;
        }
        match &mut self.store {
            Store::Opfs(o) => o.write(expert, bytes),
            Store::Idb(i) => i.write(expert, bytes),
        }?;
        self.policy.stored(expert);
        Ok(Stored { evicted: victims.len() as u64, skipped: false })
    }

    fn evict(&mut self, expert: usize) -> Result<(), String> {
        self.remove(expert)?;
        self.policy.removed(expert, true);
        Ok(())
    }

    fn remove(&mut self, expert: usize) -> Result<(), String> {
        match &mut self.store {
            Store::Opfs(o) => o.forget(expert),
            Store::Idb(i) => i.forget(expert),
        }
    }

    /// Drops an entry whose bytes failed their checksum.
    pub fn forget(&mut self, expert: usize) -> Result<(), String> {
        self.remove(expert)?;
        self.policy.removed(expert, false);
        Ok(())
    }

    pub fn close(&self) {
        match &self.store {
            Store::Opfs(o) => o.close(),
            Store::Idb(i) => i.close(),
        }
    }
}
