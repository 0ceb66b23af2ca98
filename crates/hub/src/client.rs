//! A small client of the Hub's file API, the two calls `huggingface_hub`'s
//! `snapshot_download` makes: the file list of a revision
//! (`GET /api/models/{repo}/revision/{rev}?blobs=True`, the query as
//! huggingface_hub spells it) and each file
//! (`GET /{repo}/resolve/{commit}/{file}`, resumable with `Range`).
//!
//! Why not the `hf-hub` crate the issue suggested: measured with `cargo
//! tree -p agentd -e normal` (distinct crates), hf-hub 1.0 with its TLS
//! takes the binary from 264 crates to 363 (+99, among them aws-lc-sys, a
//! CMake/C build of AWS-LC, the whole hf-xet stack, h2 and quinn), this
//! client on ureq + rustls (ring) from 264 to 282 (+18). `cargo build -p
//! agentd-hub` on a warm workspace target took 4m48s of CPU on the 2-core
//! machine (ring, rustls and shared crates rebuilt for its feature set);
//! hf-hub's build was not timed. hf-hub also decides the wire protocol (Xet when the Hub offers it),
//! which a loopback test cannot pin down; the Hub serves every file, Xet
//! ones included, over `resolve`, so plain HTTP loses only Xet's chunk
//! deduplication.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::time::Duration;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::cache::RepoCache;
use crate::error::{HubError, Result};
use crate::progress::Progress;

/// One file of a revision, as the file list gives it.
#[derive(Debug, Clone, Deserialize)]
pub struct Sibling {
    pub rfilename: String,
    #[serde(default)]
    pub size: Option<u64>,
    #[serde(default, rename = "blobId")]
    pub blob_id: Option<String>,
    #[serde(default)]
    pub lfs: Option<Lfs>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Lfs {
    pub sha256: String,
    pub size: u64,
}

impl Sibling {
    /// The blob name huggingface_hub uses: the sha256 of an LFS file, else
    /// the git blob id.
    pub fn etag(&self) -> Option<&str> {
        self.lfs
            .as_ref()
            .map(|l| l.sha256.as_str())
            .or(self.blob_id.as_deref())
    }

