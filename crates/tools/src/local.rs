//! The local sandbox backend: directories under one root and process groups.
//!
//! Safety rules, checked when a resource is declared and again when it is
//! reclaimed: a directory must resolve (symlinks followed, no `..`) to a path
//! strictly inside the canonical sandbox root; a process must not be pid 1,
//! the server itself or a member of the server's own process group. Only
//! what was declared is ever signalled or removed.

use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use crate::backend::{Backend, BoxFuture};
use crate::error::ToolError;
use crate::resource::Resource;

/// How often a terminating process group is checked: from the first
/// interval (most processes die within a millisecond of SIGTERM), doubling
/// up to the last.
const POLL_FIRST: Duration = Duration::from_millis(1);
const POLL_MAX: Duration = Duration::from_millis(20);
/// How long SIGKILLed processes get to disappear.
const KILL_WAIT: Duration = Duration::from_secs(2);

pub struct LocalSandbox {
    /// Canonical; `None` refuses every directory.
    root: Option<PathBuf>,
    /// Between SIGTERM and SIGKILL.
    grace: Duration,
    /// Which declared pids (processes agentd did not start) are admitted.
    foreign: ForeignPids,
}

/// Processes a client declares by pid: agentd cannot prove they belong to
/// the program, so they are refused unless the operator opts in
/// (`--allow-foreign-pids`), and even then only the server's own uid's
/// unless `any_uid` (`--allow-foreign-pids-any-uid`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ForeignPids {
    pub allow: bool,
    pub any_uid: bool,
}

impl LocalSandbox {
    /// `root` must be an existing directory; it is canonicalised once here.
    pub fn new(
        root: Option<&Path>,
        grace: Duration,
        foreign: ForeignPids,
    ) -> Result<Self, ToolError> {
        let root = match root {
            Some(r) => {
                let c = r
                    .canonicalize()
                    .map_err(|e| ToolError::io(format!("sandbox root {}", r.display()), e))?;
                if !c.is_dir() {
                    return Err(ToolError::Invalid {
                        what: "sandbox root",
                        reason: format!("{} is not a directory", c.display()),
                    });
                }
                Some(c)
            }
            None => None,
        };
        info!(root = ?root, grace_ms = grace.as_millis() as u64, ?foreign, "local sandbox backend");
        Ok(Self {
            root,
            grace,
            foreign,
        })
    }

    pub fn root(&self) -> Option<&Path> {
        self.root.as_deref()
    }

