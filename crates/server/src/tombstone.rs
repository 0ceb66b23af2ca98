//! Releases of programs that do not exist yet, remembered briefly.
//!
//! A client that sends a program's first request and its release at once
//! can have the release arrive first: it finds nothing (404), and the
//! request then creates a program that nobody will release, holding KV and
//! tool resources until the lease. Remembering the release for
//! [`TOMBSTONE_TTL`] lets that request run as the program's `final` one.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::tenant::ProgramKey;

/// Long enough to cover a request racing its release (milliseconds apart,
/// seconds behind a queueing proxy), short enough that a client reusing the
/// id for a new program soon after a mistaken release is not surprised.
pub const TOMBSTONE_TTL: Duration = Duration::from_secs(30);
/// Bound on remembered releases (ids are up to 256 bytes: ~17 MB at most),
/// so a client releasing random ids cannot grow the map without end.
const MAX_TOMBSTONES: usize = 65_536;

#[derive(Default)]
pub struct Tombstones {
    released: Mutex<HashMap<ProgramKey, Instant>>,
}

impl Tombstones {
    /// Remembers a release of `key`, which is not (yet) a program.
    pub fn remember(&self, key: &ProgramKey) {
        let now = Instant::now();
        let mut map = self.released.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MAX_TOMBSTONES {
            map.retain(|_, at| now.duration_since(*at) < TOMBSTONE_TTL);
        }
        if map.len() >= MAX_TOMBSTONES {
            tracing::warn!(
                limit = MAX_TOMBSTONES,
                "too many recent releases of unknown programs: not remembering this one"
            );
            return;
        }
        map.insert(key.clone(), now);
    }

    /// Whether `key` was released (while unknown) within the TTL; the
    /// tombstone is consumed, so only the racing request is affected.
    pub fn take(&self, key: &ProgramKey) -> bool {
        let mut map = self.released.lock().unwrap_or_else(|e| e.into_inner());
        map.remove(key)
            .is_some_and(|at| at.elapsed() < TOMBSTONE_TTL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::Caller;

    #[test]
    fn a_release_is_remembered_once() {
        let t = Tombstones::default();
        let p = Caller::default().program_key("p");
        assert!(!t.take(&p));
        t.remember(&p);
        assert!(t.take(&p));
        assert!(!t.take(&p), "consumed by the first request");
    }
}
