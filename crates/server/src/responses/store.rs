//! Stored responses: what `GET /v1/responses/{id}` returns and what
//! `previous_response_id` continues. Bounded in count and age; a chain's
//! program is released when its last stored response leaves the store
//! (evicted, expired or deleted), so its KV does not outlive the chain.
//!
//! Eviction is lazy (on every store call): the engine's own inactivity lease
//! ends idle programs meanwhile, so an idle server loses nothing by it.
//!
//! A response belongs to the tenant that created it: to any other caller it
//! does not exist (404 on retrieve, delete, cancel and `previous_response_id`),
//! and its chain's program is counted (and released) under the owner's
//! engine key, whoever's request happens to evict it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use agentd_chat::ChatMessage;
use tokio::sync::Notify;

use super::continuation::Turn;
use super::protocol::ResponseObject;
use crate::tenant::{Caller, ProgramKey};

/// Default most responses kept: at ~10 KB of history each, ~40 MB.
pub const DEFAULT_MAX_RESPONSES: usize = 4096;
/// Default age after which a stored response (and its chain, when it was the
/// last one) is dropped.
pub const DEFAULT_TTL: Duration = Duration::from_secs(3600);

/// One stored response.
#[derive(Clone)]
pub struct Stored {
    pub object: ResponseObject,
    /// The conversation up to and including this response's output, without
    /// `instructions` (OpenAI does not carry them over a chain).
    pub history: Arc<Vec<ChatMessage>>,
    /// Its tokens, for the next turn to extend the program's KV exactly
    /// (empty until it finished).
    pub turn: Arc<Turn>,
    /// The tenant that created it: the only one that can see it.
    pub owner: Caller,
}

impl Stored {
    /// The engine's key of its chain's program.
    fn program_key(&self) -> ProgramKey {
        self.owner.program_key(&self.object.program_id)
    }
}

struct Entry {
    stored: Stored,
    expires: Instant,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    /// Ids in insertion order (oldest first); may hold deleted ids.
    order: VecDeque<String>,
    /// Stored responses per program (engine keys).
    programs: HashMap<ProgramKey, usize>,
    /// Responses being generated, their owner and what wakes them to cancel.
    running: HashMap<String, (Caller, Arc<Notify>)>,
}

pub struct ResponseStore {
    inner: Mutex<Inner>,
    max: usize,
    ttl: Duration,
}

impl Default for ResponseStore {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_RESPONSES, DEFAULT_TTL)
    }
}

