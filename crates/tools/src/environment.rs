//! Asynchronous environment preparation: a program asks for its tool
//! environment (a Docker container of an image, or a local setup command in
//! its own directory) and preparation starts at once in the background,
//! overlapping the program's reasoning; the tool side polls or long-polls
//! for readiness. What preparation creates becomes the program's resources
//! as soon as it exists, so it is reclaimed with the program even if the
//! program ends mid-preparation.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::docker::DockerBackend;
use crate::error::ToolError;
use crate::local::LocalSandbox;
use crate::registry::Registry;
use crate::resource::{check_image, Resource};
use crate::tree::{self, Cgroups};

/// Longest preparation allowed.
const MAX_TIMEOUT_S: f64 = 3600.0;
const DEFAULT_TIMEOUT_S: f64 = 300.0;
/// Output kept from a failed setup command.
const OUTPUT_TAIL: usize = 2048;

/// `POST /programs/{id}/environment`: exactly one of `local` or `docker`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EnvironmentSpec {
    pub local: Option<LocalSetup>,
    pub docker: Option<DockerSetup>,
}

/// A shell command run by `sh -c` in its own process group, in a directory
/// under the sandbox root (`workdir`, relative to the root; default
/// `env-<program>`), killed after `timeout_s`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LocalSetup {
    pub command: String,
    pub workdir: Option<String>,
    pub timeout_s: Option<f64>,
}

/// A container of `image` (pulled unless present), started with `cmd`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DockerSetup {
    pub image: String,
    pub cmd: Option<Vec<String>>,
    pub timeout_s: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EnvState {
    Pending,
    Ready,
    Failed,
}

/// `GET /programs/{id}/environment`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EnvStatus {
    pub program_id: String,
    pub state: EnvState,
    /// "local" or "docker".
    pub kind: &'static str,
    /// Unix seconds.
    pub started_at: f64,
    pub finished_at: Option<f64>,
    pub duration_s: Option<f64>,
    pub error: Option<String>,
    /// The directory (local) or container id (docker) once created.
    pub workdir: Option<String>,
    pub container: Option<String>,
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn timeout_of(t: Option<f64>, what: &'static str) -> Result<Duration, ToolError> {
    let s = t.unwrap_or(DEFAULT_TIMEOUT_S);
    if !(s.is_finite() && s > 0.0 && s <= MAX_TIMEOUT_S) {
        return Err(ToolError::Invalid {
            what,
            reason: format!("timeout_s must be in (0, {MAX_TIMEOUT_S}], got {s}"),
        });
    }
    Ok(Duration::from_secs_f64(s))
}

/// What local setup commands may do (the trust boundary: README, "Tool
/// resources").
#[derive(Debug, Clone, Default)]
pub struct CommandPolicy {
    /// Local setup commands run at all (`--allow-environment-commands`).
    pub allow: bool,
    /// Run them as this uid and gid (`--sandbox-user`).
    pub user: Option<(u32, u32)>,
    /// Address-space limit of each command and its children, bytes
    /// (`RLIMIT_AS`; also `memory.max` where the cgroup has the memory
    /// controller).
    pub memory_max: Option<u64>,
}

pub struct Environments {
    registry: Arc<Registry>,
    local: Arc<LocalSandbox>,
    docker: Arc<DockerBackend>,
    envs: Mutex<HashMap<String, watch::Sender<EnvStatus>>>,
    policy: CommandPolicy,
    cgroups: Cgroups,
    /// Names environments' cgroups uniquely.
    started: AtomicU64,
}

impl Environments {
    pub fn new(
        registry: Arc<Registry>,
        local: Arc<LocalSandbox>,
        docker: Arc<DockerBackend>,
        policy: CommandPolicy,
        cgroups: Cgroups,
    ) -> Arc<Self> {
        Arc::new(Self {
            registry,
            local,
            docker,
            envs: Mutex::new(HashMap::new()),
            policy,
            cgroups,
            started: AtomicU64::new(0),
        })
    }

