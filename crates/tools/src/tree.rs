//! The processes an environment command started, found again at reclaim
//! however they detached: `setsid`, double forks and process-group changes
//! escape a process-group kill, not these.
//!
//! - With a writable cgroup v2 hierarchy, each environment gets a cgroup of
//!   its own, joined by the command before it runs: every descendant stays
//!   in it, and reclaim empties it (`cgroup.kill`) and removes it.
//! - Without one, the command and its descendants carry a random token in
//!   their environment ([`TOKEN_VAR`]); reclaim signals every process that
//!   carries it or descends from the command. A process that scrubs its
//!   environment and reparents escapes this fallback; the cgroup is the
//!   proof where the machine allows it.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use crate::error::ToolError;

/// The environment variable that marks an environment's processes.
pub const TOKEN_VAR: &str = "AGENTD_ENVIRONMENT_TOKEN";

/// Where environments' cgroups are made, if anywhere.
#[derive(Debug, Clone)]
pub struct Cgroups {
    base: Option<PathBuf>,
}

impl Cgroups {
    /// A directory for this server's environments under its own cgroup v2
    /// (`<mount><own path>/agentd-<pid>`), if it can be created; else the
    /// token fallback.
    pub fn detect() -> Self {
        let base = cgroup2_mount().and_then(|mount| {
            let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
            let rel = own.lines().find_map(|l| l.strip_prefix("0::"))?;
            let parent = mount.join(rel.trim_start_matches('/'));
            sweep_stale(&parent);
            let dir = parent.join(format!("agentd-{}", std::process::id()));
            match std::fs::create_dir_all(&dir) {
                Ok(()) => Some(dir),
                Err(e) => {
                    info!(dir = %dir.display(), error = %e, "no cgroup for environments: tracking their processes by token");
                    None
                }
            }
        });
        if let Some(b) = &base {
            info!(base = %b.display(), "environments run in cgroups of their own");
        }
        Self { base }
    }

    /// No cgroups (tests of the fallback; machines without cgroup v2).
    pub fn none() -> Self {
        Self { base: None }
    }

    pub fn enabled(&self) -> bool {
        self.base.is_some()
    }

    /// A fresh cgroup named `name`, with `memory.max` set when the memory
    /// controller is available there.
    pub fn create(&self, name: &str, memory_max: Option<u64>) -> Option<PathBuf> {
        let dir = self.base.as_ref()?.join(name);
        if let Err(e) = std::fs::create_dir(&dir) {
            warn!(dir = %dir.display(), error = %e, "cannot create the environment's cgroup");
            return None;
        }
        if let Some(bytes) = memory_max {
            let f = dir.join("memory.max");
            if f.exists() {
                if let Err(e) = std::fs::write(&f, bytes.to_string()) {
                    warn!(file = %f.display(), error = %e, "cannot set memory.max");
                }
            }
        }
        Some(dir)
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        if let Some(b) = &self.base {
            // Only empty cgroups can be removed; leftovers stay visible.
            let _ = std::fs::remove_dir(b);
        }
    }
}

/// Removes the cgroups of agentd servers that died without cleaning up
/// (killed, crashed, or never dropped their [`Cgroups`]): `agentd-<pid>`
/// under `parent` whose pid is gone. Whatever still runs in their
/// environments' cgroups is killed first (it was sandboxed work of a dead
/// server). A live pid is left alone, even if reused by another process.
fn sweep_stale(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("agentd-"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let base = e.path();
        if let Ok(children) = std::fs::read_dir(&base) {
            for c in children.flatten().filter(|c| c.path().is_dir()) {
                let _ = std::fs::write(c.path().join("cgroup.kill"), "1");
                let _ = std::fs::remove_dir(c.path());
            }
        }
        match std::fs::remove_dir(&base) {
            Ok(()) => info!(dir = %base.display(), "removed a dead server's cgroup"),
            Err(err) => debug!(dir = %base.display(), error = %err, "stale cgroup not removed yet"),
        }
    }
}

fn cgroup2_mount() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    // "... <mount point> <options> - cgroup2 <source> <super options>"
    info.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        if !right.starts_with("cgroup2 ") {
            return None;
        }
        left.split_whitespace().nth(4).map(PathBuf::from)
    })
}

/// `cgroup.procs` of `dir`, as a C path for the child to open before exec.
pub fn procs_path(dir: &Path) -> Option<CString> {
    CString::new(dir.join("cgroup.procs").as_os_str().as_bytes()).ok()
}

/// A fresh random token (128 bits from the kernel).
pub fn new_token() -> String {
    let mut b = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut b);
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Live (not zombie) members of an environment: its cgroup's processes, or
/// the processes that carry `token` or descend from `root`.
pub fn members(root: i32, root_started: u64, token: &str, cgroup: Option<&Path>) -> Vec<i32> {
    if let Some(dir) = cgroup {
        if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            return text
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .filter(|&p| is_live(p))
                .collect();
        }
    }
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let needle = format!("{TOKEN_VAR}={token}");
    let mut out = Vec::new();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if pid == std::process::id() as i32 || !is_live(pid) {
            continue;
        }
        if carries(pid, &needle) || descends_from(pid, root, root_started) {
            out.push(pid);
        }
    }
    out
}

fn carries(pid: i32, needle: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/environ"))
        .is_ok_and(|env| env.split(|&b| b == 0).any(|v| v == needle.as_bytes()))
}