    /// Between SIGTERM and SIGKILL.
    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// The canonical form of `p` (relative paths are taken under the root),
    /// or a refusal if it is not strictly inside the root. The path need not
    /// exist yet: its deepest existing ancestor is canonicalised and the rest
    /// (which has no `..` and, not existing, no symlinks) appended.
    pub fn check_dir(&self, p: &Path) -> Result<PathBuf, ToolError> {
        let shown = p.display();
        let Some(root) = &self.root else {
            return Err(ToolError::refused(
                format!("dir {shown}"),
                "no sandbox root is configured (start the server with --sandbox-root DIR)",
            ));
        };
        check_path_text(p)?;
        if p.components().any(|c| matches!(c, Component::ParentDir)) {
            return Err(ToolError::refused(
                format!("dir {shown}"),
                "`..` is not allowed in sandbox paths",
            ));
        }
        let full = if p.is_absolute() {
            p.to_path_buf()
        } else {
            root.join(p)
        };
        let mut existing = full.as_path();
        let mut rest = Vec::new();
        let base = loop {
            match existing.canonicalize() {
                Ok(c) => break c,
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    let (Some(parent), Some(name)) = (existing.parent(), existing.file_name())
                    else {
                        return Err(ToolError::refused(
                            format!("dir {shown}"),
                            "no part of the path exists",
                        ));
                    };
                    // A dangling symlink is "not found" too, yet it exists:
                    // never build on top of one.
                    if existing.symlink_metadata().is_ok() {
                        return Err(ToolError::refused(
                            format!("dir {shown}"),
                            "it is a dangling symlink",
                        ));
                    }
                    rest.push(name.to_os_string());
                    existing = parent;
                }
                // ENOTDIR (a component is a file), ELOOP, EACCES: the
                // client's path cannot be used; refused, naming it.
                Err(e) => {
                    return Err(ToolError::refused(
                        format!("dir {shown}"),
                        format!("it cannot be resolved: {e}"),
                    ))
                }
            }
        };
        let mut c = base;
        for name in rest.iter().rev() {
            c.push(name);
        }
        if !c.starts_with(root) || c == *root {
            debug!(path = %shown, resolved = %c.display(), root = %root.display(), "refused: outside the sandbox root");
            return Err(ToolError::refused(
                format!("dir {shown}"),
                format!(
                    "it resolves to {}, not inside the sandbox root {}",
                    c.display(),
                    root.display()
                ),
            ));
        }
        Ok(c)
    }

    /// Resolves a declared pid: a group leader is reclaimed as its group,
    /// any other process alone.
    pub fn check_pid(&self, pid: i32) -> Result<Resource, ToolError> {
        let what = format!("pid {pid}");
        if pid <= 1 {
            return Err(ToolError::refused(what, "pids <= 1 are never signalled"));
        }
        if !self.foreign.allow {
            return Err(ToolError::refused(what, "agentd signals only processes it started (environments); declaring other pids needs the server flag --allow-foreign-pids"));
        }
        if !self.foreign.any_uid {
            use std::os::unix::fs::MetadataExt;
            // SAFETY: geteuid only reads process state.
            let me = unsafe { libc::geteuid() };
            match std::fs::metadata(format!("/proc/{pid}")) {
                Ok(m) if m.uid() == me => {}
                Ok(m) => {
                    return Err(ToolError::refused(
                        what,
                        format!("it belongs to uid {}, not the server's {me} (--allow-foreign-pids-any-uid admits it)", m.uid()),
                    ))
                }
                Err(e) => return Err(ToolError::refused(what, format!("no such process ({e})"))),
            }
        }
        // SAFETY: getpid/getpgrp/getpgid only read process state.
        let (me, my_group, group) =
            unsafe { (libc::getpid(), libc::getpgrp(), libc::getpgid(pid)) };
        if pid == me {
            return Err(ToolError::refused(what, "it is the server itself"));
        }
        if group < 0 {
            let e = std::io::Error::last_os_error();
            return Err(ToolError::refused(what, format!("no such process ({e})")));
        }
        if group == my_group || group <= 1 {
            return Err(ToolError::refused(what, "it is in the server's own process group (start tools with setsid / process_group(0))"));
        }
        // Its start time tells it apart from a later process that reuses
        // the pid (0 without /proc: no such check).
        let started = proc_stat(pid).map_or(0, |s| s.started);
        Ok(if group == pid {
            Resource::ProcessGroup { pid, started }
        } else {
            Resource::Process { pid, started }
        })
    }

    async fn remove_dir(&self, p: &Path) -> Result<(), ToolError> {
        // Checked again: a component may have been swapped for a symlink
        // since the declaration.
        let again = self.check_dir(p)?;
        if again != p {
            return Err(ToolError::refused(
                format!("dir {}", p.display()),
                format!(
                    "it now resolves to {} (a symlink appeared); left in place",
                    again.display()
                ),
            ));
        }
        let path = p.to_path_buf();
        let r = tokio::task::spawn_blocking(move || {
            match std::fs::symlink_metadata(&path) {
                Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
                Err(e) => Err(e),
                // remove_dir_all never follows symlinks inside the tree.
                Ok(m) if m.is_dir() => std::fs::remove_dir_all(&path).map(|()| true),
                Ok(_) => std::fs::remove_file(&path).map(|()| true),
            }
        })
        .await
        .map_err(|e| ToolError::io("removing a directory", std::io::Error::other(e)))?;
        match r {
            Ok(existed) => {
                debug!(path = %p.display(), existed, "directory removed");
                Ok(())
            }
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(ToolError::io(format!("removing {}", p.display()), e)),
        }
    }

    /// SIGTERM, wait up to the grace period, SIGKILL, wait again.
    async fn kill(&self, target: Target) -> Result<(), ToolError> {
        if target.reused() {
            // The declared process is gone and its pid now names another
            // one, which nobody gave us. (A group id cannot be reused while
            // any member lives, so the declared group is empty.)
            info!(
                ?target,
                "pid reused since it was declared: the declared process is gone"
            );
            return Ok(());
        }
        if !target.alive() {
            debug!(?target, "already gone");
            return Ok(());
        }
        target.signal(libc::SIGTERM)?;
        if target.wait_gone(self.grace).await {
            debug!(?target, "ended on SIGTERM");
            return Ok(());
        }
        warn!(
            ?target,
            grace_ms = self.grace.as_millis() as u64,
            "still alive after SIGTERM: SIGKILL"
        );
        target.signal(libc::SIGKILL)?;
        if target.wait_gone(KILL_WAIT).await {
            return Ok(());
        }
        Err(ToolError::StillAlive(format!(
            "{target:?} survived SIGKILL"
        )))
    }
}

/// Longest path component and path Linux accepts (NAME_MAX, PATH_MAX).
const NAME_MAX: usize = 255;
const PATH_MAX: usize = 4096;

/// Refuses what the kernel would refuse with an error that is not the
/// client's to read (EINVAL for a NUL byte, ENAMETOOLONG), naming the path.
fn check_path_text(p: &Path) -> Result<(), ToolError> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = p.as_os_str().as_bytes();
    let what = || format!("dir {}", p.display());
    if bytes.contains(&0) {
        return Err(ToolError::refused(what(), "it contains a NUL byte"));
    }
    if bytes.len() >= PATH_MAX {
        return Err(ToolError::refused(
            what(),
            format!("it is longer than {PATH_MAX} bytes"),
        ));
    }
    if p.components().any(|c| c.as_os_str().len() > NAME_MAX) {
        return Err(ToolError::refused(
            what(),
            format!("a component is longer than {NAME_MAX} bytes"),
        ));
    }
    Ok(())
}