    /// Checks `spec` and starts preparing; returns the pending status at
    /// once. Must be called inside a tokio runtime.
    pub fn start(
        self: &Arc<Self>,
        program: &str,
        spec: EnvironmentSpec,
    ) -> Result<EnvStatus, ToolError> {
        let mut envs = self.envs.lock().unwrap_or_else(|e| e.into_inner());
        if envs
            .get(program)
            .is_some_and(|tx| tx.borrow().state == EnvState::Pending)
        {
            return Err(ToolError::AlreadyPreparing(program.to_string()));
        }
        let started = Instant::now();
        let status = EnvStatus {
            program_id: program.to_string(),
            state: EnvState::Pending,
            kind: "local",
            started_at: unix_now(),
            finished_at: None,
            duration_s: None,
            error: None,
            workdir: None,
            container: None,
        };
        let (tx, job) = self.job_for(program, spec, status)?;
        let sender = tx.clone();
        envs.insert(program.to_string(), tx);
        drop(envs);
        info!(
            program,
            kind = sender.borrow().kind,
            "environment preparation started"
        );
        let me = self.clone();
        let program = program.to_string();
        let pending = sender.borrow().clone();
        tokio::spawn(async move { me.drive(program, job, sender, started).await });
        Ok(pending)
    }

    /// The job `spec` asks for, checked, with the status channel that will
    /// report it: exactly one of a local command or a docker setup.
    fn job_for(
        &self,
        program: &str,
        spec: EnvironmentSpec,
        mut status: EnvStatus,
    ) -> Result<(watch::Sender<EnvStatus>, Job), ToolError> {
        match (spec.local, spec.docker) {
            (Some(l), None) => {
                let (dir, child, tree, timeout) = self.start_local(program, &l)?;
                status.workdir = Some(dir.display().to_string());
                let (tx, _) = watch::channel(status);
                let grace = self.local.grace();
                let child = Box::new(child);
                Ok((tx, Job::Local { child, tree, timeout, grace }))
            }
            (None, Some(d)) => {
                check_image(&d.image)?;
                let timeout = timeout_of(d.timeout_s, "environment.docker.timeout_s")?;
                status.kind = "docker";
                let (tx, _) = watch::channel(status);
                Ok((tx, Job::Docker { setup: d, timeout }))
            }
            _ => Err(ToolError::Invalid {
                what: "environment",
                reason: "give exactly one of {\"local\": {\"command\", \"workdir\"?, \"timeout_s\"?}} or {\"docker\": {\"image\", \"cmd\"?, \"timeout_s\"?}}".into(),
            }),
        }
    }

    /// Runs `job` to its end on a task of its own and publishes the outcome
    /// on `sender`; forgets the environment if its program ended meanwhile.
    async fn drive(
        self: Arc<Self>,
        program: String,
        job: Job,
        sender: watch::Sender<EnvStatus>,
        started: Instant,
    ) {
        let result = match job {
            Job::Local {
                child,
                tree,
                timeout,
                grace,
            } => run_local(*child, tree, timeout, grace).await,
            Job::Docker { setup, timeout } => {
                self.run_docker(&program, &setup, timeout, &sender).await
            }
        };
        let secs = started.elapsed().as_secs_f64();
        sender.send_modify(|s| {
            s.finished_at = Some(unix_now());
            s.duration_s = Some(secs);
            match &result {
                Ok(()) => s.state = EnvState::Ready,
                Err(e) => {
                    s.state = EnvState::Failed;
                    s.error = Some(e.clone());
                }
            }
        });
        match result {
            Ok(()) => info!(program, duration_s = secs, "environment ready"),
            Err(e) => {
                warn!(program, duration_s = secs, error = %e, "environment preparation failed")
            }
        }
        // The program ended while this ran: nobody will ask any more.
        if self
            .registry
            .program(&program)
            .is_some_and(|p| p.ended.is_some())
        {
            self.forget(&program);
        }
    }

