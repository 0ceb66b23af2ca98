//! Tool resources tied to the program lifecycle (docs/design.md §10).
//!
//! Agents run tools in sandboxes: containers, per-task directories,
//! processes. A program declares them; when the engine says the program
//! ended, the [`Registry`] reclaims what no other live program still owns,
//! through a pluggable [`Backend`]:
//!
//! - [`LocalSandbox`]: directories under one root, process groups
//!   (SIGTERM, then SIGKILL);
//! - [`DockerBackend`]: containers, their images when unused, volumes, over
//!   the Docker Engine API on its unix socket.
//!
//! [`Environments`] prepares a program's environment in the background while
//! it reasons. [`Tools`] bundles the three for the server. Nothing here knows
//! about HTTP or the engine.

mod backend;
mod docker;
mod environment;
mod error;
mod local;
mod registry;
mod resource;
mod tree;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use backend::{Backend, BoxFuture};
pub use docker::{DockerBackend, DockerConfig};
pub use environment::{
    CommandPolicy, DockerSetup, EnvState, EnvStatus, EnvironmentSpec, Environments, LocalSetup,
};
pub use error::ToolError;
pub use local::{ForeignPids, LocalSandbox};
pub use registry::{
    ProgramResources, ReclaimConfig, Registry, ResourceState, ResourceStatus, ToolMetrics,
};
pub use resource::{Resource, ToolResources};
pub use tree::Cgroups;

/// How the server's tool side is set up (`agentd serve` flags).
#[derive(Debug, Clone)]
pub struct ToolsConfig {
    /// Root of the local sandbox; without it directories are refused.
    pub sandbox_root: Option<PathBuf>,
    /// Between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
    pub docker: DockerConfig,
    pub reclaim: ReclaimConfig,
    /// Reclaim every live program's resources when the server stops.
    pub reclaim_on_exit: bool,
    /// Programs that declared resources but that the engine does not know
    /// (it never ran them, or their request was refused) are ended after
    /// this long without a declaration: the engine's inactivity lease, for
    /// programs outside the engine. `None`: only a release ends them.
    pub orphan_lease: Option<Duration>,
    /// Which client-declared pids may be signalled.
    pub foreign_pids: ForeignPids,
    /// Local setup commands of environments.
    pub commands: CommandPolicy,
}

impl Default for ToolsConfig {
    fn default() -> Self {
        Self {
            sandbox_root: None,
            kill_grace: Duration::from_secs(2),
            docker: DockerConfig::default(),
            reclaim: ReclaimConfig::default(),
            reclaim_on_exit: false,
            orphan_lease: None,
            foreign_pids: ForeignPids::default(),
            commands: CommandPolicy::default(),
        }
    }
}

/// The uid and gid of `user`: a name from /etc/passwd, or `UID[:GID]`.
pub fn resolve_user(user: &str) -> Result<(u32, u32), ToolError> {
    let bad = |reason: String| ToolError::Invalid {
        what: "sandbox user",
        reason,
    };
    if let Some((u, g)) = user.split_once(':') {
        let parse = |s: &str| s.parse::<u32>().map_err(|e| bad(format!("{user}: {e}")));
        return Ok((parse(u)?, parse(g)?));
    }
    if let Ok(uid) = user.parse::<u32>() {
        return Ok((uid, uid));
    }
    let passwd = std::fs::read_to_string("/etc/passwd")
        .map_err(|e| bad(format!("reading /etc/passwd: {e}")))?;
    passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.first() == Some(&user))
        .and_then(|f| Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?)))
        .ok_or_else(|| bad(format!("no user `{user}` in /etc/passwd")))
}

/// The registry, its backends and environment preparation, wired together.
pub struct Tools {
    pub registry: Arc<Registry>,
    pub environments: Arc<Environments>,
    pub reclaim_on_exit: bool,
    pub orphan_lease: Option<Duration>,
}

impl Tools {
    pub fn new(cfg: ToolsConfig) -> Result<Self, ToolError> {
        let local = Arc::new(LocalSandbox::new(
            cfg.sandbox_root.as_deref(),
            cfg.kill_grace,
            cfg.foreign_pids,
        )?);
        // SAFETY: geteuid only reads process state.
        let root_user = unsafe { libc::geteuid() } == 0;
        if cfg.commands.allow && root_user && cfg.commands.user.is_none_or(|(uid, _)| uid == 0) {
            return Err(ToolError::Invalid {
                what: "environment commands",
                reason: "the server runs as root: --allow-environment-commands needs --sandbox-user naming an unprivileged user".into(),
            });
        }
        let cgroups = if cfg.commands.allow {
            Cgroups::detect()
        } else {
            Cgroups::none()
        };
        let docker = Arc::new(DockerBackend::new(cfg.docker));
        let backends: Vec<Arc<dyn Backend>> = vec![local.clone(), docker.clone()];
        let registry = Registry::new(backends, cfg.reclaim);
        let environments =
            Environments::new(registry.clone(), local, docker, cfg.commands, cgroups);
        Ok(Self {
            registry,
            environments,
            reclaim_on_exit: cfg.reclaim_on_exit,
            orphan_lease: cfg.orphan_lease,
        })
    }

    /// Declares a request's `tool_resources` for `program`.
    pub fn declare(&self, program: &str, spec: &ToolResources) -> Result<Vec<Resource>, ToolError> {
        self.registry.declare(program, spec.to_resources()?)
    }

    /// A release call (or the server) ended `program`.
    pub fn program_ended(&self, program: &str, reason: &str) -> usize {
        self.engine_ended(program, reason, None)
    }

    /// The engine ended `program` at `at` (see [`Registry::end_program_at`]).
    pub fn engine_ended(
        &self,
        program: &str,
        reason: &str,
        at: Option<std::time::Instant>,
    ) -> usize {
        let n = self.registry.end_program_at(program, reason, at);
        if self
            .registry
            .program(program)
            .is_none_or(|p| p.ended.is_some())
        {
            self.environments.forget(program);
        }
        n
    }

    /// Ends the live programs the engine does not know (`running` are the
    /// ones it does) that declared nothing for the orphan lease, unless their
    /// environment is still being prepared. Returns the programs ended.
    pub fn sweep_orphans(&self, running: &std::collections::HashSet<String>) -> Vec<String> {
        let Some(lease) = self.orphan_lease else {
            return Vec::new();
        };
        let mut ended = Vec::new();
        for p in self.registry.idle_live_programs(lease) {
            let preparing = self
                .environments
                .status(&p)
                .is_some_and(|s| s.state == EnvState::Pending);
            if running.contains(&p) || preparing {
                continue;
            }
            tracing::info!(program = %p, lease_s = lease.as_secs_f64(), "unknown to the engine and idle past the lease: ending it");
            self.program_ended(&p, "lease_expired");
            ended.push(p);
        }
        ended
    }
}
