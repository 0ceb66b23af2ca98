//! Who is calling: API keys as tenants, and the programs each owns.
//!
//! With no key or a single key there is one tenant and program ids are used
//! as clients send them (as before tenants existed). With several keys
//! (`--api-key` repeated, `--api-key-file`), each key is a tenant and its
//! program ids live in a namespace of their own: the engine and the tool
//! side see `k<N>/<id>`, so tenants cannot name (release, inspect, declare
//! for, list) each other's programs, and equal ids of two tenants are two
//! programs. The caller of a request is set by the auth middleware for the
//! task that runs the handler ([`Caller::current`]).

use std::future::Future;

/// The API keys the server accepts, in tenant order.
#[derive(Debug, Clone, Default)]
pub struct ApiKeys {
    keys: Vec<String>,
}

impl ApiKeys {
    pub fn new(keys: impl IntoIterator<Item = String>) -> Self {
        let mut seen = std::collections::HashSet::new();
        let keys = keys
            .into_iter()
            .map(|k| k.trim().to_string())
            .filter(|k| !k.is_empty() && seen.insert(k.clone()))
            .collect();
        Self { keys }
    }

    /// No key: every client is the one tenant, unauthenticated.
    pub fn is_open(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The caller presenting `token`, if it is one of the keys. Every key
    /// is compared in full, in time independent of where they differ.
    pub fn caller(&self, token: &str) -> Option<Caller> {
        let mut found = None;
        for (i, k) in self.keys.iter().enumerate() {
            if constant_time_eq(k.as_bytes(), token.as_bytes()) {
                found = Some(i);
            }
        }
        let i = found?;
        Some(if self.keys.len() == 1 {
            Caller::default()
        } else {
            Caller { tenant: Some(i) }
        })
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A program as the engine and the tool side know it: the client's id in
/// its tenant's namespace (`k<N>/<id>` with several tenants, the id itself
/// with one), made only by [`Caller::program_key`], so a client's raw id
/// can never reach the engine or the tool registry in its place. The
/// engine names the program's record by it (and mints the numeric
/// `ProgramId` of each of its lives from it); the tool registry and the
/// environments key by it, so a program's tools outlive its record's end
/// and stay visible under the same name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProgramKey(String);

impl ProgramKey {
    pub fn as_str(&self) -> &str {
        &self.0
    }
    pub fn into_string(self) -> String {
        self.0
    }
}

impl std::fmt::Display for ProgramKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The tenant of a request: `None` when there is only one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caller {
    tenant: Option<usize>,
}

tokio::task_local! {
    static CALLER: Caller;
}

impl Caller {
    /// The caller of the request being handled (the single tenant outside
    /// a request).
    pub fn current() -> Caller {
        CALLER.try_with(|c| *c).unwrap_or_default()
    }

    /// Runs `fut` (the rest of the request) as this caller.
    pub async fn scope<F: Future>(self, fut: F) -> F::Output {
        CALLER.scope(self, fut).await
    }

    /// Runs `f` as this caller on a thread outside the request's task (the
    /// blocking pool: [`crate::offload`]).
    pub fn scope_sync<R>(self, f: impl FnOnce() -> R) -> R {
        CALLER.sync_scope(self, f)
    }

    /// The tenant's key (`k<N>`, the prefix of its program keys) when
    /// there are several; `None` for the single tenant.
    pub fn tenant_key(&self) -> Option<String> {
        self.tenant.map(|t| format!("k{t}"))
    }

    /// The key the engine and the tool side know the client's program
    /// `id` by: minted here, at the server's edge, and nowhere else.
    pub fn program_key(&self, id: &str) -> ProgramKey {
        ProgramKey(self.scoped(id))
    }

    /// The tenant-scoped name of the client's rollout group `id` (groups
    /// and programs are separate namespaces).
    pub fn group_key(&self, id: &str) -> String {
        self.scoped(&format!("group:{id}"))
    }

    fn scoped(&self, id: &str) -> String {
        match self.tenant {
            None => id.to_string(),
            Some(t) => format!("k{t}/{id}"),
        }
    }

    /// The client's id of `key` if this caller owns it, else `None`.
    pub fn own<'a>(&self, key: &'a str) -> Option<&'a str> {
        match self.tenant {
            None => Some(key),
            Some(t) => key
                .strip_prefix('k')
                .and_then(|r| r.strip_prefix(t.to_string().as_str()))
                .and_then(|r| r.strip_prefix('/')),
        }
    }

    /// The prefix-cache salt of this tenant's requests (0: the single
    /// tenant shares everything, as before).
    pub fn cache_salt(&self) -> u64 {
        self.tenant.map_or(0, |t| {
            // Any fixed, distinct nonzero value per tenant.
            0x9e37_79b9_7f4a_7c15_u64.wrapping_mul(t as u64 + 1)
        })
    }

    /// The prefix-cache salt of a request of this tenant with the body's
    /// `cache_salt` (vLLM's): the tenant's salt when there is none, else a
    /// 64-bit hash of both, so equal `cache_salt`s of two tenants still
    /// differ and a client cannot pick another tenant's salt (it would need a
    /// 64-bit preimage).
    pub fn prefix_salt(&self, cache_salt: Option<&str>) -> u64 {
        let base = self.cache_salt();
        match cache_salt {
            None => base,
            Some(s) => {
                let mut h = xxhash_rust::xxh3::Xxh3::new();
                h.update(b"agentd-cache-salt");
                h.update(&base.to_le_bytes());
                h.update(s.as_bytes());
                h.digest()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_key_is_one_tenant_with_plain_ids() {
        let keys = ApiKeys::new(["a".to_string()]);
        let c = keys.caller("a").unwrap();
        assert_eq!(c, Caller::default());
        assert_eq!(c.program_key("p").as_str(), "p");
        assert_eq!(c.group_key("g"), "group:g");
        assert!(keys.caller("b").is_none());
        assert!(ApiKeys::new([]).is_open());
    }

    #[test]
    fn several_keys_namespace_program_ids() {
        let keys = ApiKeys::new(["a".into(), "b".into(), "".into()]);
        assert_eq!(keys.len(), 2);
        let (a, b) = (keys.caller("a").unwrap(), keys.caller("b").unwrap());
        let pa = a.program_key("p");
        assert_ne!(pa, b.program_key("p"));
        assert_eq!(pa.as_str(), "k0/p");
        assert_eq!(a.own(pa.as_str()), Some("p"));
        assert_eq!(b.own(pa.as_str()), None);
        assert_eq!(a.group_key("g"), "k0/group:g");
        // Ids that look like another tenant's namespace stay in one's own.
        assert_eq!(b.own(b.program_key("k0/p").as_str()), Some("k0/p"));
        let k11 = ApiKeys::new((0..12).map(|i| format!("key{i}")));
        let (c1, c11) = (k11.caller("key1").unwrap(), k11.caller("key11").unwrap());
        assert_eq!(c1.own(c11.program_key("p").as_str()), None);
        assert_ne!(a.cache_salt(), b.cache_salt());
        assert_eq!(a.prefix_salt(None), a.cache_salt());
        assert_ne!(a.prefix_salt(Some("x")), b.prefix_salt(Some("x")));
        assert_ne!(a.prefix_salt(Some("x")), a.prefix_salt(Some("y")));
        assert_eq!(a.prefix_salt(Some("x")), a.prefix_salt(Some("x")));
        assert_ne!(Caller::default().prefix_salt(Some("x")), 0);
    }
}