    /// Creates the directory, spawns the command (as the sandbox user, in a
    /// cgroup of its own or carrying a token, under the memory limit), and
    /// declares both before returning, so nothing escapes the program.
    fn start_local(
        &self,
        program: &str,
        l: &LocalSetup,
    ) -> Result<(PathBuf, tokio::process::Child, Resource, Duration), ToolError> {
        if !self.policy.allow {
            return Err(ToolError::refused(
                "environment.local",
                "local setup commands are off (start the server with --allow-environment-commands and --sandbox-user)",
            ));
        }
        let timeout = timeout_of(l.timeout_s, "environment.local.timeout_s")?;
        if l.command.trim().is_empty() || l.command.contains('\0') {
            return Err(ToolError::Invalid {
                what: "environment.local.command",
                reason: "the command is empty or holds a NUL byte".into(),
            });
        }
        let rel = match &l.workdir {
            Some(w) => PathBuf::from(w),
            None => PathBuf::from(format!("env-{}", sanitize(program))),
        };
        let dir = self.local.check_dir(&rel)?;
        // A failure here is about the client's path (a file in the way,
        // permissions): a refusal naming it, not a server fault.
        std::fs::create_dir_all(&dir).map_err(|e| {
            ToolError::refused(
                format!("dir {}", dir.display()),
                format!("cannot create it: {e}"),
            )
        })?;
        if let Some((uid, gid)) = self.policy.user {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                .map_err(|e| ToolError::io(format!("chown {}", dir.display()), e))?;
        }
        self.registry
            .declare(program, vec![Resource::Dir(dir.clone())])?;
        let token = tree::new_token();
        let n = self.started.fetch_add(1, Ordering::Relaxed);
        let cgroup = self.cgroups.create(
            &format!("{}-{n}", sanitize(program)),
            self.policy.memory_max,
        );
        let cmd = command(&l.command, &dir, &token, cgroup.as_deref(), &self.policy);
        let child = match cmd.and_then(|mut c| c.spawn()) {
            Ok(c) => c,
            Err(e) => {
                if let Some(cg) = &cgroup {
                    let _ = std::fs::remove_dir(cg);
                }
                return Err(ToolError::io("spawning the setup command", e));
            }
        };
        let root = child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
        let tree = Resource::ProcessTree {
            root,
            started: crate::local::start_time(root).unwrap_or(0),
            token,
            cgroup,
        };
        self.registry.declare(program, vec![tree.clone()])?;
        info!(program, pid = root, dir = %dir.display(), "setup command started");
        Ok((dir, child, tree, timeout))
    }

    async fn run_docker(
        &self,
        program: &str,
        setup: &DockerSetup,
        timeout: Duration,
        status: &watch::Sender<EnvStatus>,
    ) -> Result<(), String> {
        let id = tokio::time::timeout(
            timeout,
            self.docker
                .create_environment(program, &setup.image, setup.cmd.as_deref(), timeout),
        )
        .await
        .map_err(|_| format!("timed out after {}s", timeout.as_secs_f64()))?
        .map_err(|e| e.to_string())?;
        status.send_modify(|s| s.container = Some(id.clone()));
        self.registry
            .attach(program, Resource::DockerContainer(id))
            .map_err(|e| e.to_string())
    }

    pub fn status(&self, program: &str) -> Option<EnvStatus> {
        let envs = self.envs.lock().unwrap_or_else(|e| e.into_inner());
        envs.get(program).map(|tx| tx.borrow().clone())
    }

    /// The status once it is no longer pending, or when `wait` runs out.
    pub async fn wait(&self, program: &str, wait: Duration) -> Option<EnvStatus> {
        let mut rx = {
            let envs = self.envs.lock().unwrap_or_else(|e| e.into_inner());
            envs.get(program)?.subscribe()
        };
        let _ = tokio::time::timeout(wait, rx.wait_for(|s| s.state != EnvState::Pending)).await;
        let s = rx.borrow().clone();
        Some(s)
    }

    /// Forgets the status of an ended program (its resources are the
    /// registry's to reclaim).
    pub fn forget(&self, program: &str) {
        let mut envs = self.envs.lock().unwrap_or_else(|e| e.into_inner());
        if envs
            .get(program)
            .is_some_and(|tx| tx.borrow().state != EnvState::Pending)
        {
            envs.remove(program);
        }
    }
}

enum Job {
    Local {
        child: Box<tokio::process::Child>,
        tree: Resource,
        timeout: Duration,
        grace: Duration,
    },
    Docker {
        setup: DockerSetup,
        timeout: Duration,
    },
}