    /// The file's size in bytes.
    pub fn bytes(&self) -> Option<u64> {
        self.lfs.as_ref().map(|l| l.size).or(self.size)
    }
}

#[derive(Debug, Deserialize)]
pub struct RepoInfo {
    /// The commit the revision resolves to.
    pub sha: String,
    #[serde(default)]
    pub siblings: Vec<Sibling>,
}

pub struct Client {
    agent: ureq::Agent,
    endpoint: String,
    token: Option<String>,
}

/// Reads this much per write to the partial file (and progress update).
const CHUNK: usize = 1 << 20;

impl Client {
    pub fn new(endpoint: &str, token: Option<String>) -> Self {
        let config = ureq::Agent::config_builder()
            // Statuses are read here: 401 and 404 each get their own message.
            .http_status_as_error(false)
            // The Hub redirects LFS files to its CDN; the token goes to the
            // Hub only, never to another host.
            .redirect_auth_headers(ureq::config::RedirectAuthHeaders::SameHost)
            .timeout_connect(Some(Duration::from_secs(15)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            // A stalled transfer fails (and resumes on the next start)
            // rather than hanging the start for ever.
            .timeout_per_read(Some(Duration::from_secs(60)))
            .user_agent(concat!("agentd/", env!("CARGO_PKG_VERSION")))
            .build();
        Client {
            agent: config.into(),
            endpoint: endpoint.trim_end_matches('/').to_owned(),
            token,
        }
    }

    fn get(&self, url: &str, range_from: u64) -> Result<ureq::http::Response<ureq::Body>> {
        let mut req = self.agent.get(url);
        if let Some(t) = &self.token {
            req = req.header("Authorization", &format!("Bearer {t}"));
        }
        if range_from > 0 {
            req = req.header("Range", &format!("bytes={range_from}-"));
        }
        req.call().map_err(|e| HubError::Http {
            url: url.to_owned(),
            reason: e.to_string(),
        })
    }

    /// The files and commit of `revision`.
    pub fn list(&self, repo: &str, revision: &str) -> Result<RepoInfo> {
        let url = format!(
            "{}/api/models/{repo}/revision/{}?blobs=True",
            self.endpoint,
            encode(revision, false)
        );
        let mut resp = self.get(&url, 0)?;
        let status = resp.status().as_u16();
        if status != 200 {
            let code = resp
                .headers()
                .get("x-error-code")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            return Err(self.status_error(repo, revision, &url, status, &code));
        }
        let text = resp
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .map_err(|e| HubError::Http {
                url: url.clone(),
                reason: e.to_string(),
            })?;
        serde_json::from_str(&text).map_err(|e| HubError::Listing {
            repo: repo.to_owned(),
            detail: format!("is not the JSON expected: {e}"),
        })
    }

    fn status_error(&self, repo: &str, rev: &str, url: &str, status: u16, code: &str) -> HubError {
        let url = url.to_owned();
        match (status, code) {
            (401 | 403, _) => HubError::Unauthorized {
                repo: repo.to_owned(),
                status,
                url,
                token_sent: self.token.is_some(),
            },
            (404, "RevisionNotFound") => HubError::RevisionNotFound {
                repo: repo.to_owned(),
                revision: rev.to_owned(),
                url,
            },
            (404, _) => HubError::RepoNotFound {
                repo: repo.to_owned(),
                url,
            },
            _ => HubError::Status { url, status },
        }
    }

    /// Downloads `file` of `repo` at `commit` into the cache (resuming a
    /// partial download), verifies its size (and sha256 for LFS files) and
    /// links it into the snapshot.
    pub fn download(
        &self,
        repo: &str,
        commit: &str,
        file: &Sibling,
        cache: &RepoCache,
        bar: &Progress,
    ) -> Result<()> {
        let name = &file.rfilename;
        let listing_err = |what: &str| HubError::Listing {
            repo: repo.to_owned(),
            detail: format!("gives no {what} for {name}"),
        };
        let etag = file.etag().ok_or_else(|| listing_err("blob id"))?;
        let size = file.bytes().ok_or_else(|| listing_err("size"))?;
        let blob = cache.blob(etag);
        if blob.metadata().is_ok_and(|m| m.len() == size) {
            bar.inc(size);
            return cache.link(commit, name, etag);
        }
        let blobs = cache.root.join("blobs");
        std::fs::create_dir_all(&blobs).map_err(HubError::io(&blobs))?;
        let partial = blobs.join(format!("{etag}.incomplete"));
        let mut out = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&partial)
            .map_err(HubError::io(&partial))?;
        // Another agentd (or a second replica start) may fetch the same
        // blob: one writer at a time; the second then finds the blob done.
        out.lock().map_err(HubError::io(&partial))?;
        if blob.metadata().is_ok_and(|m| m.len() == size) {
            bar.inc(size);
            return cache.link(commit, name, etag);
        }
        let sha = file.lfs.as_ref().map(|l| l.sha256.to_ascii_lowercase());
        let mut fetch = Fetch {
            client: self,
            repo,
            name,
            partial: &partial,
            size,
            hasher: sha.as_ref().map(|_| Sha256::new()),
        };
        let url = format!(
            "{}/{repo}/resolve/{commit}/{}",
            self.endpoint,
            encode(name, true)
        );
        fetch.run(&mut out, &url, bar)?;
        if let (Some(want), Some(h)) = (sha, fetch.hasher.take()) {
            let got: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
            if got != want {
                drop(out);
                let _ = std::fs::remove_file(&partial);
                return Err(HubError::Corrupt {
                    repo: repo.to_owned(),
                    file: name.clone(),
                    reason: format!("sha256 {got}, the Hub lists {want}"),
                });
            }
        }
        out.sync_all().map_err(HubError::io(&partial))?;
        drop(out);
        std::fs::rename(&partial, &blob).map_err(HubError::io(&blob))?;
        tracing::debug!(file = %name, size, "downloaded");
        cache.link(commit, name, etag)
    }
}

/// One file's transfer into its partial blob.
struct Fetch<'a> {
    client: &'a Client,
    repo: &'a str,
    name: &'a str,
    partial: &'a std::path::Path,
    size: u64,
    hasher: Option<Sha256>,
}

impl Fetch<'_> {
    fn interrupted(&self, reason: String) -> HubError {
        HubError::Interrupted {
            repo: self.repo.to_owned(),
            file: self.name.to_owned(),
            reason,
            partial: self.partial.to_path_buf(),
        }
    }

