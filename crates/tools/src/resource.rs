//! What a program can declare, as clients write it and as backends see it.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::ToolError;

/// Longest container id, volume name or image reference accepted.
const MAX_NAME_LEN: usize = 256;

/// One reclaimable thing. Paths are canonical and process ids resolved once
/// a backend has admitted them (see [`crate::Backend::admit`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resource {
    /// A Docker container (id or name): stopped and removed, then its image
    /// if no other container uses it.
    DockerContainer(String),
    /// A Docker volume: removed.
    DockerVolume(String),
    /// A directory under the sandbox root: removed recursively.
    Dir(PathBuf),
    /// A process group (its leader's pid): SIGTERM, then SIGKILL.
    ProcessGroup { pid: i32, started: u64 },
    /// A single process that does not lead its group: SIGTERM, then SIGKILL.
    /// (Its group may hold processes the program never declared.)
    Process { pid: i32, started: u64 },
    /// The processes of an environment command agentd started (`root`),
    /// wherever they moved (see `tree.rs`): its cgroup's members, or the
    /// processes carrying `token` or descending from `root`. Never declared
    /// by clients.
    ProcessTree {
        root: i32,
        started: u64,
        token: String,
        cgroup: Option<PathBuf>,
    },
}

impl Resource {
    /// The `kind` clients see.
    pub fn kind(&self) -> &'static str {
        match self {
            Resource::DockerContainer(_) => "docker",
            Resource::DockerVolume(_) => "volume",
            Resource::Dir(_) => "dir",
            Resource::ProcessGroup { .. } => "process_group",
            Resource::Process { .. } => "process",
            Resource::ProcessTree { .. } => "process_tree",
        }
    }

    /// The `id` clients see.
    pub fn id(&self) -> String {
        match self {
            Resource::DockerContainer(s) | Resource::DockerVolume(s) => s.clone(),
            Resource::Dir(p) => p.display().to_string(),
            Resource::ProcessGroup { pid, .. } | Resource::Process { pid, .. } => pid.to_string(),
            Resource::ProcessTree { root, .. } => root.to_string(),
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind(), self.id())
    }
}

/// `tool_resources` as clients send it, e.g.
/// `{"docker": ["3f2a"], "dirs": ["/sandboxes/p1"], "pids": [1234]}`.
/// ThunderAgent's `docker_ids` is read as `docker`. Unknown keys are refused
/// so that a typo does not silently leak a resource.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ToolResources {
    #[serde(default)]
    pub docker: Vec<String>,
    #[serde(default)]
    pub docker_ids: Vec<String>,
    #[serde(default)]
    pub volumes: Vec<String>,
    #[serde(default)]
    pub dirs: Vec<String>,
    #[serde(default)]
    pub pids: Vec<i64>,
}

impl ToolResources {
    /// Parses the JSON value of a `tool_resources` field.
    pub fn from_json(v: &serde_json::Value) -> Result<Self, ToolError> {
        serde_json::from_value(v.clone()).map_err(|e| ToolError::Invalid {
            what: "tool_resources",
            reason: format!(
                "{e} (expected {{\"docker\": [ids], \"docker_ids\": [ids], \"volumes\": [names], \"dirs\": [paths], \"pids\": [pids]}})"
            ),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.docker.is_empty()
            && self.docker_ids.is_empty()
            && self.volumes.is_empty()
            && self.dirs.is_empty()
            && self.pids.is_empty()
    }

    /// The resources as declared, before any backend admitted them. Names
    /// are checked here (they end up in Docker API URLs); paths and pids are
    /// checked by the local backend.
    pub fn to_resources(&self) -> Result<Vec<Resource>, ToolError> {
        let mut out = Vec::new();
        for id in self.docker.iter().chain(&self.docker_ids) {
            check_name("docker container id", id)?;
            out.push(Resource::DockerContainer(id.clone()));
        }
        for v in &self.volumes {
            check_name("volume name", v)?;
            out.push(Resource::DockerVolume(v.clone()));
        }
        for d in &self.dirs {
            if d.is_empty() {
                return Err(ToolError::Invalid {
                    what: "tool_resources.dirs",
                    reason: "an empty path".into(),
                });
            }
            out.push(Resource::Dir(PathBuf::from(d)));
        }
        for &p in &self.pids {
            let pid = i32::try_from(p).map_err(|_| ToolError::Invalid {
                what: "tool_resources.pids",
                reason: format!("{p} is not a process id"),
            })?;
            // The start time is read when the local backend admits it.
            out.push(Resource::Process { pid, started: 0 });
        }
        out.sort();
        out.dedup();
        Ok(out)
    }
}

/// Docker names and ids: `[A-Za-z0-9][A-Za-z0-9_.-]*`, which also keeps
/// them from escaping their place in an API path.
pub fn check_name(what: &'static str, s: &str) -> Result<(), ToolError> {
    let ok = !s.is_empty()
        && s.len() <= MAX_NAME_LEN
        && s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if ok {
        Ok(())
    } else {
        Err(ToolError::Invalid {
            what,
            reason: format!("`{s}` is not a valid Docker name or id ([A-Za-z0-9][A-Za-z0-9_.-]*, at most {MAX_NAME_LEN} bytes)"),
        })
    }
}

/// Image references: `[registry[:port]/]name[:tag][@digest]`.
pub fn check_image(s: &str) -> Result<(), ToolError> {
    let ok = !s.is_empty()
        && s.len() <= MAX_NAME_LEN
        && s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/' | ':' | '@'))
        && !s.contains("..");
    if ok {
        Ok(())
    } else {
        Err(ToolError::Invalid {
            what: "environment.docker.image",
            reason: format!("`{s}` is not a valid image reference"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_docker_spellings_and_refuses_unknown_keys() {
        let r = ToolResources::from_json(&serde_json::json!({
            "docker": ["abc"], "docker_ids": ["def", "abc"], "dirs": ["/s/p1"], "pids": [42]
        }))
        .unwrap();
        let v = r.to_resources().unwrap();
        assert_eq!(
            v,
            vec![
                Resource::DockerContainer("abc".into()),
                Resource::DockerContainer("def".into()),
                Resource::Dir("/s/p1".into()),
                Resource::Process {
                    pid: 42,
                    started: 0
                },
            ]
        );
        let e = ToolResources::from_json(&serde_json::json!({"dir": ["/x"]})).unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
        assert!(e.is_client_error());
    }

    #[test]
    fn docker_names_cannot_escape_their_url() {
        assert!(check_name("id", "abc_1.2-x").is_ok());
        for bad in ["", "../images", "a/b", "a?force=1", "-x", "a b"] {
            assert!(check_name("id", bad).is_err(), "{bad}");
        }
        assert!(check_image("ghcr.io/org/img:1.2@sha256:ab").is_ok());
        assert!(check_image("a/../b").is_err());
        assert!(check_image("a?b").is_err());
        let r = ToolResources {
            pids: vec![1 << 40],
            ..Default::default()
        };
        assert!(r.to_resources().is_err());
    }
}