/// `pid`'s parent chain reaches `root` (the same process: same start time).
fn descends_from(pid: i32, root: i32, root_started: u64) -> bool {
    let mut p = pid;
    // Chains are short; the bound only guards against a cycle read mid-change.
    for _ in 0..64 {
        let Some((ppid, started)) = parent_and_start(p) else {
            return false;
        };
        if p == root {
            return root_started == 0 || started == root_started;
        }
        if ppid <= 1 {
            return false;
        }
        p = ppid;
    }
    false
}

fn parent_and_start(pid: i32) -> Option<(i32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let f: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    Some((f.get(1)?.parse().ok()?, f.get(19)?.parse().ok()?))
}

fn is_live(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rfind(')')
            .and_then(|i| s[i + 1..].split_whitespace().next())
            .is_some_and(|st| st != "Z" && st != "X")
    })
}

/// SIGTERM to every member, up to `grace` for them to go, then SIGKILL
/// (`cgroup.kill` where there is a cgroup) until none is left; finally
/// removes the cgroup.
pub async fn kill_tree(
    root: i32,
    root_started: u64,
    token: &str,
    cgroup: Option<&Path>,
    grace: Duration,
) -> Result<(), ToolError> {
    let signal_all = |sig: i32| {
        let pids = members(root, root_started, token, cgroup);
        for &p in &pids {
            // SAFETY: kill has no memory effects; `p` was proven a member
            // of this environment (its cgroup, token or parent chain).
            unsafe { libc::kill(p, sig) };
        }
        pids.len()
    };
    let n = signal_all(libc::SIGTERM);
    debug!(root, members = n, "environment processes sent SIGTERM");
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && !members(root, root_started, token, cgroup).is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // SIGKILL in rounds: a member may fork between a scan and its signal.
    let kill_deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(dir) = cgroup {
            let _ = std::fs::write(dir.join("cgroup.kill"), "1");
        }
        if signal_all(libc::SIGKILL) == 0 {
            break;
        }
        if Instant::now() >= kill_deadline {
            return Err(ToolError::StillAlive(format!(
                "processes of the environment started as pid {root} survived SIGKILL"
            )));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if let Some(dir) = cgroup {
        // Empty now, but the kernel may take a moment to notice exits.
        for _ in 0..100 {
            match std::fs::remove_dir(dir) {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    fn sleepers(arg: &str) -> usize {
        let want = format!("sleep\0{arg}\0");
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|&p| is_live(p))
            .filter(|p| {
                std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c == want.as_bytes())
            })
            .count()
    }

    /// `setsid` and double-forked children, found by token and parent
    /// chain (`cgroup: None`) or by the cgroup where the machine has one.
    async fn kills_detached_children(cgroups: Cgroups, tag: &str) {
        let token = new_token();
        let cgroup = cgroups.create(&format!("test-{tag}"), None);
        let procs = cgroup.as_deref().and_then(procs_path);
        let a = format!("42{tag}1");
        let b = format!("42{tag}2");
        let mut cmd = std::process::Command::new("sh");
        cmd.arg("-c")
            .arg(format!("setsid sleep {a} & (sleep {b} &); sleep 600"))
            .env(TOKEN_VAR, &token)
            .process_group(0);
        // SAFETY: open/write/close only, on a path built before the fork.
        unsafe {
            cmd.pre_exec(move || {
                if let Some(p) = &procs {
                    let fd = libc::open(p.as_ptr(), libc::O_WRONLY);
                    libc::write(fd, b"0".as_ptr().cast(), 1);
                    libc::close(fd);
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().unwrap();
        let root = child.id() as i32;
        let deadline = Instant::now() + Duration::from_secs(10);
        while sleepers(&a) + sleepers(&b) < 2 {
            assert!(Instant::now() < deadline, "children did not start");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let started = crate::local::start_time(root).unwrap();
        let members = members(root, started, &token, cgroup.as_deref());
        assert!(members.len() >= 3, "{members:?}");
        kill_tree(
            root,
            started,
            &token,
            cgroup.as_deref(),
            Duration::from_millis(200),
        )
        .await
        .unwrap();
        let _ = child.wait();
        let deadline = Instant::now() + Duration::from_secs(5);
        while sleepers(&a) + sleepers(&b) > 0 {
            assert!(Instant::now() < deadline, "detached children survived");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if let Some(dir) = cgroup {
            assert!(!dir.exists(), "cgroup removed");
        }
    }

    #[tokio::test]
    async fn the_token_fallback_kills_detached_children() {
        kills_detached_children(Cgroups::none(), "7").await;
    }

    #[test]
    fn a_dead_servers_cgroups_are_swept() {
        let first = Cgroups::detect();
        let Some(base) = first.base.clone() else {
            println!("SKIPPED: no writable cgroup v2 here");
            return;
        };
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let pid = gone.id();
        gone.wait().unwrap();
        let stale = base.parent().unwrap().join(format!("agentd-{pid}"));
        std::fs::create_dir_all(stale.join("w-0")).unwrap();
        let _again = Cgroups::detect();
        assert!(!stale.exists(), "{} left behind", stale.display());
    }

    #[tokio::test]
    async fn a_cgroup_kills_detached_children_where_there_is_one() {
        let cgroups = Cgroups::detect();
        println!("cgroup v2 available: {}", cgroups.enabled());
        kills_detached_children(cgroups, "8").await;
    }
}
