//! The shared Hugging Face cache, laid out as `huggingface_hub` lays it out
//! so that it, vLLM and agentd find each other's downloads:
//!
//! ```text
//! <cache>/models--owner--name/
//!     refs/<revision>              the commit a branch or tag points at
//!     blobs/<etag>                 file contents (sha256 for LFS files, else the git blob id)
//!     blobs/<etag>.incomplete      a download in progress (resumed with a Range request)
//!     snapshots/<commit>/<file>    relative symlink to ../../blobs/<etag>
//! ```
//!
//! A snapshot file appears only after its blob is complete and verified, so
//! whatever a snapshot holds is whole; a snapshot lacking files is incomplete,
//! never corrupt.

use std::path::{Path, PathBuf};

use crate::error::{HubError, Result};

/// One repository's folder in the cache.
#[derive(Debug, Clone)]
pub struct RepoCache {
    pub root: PathBuf,
}

impl RepoCache {
    /// `models--owner--name` under the cache directory `cache`.
    pub fn new(cache: &Path, repo: &str) -> Self {
        RepoCache {
            root: cache.join(format!("models--{}", repo.replace('/', "--"))),
        }
    }

    /// The commit of `revision`: itself when it is a commit id, else what
    /// `refs/<revision>` records.
    pub fn commit_of(&self, revision: &str) -> Option<String> {
        if is_commit(revision) {
            return Some(revision.to_owned());
        }
        let text = std::fs::read_to_string(self.root.join("refs").join(revision)).ok()?;
        let commit = text.trim();
        is_commit(commit).then(|| commit.to_owned())
    }

    pub fn snapshot(&self, commit: &str) -> PathBuf {
        self.root.join("snapshots").join(commit)
    }

    pub fn blob(&self, etag: &str) -> PathBuf {
        self.root.join("blobs").join(etag)
    }

    /// Records that `revision` points at `commit` (nothing for a commit id).
    pub fn write_ref(&self, revision: &str, commit: &str) -> Result<()> {
        if revision == commit {
            return Ok(());
        }
        let path = self.root.join("refs").join(revision);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(HubError::io(dir))?;
        }
        // Temp name and rename: a reader never sees a half-written ref.
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, commit).map_err(HubError::io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(HubError::io(&path))
    }

    /// Points `snapshots/<commit>/<file>` at the finished blob `etag`.
    pub fn link(&self, commit: &str, file: &str, etag: &str) -> Result<()> {
        let link = self.snapshot(commit).join(file);
        let dir = link.parent().unwrap_or(&self.root).to_path_buf();
        std::fs::create_dir_all(&dir).map_err(HubError::io(&dir))?;
        // `../../blobs/<etag>` from snapshots/<commit>/, one more `..` per
        // folder in `file`, as huggingface_hub writes it.
        let depth = file.matches('/').count() + 2;
        let target: PathBuf = std::iter::repeat_n(Path::new(".."), depth)
            .collect::<PathBuf>()
            .join("blobs")
            .join(etag);
        match std::fs::remove_file(&link) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(HubError::io(&link)(e)),
        }
        symlink_or_copy(&target, &self.blob(etag), &link)
    }
}

#[cfg(unix)]
fn symlink_or_copy(target: &Path, _blob: &Path, link: &Path) -> Result<()> {
    std::os::unix::fs::symlink(target, link).map_err(HubError::io(link))
}

#[cfg(not(unix))]
fn symlink_or_copy(_target: &Path, blob: &Path, link: &Path) -> Result<()> {
    // huggingface_hub copies where symlinks are unavailable; so do we.
    std::fs::copy(blob, link)
        .map(drop)
        .map_err(HubError::io(link))
}

/// A full 40-hex-digit git commit id.
pub fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The files of `dir` a model needs that are missing: `config.json`,
/// `tokenizer.json` (unless `tokenizer_elsewhere`) and the weights
/// (`model.safetensors`, or the index and every shard it lists).
pub fn missing_files(dir: &Path, tokenizer_elsewhere: bool) -> Vec<String> {
    let mut missing = Vec::new();
    let mut need = |name: &str| {
        if !dir.join(name).is_file() {
            missing.push(name.to_owned());
        }
    };
    need("config.json");
    if !tokenizer_elsewhere {
        need("tokenizer.json");
    }
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        match shards_of(&index) {
            Some(shards) => shards.iter().for_each(|s| need(s)),
            None => missing.push("model.safetensors.index.json (unreadable)".to_owned()),
        }
    } else if !dir.join("model.safetensors").is_file() {
        // Either form would do; name the one a single-file model has.
        missing.push("model.safetensors (or model.safetensors.index.json)".to_owned());
    }
    missing
}

/// The shard file names of a `model.safetensors.index.json`.
fn shards_of(index: &Path) -> Option<Vec<String>> {
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(index).ok()?).ok()?;
    let mut shards: Vec<String> = v
        .get("weight_map")?
        .as_object()?
        .values()
        .filter_map(|f| f.as_str().map(str::to_owned))
        .collect();
    shards.sort();
    shards.dedup();
    Some(shards)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refs_snapshots_and_missing_files() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = RepoCache::new(tmp.path(), "acme/tiny");
        assert!(repo.root.ends_with("models--acme--tiny"));
        let commit = "0123456789abcdef0123456789abcdef01234567";
        assert_eq!(repo.commit_of("main"), None);
        repo.write_ref("main", commit).unwrap();
        assert_eq!(repo.commit_of("main").as_deref(), Some(commit));
        assert_eq!(repo.commit_of(commit).as_deref(), Some(commit));

        let snap = repo.snapshot(commit);
        std::fs::create_dir_all(repo.root.join("blobs")).unwrap();
        std::fs::write(repo.blob("e1"), "{}").unwrap();
        repo.link(commit, "config.json", "e1").unwrap();
        assert_eq!(
            std::fs::read_to_string(snap.join("config.json")).unwrap(),
            "{}"
        );
        let missing = missing_files(&snap, false);
        assert_eq!(missing.len(), 2, "{missing:?}");
        assert!(missing[0] == "tokenizer.json" && missing[1].starts_with("model.safetensors"));

        // A sharded checkpoint needs each shard its index lists.
        let index =
            r#"{"weight_map":{"a":"m-1.safetensors","b":"m-2.safetensors","c":"m-1.safetensors"}}"#;
        std::fs::write(repo.blob("e2"), index).unwrap();
        repo.link(commit, "model.safetensors.index.json", "e2")
            .unwrap();
        std::fs::write(repo.blob("e3"), "x").unwrap();
        repo.link(commit, "m-1.safetensors", "e3").unwrap();
        assert_eq!(missing_files(&snap, true), ["m-2.safetensors"]);
        // Files in folders link back with one more `..` per folder.
        repo.link(commit, "sub/x.json", "e1").unwrap();
        assert_eq!(
            std::fs::read_to_string(snap.join("sub/x.json")).unwrap(),
            "{}"
        );
    }
}