    /// Hashes what an earlier attempt left, or drops it when it is longer
    /// than the file; returns the bytes kept.
    fn keep_partial(&mut self, out: &mut File) -> Result<u64> {
        let io = HubError::io(self.partial);
        let have = out.metadata().map_err(HubError::io(self.partial))?.len();
        if have > self.size {
            out.set_len(0).map_err(io)?;
            return Ok(0);
        }
        if let Some(h) = &mut self.hasher {
            out.seek(SeekFrom::Start(0)).map_err(io)?;
            let mut buf = vec![0u8; CHUNK];
            loop {
                let n = out.read(&mut buf).map_err(HubError::io(self.partial))?;
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
            }
        }
        Ok(have)
    }

    fn run(&mut self, out: &mut File, url: &str, bar: &Progress) -> Result<()> {
        let mut have = self.keep_partial(out)?;
        let mut resp = if have == self.size {
            None
        } else {
            Some(self.client.get(url, have)?)
        };
        if let Some(r) = &resp {
            match r.status().as_u16() {
                // The server resumes where the partial file ends.
                206 => {}
                // The server sent the whole file: start over.
                200 => {
                    out.set_len(0).map_err(HubError::io(self.partial))?;
                    if let Some(h) = &mut self.hasher {
                        *h = Sha256::new();
                    }
                    have = 0;
                }
                s => {
                    let rev = url.rsplit('/').nth(1).unwrap_or_default();
                    return Err(self.client.status_error(self.repo, rev, url, s, ""));
                }
            }
        }
        out.seek(SeekFrom::Start(have))
            .map_err(HubError::io(self.partial))?;
        bar.inc(have);
        let Some(resp) = resp.as_mut() else {
            return Ok(());
        };
        let mut body = resp.body_mut().as_reader();
        let mut buf = vec![0u8; CHUNK];
        while have < self.size {
            let n = match body.read(&mut buf) {
                Ok(0) => {
                    return Err(self.interrupted(format!(
                        "the connection closed after {have} of {} bytes",
                        self.size
                    )))
                }
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(self.interrupted(format!("{e} after {have} of {} bytes", self.size)))
                }
            };
            // More than the listed size: the listing and the file disagree.
            let n = n.min(usize::try_from(self.size - have).unwrap_or(usize::MAX));
            out.write_all(&buf[..n])
                .map_err(HubError::io(self.partial))?;
            if let Some(h) = &mut self.hasher {
                h.update(&buf[..n]);
            }
            have += n as u64;
            bar.inc(n as u64);
        }
        Ok(())
    }
}

/// Percent-encodes `s` for a URL path (`/` kept when `keep_slash`: file
/// paths in folders; escaped in a revision such as `refs/pr/1`).
pub fn encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn encodes_path_segments() {
        assert_eq!(super::encode("refs/pr/1", false), "refs%2Fpr%2F1");
        assert_eq!(super::encode("a b/c.json", true), "a%20b/c.json");
    }
}
