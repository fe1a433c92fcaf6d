//! The open connections, and which one is closed to make room for a new one.
//!
//! A connection is *active* while a request of it has arrived whole (head and body) and
//! its response is not yet over (a streamed generation, a file download); otherwise it is
//! idle (waiting for a request, or still receiving one). Room is only ever made by closing
//! an idle connection, the one idle longest: first among the newcomer's own address when
//! that address holds its share, else among all when the table is full. When every
//! candidate is active, the newcomer gets a 503 instead: an active response is never cut.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::{Body, Bytes, HttpBody};

use super::Limits;

/// One open connection.
pub struct ConnState {
    ip: IpAddr,
    /// Told when the connection is chosen to make room.
    pub evict: tokio::sync::Notify,
    /// Requests whose response is in progress.
    active: AtomicUsize,
    /// When its last response ended (or it was accepted).
    idle_since: Mutex<Instant>,
}

impl ConnState {
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire) > 0
    }

    fn idle_since(&self) -> Instant {
        *self.idle_since.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The open connections, oldest first, and how many each client address holds.
#[derive(Default)]
pub struct ConnTable {
    next_id: u64,
    open: BTreeMap<u64, Arc<ConnState>>,
    per_client: HashMap<IpAddr, usize>,
}

impl ConnTable {
    /// Registers a connection from `ip`, closing an idle one to make room where needed
    /// (see the module's comment); None: no room without cutting an active response.
    pub fn admit(&mut self, ip: IpAddr, limits: &Limits) -> Option<(u64, Arc<ConnState>)> {
        let mine = self.per_client.get(&ip).copied().unwrap_or(0);
        let oldest_idle = |own: bool| {
            self.open
                .iter()
                .filter(|(_, c)| (!own || c.ip == ip) && !c.is_active())
                .min_by_key(|(_, c)| c.idle_since())
                .map(|(&id, _)| id)
        };
        let victim = if mine >= limits.max_connections_per_client {
            Some(oldest_idle(true)?)
        } else if self.open.len() >= limits.max_connections {
            Some(oldest_idle(false)?)
        } else {
            None
        };
        if let Some(c) = victim.and_then(|id| self.open.remove(&id)) {
            self.forget(c.ip);
            c.evict.notify_one();
        }
        *self.per_client.entry(ip).or_default() += 1;
        let id = self.next_id;
        self.next_id += 1;
        let c = Arc::new(ConnState {
            ip,
            evict: tokio::sync::Notify::new(),
            active: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
        });
        self.open.insert(id, c.clone());
        Some((id, c))
    }

    /// The connection has ended (an evicted one was forgotten when it was chosen).
    pub fn remove(&mut self, id: u64) {
        if let Some(c) = self.open.remove(&id) {
            self.forget(c.ip);
        }
    }

    fn forget(&mut self, ip: IpAddr) {
        if let Some(n) = self.per_client.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.per_client.remove(&ip);
            }
        }
    }
}

/// One request of a connection (in the request's extensions): [`Activity::mark`] once the
/// request has arrived whole makes the connection active until the response is over.
pub struct Activity {
    conn: Arc<ConnState>,
    marked: AtomicBool,
}

impl Activity {
    pub fn new(conn: Arc<ConnState>) -> Self {
        Activity { conn, marked: AtomicBool::new(false) }
    }

    pub fn mark(&self) {
        if !self.marked.swap(true, Ordering::AcqRel) {
            self.conn.active.fetch_add(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Activity {
    fn drop(&mut self) {
        if *self.marked.get_mut() {
            *self.conn.idle_since.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
            self.conn.active.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// A response body that holds its request's [`Activity`] until it is sent or dropped.
pub struct Tracked {
    inner: Body,
    _activity: Arc<Activity>,
}

impl Tracked {
    pub fn wrap(inner: Body, activity: Arc<Activity>) -> Body {
        Body::new(Tracked { inner, _activity: activity })
    }
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