/// Waits for the setup command; on timeout kills its group. Output is
/// collected by reader tasks and not awaited past the command's exit: a
/// background process it left in its group (a server it started) keeps the
/// pipes open for as long as it lives.
async fn run_local(
    mut child: tokio::process::Child,
    tree: Resource,
    timeout: Duration,
    grace: Duration,
) -> Result<(), String> {
    let output = Arc::new(Mutex::new(Vec::<u8>::new()));
    let mut readers = Vec::new();
    let pipes: [Option<Box<dyn tokio::io::AsyncRead + Send + Unpin>>; 2] = [
        child.stderr.take().map(|p| Box::new(p) as _),
        child.stdout.take().map(|p| Box::new(p) as _),
    ];
    for mut pipe in pipes.into_iter().flatten() {
        let out = output.clone();
        readers.push(tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let mut o = out.lock().unwrap_or_else(|e| e.into_inner());
                o.extend_from_slice(&buf[..n]);
                // Keep only the tail.
                let excess = o.len().saturating_sub(2 * OUTPUT_TAIL);
                o.drain(..excess);
            }
        }));
    }
    let result = tokio::time::timeout(timeout, child.wait()).await;
    // Output written just before the exit is still in the pipes.
    tokio::time::sleep(Duration::from_millis(20)).await;
    for r in readers {
        r.abort();
    }
    let text = {
        let o = output.lock().unwrap_or_else(|e| e.into_inner());
        String::from_utf8_lossy(&o).into_owned()
    };
    match result {
        Err(_) => {
            if let Resource::ProcessTree {
                root,
                started,
                token,
                cgroup,
            } = &tree
            {
                if let Err(e) =
                    tree::kill_tree(*root, *started, token, cgroup.as_deref(), grace).await
                {
                    warn!(error = %e, "killing a timed-out setup command");
                }
            }
            Err(format!(
                "the setup command timed out after {}s (it and its processes were killed)",
                timeout.as_secs_f64()
            ))
        }
        Ok(Err(e)) => Err(format!("waiting for the setup command: {e}")),
        Ok(Ok(s)) if s.success() => Ok(()),
        Ok(Ok(s)) => {
            let cut = text.len().saturating_sub(OUTPUT_TAIL);
            let tail = text.get(cut..).unwrap_or(&text).trim();
            Err(format!("the setup command failed ({s}): {tail}"))
        }
    }
}

/// `sh -c command` in `dir`, in its own process group, marked with `token`,
/// joining `cgroup` and taking the policy's user and memory limit before it
/// runs.
fn command(
    command: &str,
    dir: &std::path::Path,
    token: &str,
    cgroup: Option<&std::path::Path>,
    policy: &CommandPolicy,
) -> std::io::Result<tokio::process::Command> {
    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg("-c")
        .arg(command)
        .current_dir(dir)
        .env(tree::TOKEN_VAR, token)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own group, never the server's.
        .process_group(0);
    let procs = cgroup.and_then(tree::procs_path);
    let memory = policy.memory_max;
    let user = policy.user;
    // SAFETY: the closure runs in the forked child before exec and only
    // makes async-signal-safe calls (open, write, close, setrlimit,
    // setgroups, setgid, setuid) on data prepared before the fork. The user
    // is switched here, not with `Command::uid` (which std applies before
    // these closures), because joining the cgroup needs the server's rights.
    unsafe {
        cmd.pre_exec(move || {
            let fail = || Err(std::io::Error::last_os_error());
            if let Some(p) = &procs {
                let fd = libc::open(p.as_ptr(), libc::O_WRONLY);
                if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return fail();
                }
                libc::close(fd);
            }
            if let Some(bytes) = memory {
                let lim = libc::rlimit {
                    rlim_cur: bytes,
                    rlim_max: bytes,
                };
                if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                    return fail();
                }
            }
            if let Some((uid, gid)) = user {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0
                {
                    return fail();
                }
            }
            Ok(())
        });
    }
    Ok(cmd)
}

/// Program ids are client strings: keep `[A-Za-z0-9_.-]` for a directory name.
fn sanitize(program: &str) -> String {
    let s: String = program
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(100)
        .collect();
    if s.is_empty() {
        "_".into()
    } else {
        s
    }
}