impl ResponseStore {
    pub fn new(max: usize, ttl: Duration) -> Self {
        ResponseStore {
            inner: Mutex::new(Inner::default()),
            max: max.max(1),
            ttl,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stores (or updates) a response; returns the programs that ended
    /// because older responses were evicted, for the caller to release.
    pub fn put(&self, stored: Stored) -> Vec<ProgramKey> {
        let mut inner = self.lock();
        let id = stored.object.id.clone();
        if let Some(e) = inner.entries.get_mut(&id) {
            e.stored = stored;
        } else {
            *inner.programs.entry(stored.program_key()).or_default() += 1;
            inner.order.push_back(id.clone());
            let expires = Instant::now() + self.ttl;
            inner.entries.insert(id, Entry { stored, expires });
        }
        self.evict(&mut inner)
    }

    /// A live stored response of `caller`, and programs (engine keys) that
    /// ended by expiry.
    pub fn get(&self, id: &str, caller: Caller) -> (Option<Stored>, Vec<ProgramKey>) {
        let mut inner = self.lock();
        let ended = self.evict(&mut inner);
        let found = inner.entries.get(id).filter(|e| e.stored.owner == caller);
        (found.map(|e| e.stored.clone()), ended)
    }

    /// Deletes a response of `caller`; `None` if unknown (or another
    /// tenant's). The program's engine key is returned when this was its
    /// last stored response.
    pub fn remove(&self, id: &str, caller: Caller) -> Option<(Stored, Option<ProgramKey>)> {
        let mut inner = self.lock();
        if inner.entries.get(id)?.stored.owner != caller {
            return None;
        }
        let e = inner.entries.remove(id)?;
        let ended = unref(&mut inner, &e.stored.program_key());
        Some((e.stored, ended))
    }

    fn evict(&self, inner: &mut Inner) -> Vec<ProgramKey> {
        let now = Instant::now();
        let mut ended = Vec::new();
        while let Some(id) = inner.order.front().cloned() {
            let expired = match inner.entries.get(&id) {
                None => true, // deleted earlier: just drop the id
                Some(e) => e.expires <= now || inner.entries.len() > self.max,
            };
            if !expired {
                break;
            }
            inner.order.pop_front();
            if let Some(e) = inner.entries.remove(&id) {
                tracing::debug!(response = %id, "stored response evicted");
                ended.extend(unref(inner, &e.stored.program_key()));
            }
        }
        ended
    }

    /// Registers a running response; the returned notify fires on cancel.
    pub fn start(&self, id: &str, owner: Caller) -> Arc<Notify> {
        let n = Arc::new(Notify::new());
        self.lock()
            .running
            .insert(id.to_string(), (owner, n.clone()));
        n
    }

    pub fn stop(&self, id: &str) {
        self.lock().running.remove(id);
    }

    /// Cancels a running response of `caller`; false when it is not
    /// running (or another tenant's).
    pub fn cancel(&self, id: &str, caller: Caller) -> bool {
        match self.lock().running.get(id) {
            Some((owner, n)) if *owner == caller => {
                // `notify_one` keeps a permit if nobody waits yet.
                n.notify_one();
                true
            }
            _ => false,
        }
    }
}

/// One stored response of `program` fewer; the program when none is left.
fn unref(inner: &mut Inner, program: &ProgramKey) -> Option<ProgramKey> {
    let n = inner.programs.get_mut(program)?;
    *n = n.saturating_sub(1);
    if *n > 0 {
        return None;
    }
    inner.programs.remove(program);
    Some(program.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::responses::protocol::ResponsesRequest;

    fn stored(id: &str, program: &str) -> Stored {
        let req: ResponsesRequest = serde_json::from_str(r#"{"input":"x"}"#).unwrap();
        Stored {
            object: ResponseObject::started(id.into(), "m".into(), &req, program.into()),
            history: Arc::new(Vec::new()),
            turn: Arc::default(),
            owner: Caller::default(),
        }
    }

    #[test]
    fn another_tenants_response_does_not_exist() {
        let keys = crate::ApiKeys::new(["a".to_string(), "b".to_string()]);
        let (a, b) = (keys.caller("a").unwrap(), keys.caller("b").unwrap());
        let s = ResponseStore::new(1, DEFAULT_TTL);
        s.put(Stored {
            owner: a,
            ..stored("r", "p")
        });
        assert!(s.get("r", b).0.is_none());
        assert!(s.remove("r", b).is_none());
        let _n = s.start("r", a);
        assert!(!s.cancel("r", b));
        assert!(s.cancel("r", a));
        assert!(s.get("r", a).0.is_some());
        // Evicted by b's response: a's program ends under a's engine key.
        assert_eq!(s.put(stored("r2", "p")), vec![a.program_key("p")]);
    }

    #[test]
    fn count_bound_evicts_oldest_and_ends_its_program_last() {
        let s = ResponseStore::new(2, DEFAULT_TTL);
        assert!(s.put(stored("a", "p")).is_empty());
        assert!(s.put(stored("b", "p")).is_empty());
        // "a" goes; "p" still has "b".
        assert!(s.put(stored("c", "q")).is_empty());
        assert!(s.get("a", Caller::default()).0.is_none());
        // "b" goes, and with it the last response of "p".
        let key = |id| Caller::default().program_key(id);
        assert_eq!(s.put(stored("d", "q")), vec![key("p")]);
        let (_, ended) = s.remove("c", Caller::default()).unwrap();
        assert_eq!(ended, None);
        assert_eq!(s.remove("d", Caller::default()).unwrap().1, Some(key("q")));
        assert!(s.remove("d", Caller::default()).is_none());
    }

    #[test]
    fn ttl_expires_responses() {
        let s = ResponseStore::new(10, Duration::from_millis(20));
        s.put(stored("a", "p"));
        assert!(s.get("a", Caller::default()).0.is_some());
        std::thread::sleep(Duration::from_millis(30));
        let (got, ended) = s.get("a", Caller::default());
        assert!(got.is_none());
        assert_eq!(ended, vec![Caller::default().program_key("p")]);
    }

    #[test]
    fn cancel_reaches_a_running_response_only() {
        let s = ResponseStore::default();
        assert!(!s.cancel("a", Caller::default()));
        let _n = s.start("a", Caller::default());
        assert!(s.cancel("a", Caller::default()));
        s.stop("a");
        assert!(!s.cancel("a", Caller::default()));
    }
}