/// What to signal: a group or one process, with its leader's start time
/// when it was declared.
#[derive(Debug, Clone, Copy)]
enum Target {
    Group(i32, u64),
    Pid(i32, u64),
}

impl Target {
    /// The pid now belongs to a process started after the declaration.
    fn reused(self) -> bool {
        let (Target::Group(pid, started) | Target::Pid(pid, started)) = self;
        started != 0 && proc_stat(pid).is_some_and(|s| s.started != started)
    }

    fn signal(self, sig: i32) -> Result<(), ToolError> {
        let id = match self {
            Target::Group(g, _) => -g,
            Target::Pid(p, _) => p,
        };
        // SAFETY: kill has no memory effects; `id` was admitted by check_pid
        // (never <= 1, never our own group).
        if unsafe { libc::kill(id, sig) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ESRCH) {
            return Ok(()); // gone meanwhile
        }
        Err(ToolError::io(format!("signal {sig} to {self:?}"), e))
    }

    /// Alive means: some member exists and is not a zombie (a zombie is dead;
    /// only its parent's wait can remove it, and that parent is not us).
    fn alive(self) -> bool {
        match self {
            Target::Pid(p, _) => proc_stat(p).is_some_and(|s| s.state != 'Z' && s.state != 'X'),
            // SAFETY: signal 0 only checks existence.
            Target::Group(g, _) if (unsafe { libc::kill(-g, 0) }) != 0 => false,
            Target::Group(g, _) => match group_members(g) {
                Some(states) => states.iter().any(|&s| s != 'Z' && s != 'X'),
                // No /proc: kill(0) cannot tell zombies apart, but it is the
                // best there is.
                // SAFETY: signal 0 only checks existence.
                None => (unsafe { libc::kill(-g, 0) }) == 0,
            },
        }
    }

    async fn wait_gone(self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let mut poll = POLL_FIRST;
        loop {
            if !self.alive() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(poll).await;
            poll = (poll * 2).min(POLL_MAX);
        }
    }
}

struct ProcStat {
    state: char,
    pgrp: i32,
    /// Clock ticks after boot.
    started: u64,
}

/// The fields used of /proc/PID/stat.
fn proc_stat(pid: i32) -> Option<ProcStat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) S ppid pgrp ... starttime ...": comm may hold spaces and
    // parentheses, so fields are counted from the last ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = after.split_whitespace().collect();
    Some(ProcStat {
        state: f.first()?.chars().next()?,
        pgrp: f.get(2)?.parse().ok()?,
        started: f.get(19)?.parse().ok()?,
    })
}

/// When `pid` started (clock ticks after boot), to tell it apart from a
/// later process reusing its pid.
pub(crate) fn start_time(pid: i32) -> Option<u64> {
    proc_stat(pid).map(|s| s.started)
}

/// States of every process in group `pgid`; `None` without /proc.
fn group_members(pgid: i32) -> Option<Vec<char>> {
    let dir = std::fs::read_dir("/proc").ok()?;
    let mut states = Vec::new();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if let Some(s) = proc_stat(pid) {
            if s.pgrp == pgid {
                states.push(s.state);
            }
        }
    }
    Some(states)
}

impl Backend for LocalSandbox {
    fn name(&self) -> &'static str {
        "local"
    }

    fn handles(&self, r: &Resource) -> bool {
        matches!(
            r,
            Resource::Dir(_)
                | Resource::ProcessGroup { .. }
                | Resource::Process { .. }
                | Resource::ProcessTree { .. }
        )
    }

    fn admit(&self, r: Resource) -> Result<Resource, ToolError> {
        match r {
            Resource::Dir(p) => self.check_dir(&p).map(Resource::Dir),
            Resource::Process { pid, .. } | Resource::ProcessGroup { pid, .. } => {
                self.check_pid(pid)
            }
            // Made by `Environments` for a command it started, never parsed
            // from a client.
            tree @ Resource::ProcessTree { .. } => Ok(tree),
            other => Err(ToolError::NoBackend(other.to_string())),
        }
    }

    fn reclaim<'a>(&'a self, r: &'a Resource) -> BoxFuture<'a, Result<(), ToolError>> {
        Box::pin(async move {
            match r {
                Resource::Dir(p) => self.remove_dir(p).await,
                Resource::ProcessGroup { pid, started } => {
                    self.kill(Target::Group(*pid, *started)).await
                }
                Resource::Process { pid, started } => self.kill(Target::Pid(*pid, *started)).await,
                Resource::ProcessTree {
                    root,
                    started,
                    token,
                    cgroup,
                } => {
                    crate::tree::kill_tree(*root, *started, token, cgroup.as_deref(), self.grace)
                        .await
                }
                other => Err(ToolError::NoBackend(other.to_string())),
            }
        })
    }
}

#[cfg(test)]
mod tests;
