//! The registry with the local backend on real directories and real process
//! groups: reclaim on end, sharing, refusals, SIGKILL after the grace period,
//! failures that stay visible, and environment preparation.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use agentd_tools::{
    CommandPolicy, DockerConfig, EnvState, EnvironmentSpec, ForeignPids, LocalSetup, ReclaimConfig,
    ResourceState, ToolError, ToolResources, Tools, ToolsConfig,
};

fn tools(root: &Path) -> Tools {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: geteuid only reads process state.
    let as_root = unsafe { libc::geteuid() } == 0;
    // Setup commands run as `nobody` when the tests run as root: it must be
    // able to reach its directory.
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    Tools::new(ToolsConfig {
        sandbox_root: Some(root.to_path_buf()),
        kill_grace: Duration::from_millis(300),
        docker: DockerConfig {
            socket: root.join("no-docker.sock"),
            ..DockerConfig::default()
        },
        reclaim: ReclaimConfig {
            concurrency: 4,
            max_attempts: 3,
            backoff: Duration::from_millis(20),
            history: 100,
        },
        reclaim_on_exit: false,
        orphan_lease: None,
        // These tests declare process groups they started themselves.
        foreign_pids: ForeignPids {
            allow: true,
            any_uid: false,
        },
        commands: CommandPolicy {
            allow: true,
            user: as_root.then_some((65534, 65534)),
            memory_max: Some(1 << 30),
        },
    })
    .expect("tools")
}

/// `sh` leading its own process group, with a background grandchild.
fn spawn_group(script: &str) -> Child {
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .process_group(0)
        .spawn()
        .expect("spawn")
}

/// Reaps `child` on a thread; the receiver gets its exit status.
fn reap(mut child: Child) -> mpsc::Receiver<std::process::ExitStatus> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        if let Ok(s) = child.wait() {
            let _ = tx.send(s);
        }
    });
    rx
}

/// No live process of group `pgid` is left (zombies of processes reparented
/// to a non-reaping init count as dead).
fn group_dead(pgid: i32) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return unsafe { libc::kill(-pgid, 0) } != 0;
    };
    !dir.flatten().any(|e| {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            return false;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return false;
        };
        let after = &stat[stat.rfind(')').unwrap() + 1..];
        let f: Vec<&str> = after.split_whitespace().collect();
        f[2].parse::<i32>() == Ok(pgid) && f[0] != "Z" && f[0] != "X"
    })
}

fn sandbox_dir(root: &Path, name: &str) -> String {
    let d = root.join(name);
    std::fs::create_dir_all(d.join("sub")).unwrap();
    std::fs::write(d.join("sub/file.txt"), b"tool output").unwrap();
    d.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ending_a_program_removes_its_dirs_and_kills_its_process_groups() {
    let t = tempfile::tempdir().unwrap();
    let tools = tools(t.path());
    let dir = sandbox_dir(t.path(), "p1");
    let child = spawn_group("sleep 300 & sleep 300; wait");
    let pgid = child.id() as i32;
    let status = reap(child);
    let spec = ToolResources {
        dirs: vec![dir.clone()],
        pids: vec![i64::from(pgid)],
        ..Default::default()
    };
    tools.declare("p1", &spec).expect("declared");
    assert_eq!(tools.registry.metrics().live, 2);
    let shown = tools.registry.program("p1").unwrap();
    assert!(shown
        .resources
        .iter()
        .all(|r| r.state == ResourceState::Live));
    assert_eq!(
        shown
            .resources
            .iter()
            .filter(|r| r.kind == "process_group")
            .count(),
        1
    );
    assert!(!group_dead(pgid));

    assert_eq!(tools.program_ended("p1", "released"), 2);
    assert!(tools.registry.wait_idle(Duration::from_secs(10)).await);
    assert!(!Path::new(&dir).exists(), "directory removed");
    let st = status
        .recv_timeout(Duration::from_secs(5))
        .expect("leader exited");
    assert_eq!(st.signal(), Some(libc::SIGTERM), "ended by SIGTERM");
    assert!(group_dead(pgid), "grandchild killed too");
    let m = tools.registry.metrics();
    assert_eq!((m.reclaimed_total, m.failed_total, m.live), (2, 0, 0));
    let shown = tools.registry.program("p1").unwrap();
    assert_eq!(shown.ended.as_deref(), Some("released"));
    for r in &shown.resources {
        assert_eq!(r.state, ResourceState::Reclaimed, "{r:?}");
        assert_eq!(r.attempts, 1);
        assert!(r.reclaim_latency_s.unwrap() < 5.0);
        assert!(r.owners.is_empty());
    }
    // Ending twice does nothing more.
    assert_eq!(tools.program_ended("p1", "released"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_resource_survives_until_its_last_owner_ends() {
    let t = tempfile::tempdir().unwrap();
    let tools = tools(t.path());
    let shared = sandbox_dir(t.path(), "shared");
    let own = sandbox_dir(t.path(), "a-only");
    let a = ToolResources {
        dirs: vec![shared.clone(), own.clone()],
        ..Default::default()
    };
    let b = ToolResources {
        dirs: vec![shared.clone()],
        ..Default::default()
    };
    tools.declare("a", &a).unwrap();
    tools.declare("b", &b).unwrap();
    assert_eq!(tools.program_ended("a", "final"), 1, "only a's own dir");
    assert!(tools.registry.wait_idle(Duration::from_secs(10)).await);
    assert!(!Path::new(&own).exists());
    assert!(
        Path::new(&shared).join("sub/file.txt").exists(),
        "b still owns it"
    );
    let shown = tools.registry.program("a").unwrap();
    let s = shown.resources.iter().find(|r| r.id == shared).unwrap();
    assert_eq!(
        (s.state.clone(), s.owners.clone()),
        (ResourceState::Live, vec!["b".to_string()])
    );
    assert_eq!(tools.registry.metrics().live, 1);
    tools.program_ended("b", "lease_expired");
    assert!(tools.registry.wait_idle(Duration::from_secs(10)).await);
    assert!(!Path::new(&shared).exists());
    assert_eq!(tools.registry.metrics().live, 0);
}

#[tokio::test]
async fn what_the_backend_must_not_touch_is_refused_and_not_registered() {
    let t = tempfile::tempdir().unwrap();
    let tools = tools(t.path());
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), t.path().join("link")).unwrap();
    let cases: Vec<(ToolResources, &str)> = vec![
        (
            ToolResources {
                dirs: vec![outside.path().display().to_string()],
                ..Default::default()
            },
            "not inside the sandbox root",
        ),
        (
            ToolResources {
                dirs: vec![format!("{}/x/../../etc", t.path().display())],
                ..Default::default()
            },
            "`..`",
        ),
        (
            ToolResources {
                dirs: vec![t.path().join("link/deep").display().to_string()],
                ..Default::default()
            },
            "not inside the sandbox root",
        ),
        (
            ToolResources {
                dirs: vec![t.path().display().to_string()],
                ..Default::default()
            },
            "not inside the sandbox root",
        ),
        (
            ToolResources {
                pids: vec![1],
                ..Default::default()
            },
            "pids <= 1",
        ),
        (
            ToolResources {
                pids: vec![i64::from(std::process::id())],
                ..Default::default()
            },
            "the server itself",
        ),
        (
            ToolResources {
                docker: vec!["../images/x".into()],
                ..Default::default()
            },
            "not a valid Docker name",
        ),
    ];
    for (spec, why) in cases {
        let e = tools.declare("p", &spec).unwrap_err();
        assert!(e.is_client_error(), "{e}");
        assert!(e.to_string().contains(why), "{e} should say {why}");
    }
    assert!(tools.registry.program("p").is_none(), "nothing registered");
    assert!(outside.path().exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_end_of_an_earlier_program_with_the_same_id_is_ignored() {
    let t = tempfile::tempdir().unwrap();
    let tools = tools(t.path());
    let old = sandbox_dir(t.path(), "old");
    let spec = |d: &str| ToolResources {
        dirs: vec![d.to_string()],
        ..Default::default()
    };
    tools.declare("p", &spec(&old)).unwrap();
    let ended_at = Instant::now();
    // The engine ended p at `ended_at`, then p declared again (a new program
    // reusing the id) before the end was delivered.
    std::thread::sleep(Duration::from_millis(5));
    let new = sandbox_dir(t.path(), "new");
    tools.declare("p", &spec(&new)).unwrap();
    assert_eq!(tools.engine_ended("p", "final", Some(ended_at)), 0);
    assert!(tools.registry.program("p").unwrap().ended.is_none());
    // An end after the latest declaration ends it.
    assert_eq!(tools.engine_ended("p", "final", Some(Instant::now())), 2);
    assert!(tools.registry.wait_idle(Duration::from_secs(10)).await);
    assert!(!Path::new(&old).exists() && !Path::new(&new).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn programs_the_engine_never_ran_are_swept_after_the_orphan_lease() {
    let t = tempfile::tempdir().unwrap();
    let mut cfg_tools = tools(t.path());
    cfg_tools.orphan_lease = Some(Duration::from_millis(200));
    let tools = cfg_tools;
    let a = sandbox_dir(t.path(), "a");
    let b = sandbox_dir(t.path(), "b");
    for (p, d) in [("ghost", &a), ("running", &b)] {
        tools
            .declare(
                p,
                &ToolResources {
                    dirs: vec![d.clone()],
                    ..Default::default()
                },
            )
            .unwrap();
    }
    let running: std::collections::HashSet<String> = ["running".to_string()].into();
    assert!(tools.sweep_orphans(&running).is_empty(), "not idle yet");
    std::thread::sleep(Duration::from_millis(250));
    assert_eq!(tools.sweep_orphans(&running), vec!["ghost".to_string()]);
    assert!(tools.registry.wait_idle(Duration::from_secs(10)).await);
    assert!(!Path::new(&a).exists());
    assert!(
        Path::new(&b).exists(),
        "the engine runs it: its own lease applies"
    );
    assert_eq!(
        tools.registry.program("ghost").unwrap().ended.as_deref(),
        Some("lease_expired")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_that_ignores_sigterm_is_killed_after_the_grace_period() {
    let t = tempfile::tempdir().unwrap();
    let tools = tools(t.path());
    // An ignored signal stays ignored across exec: sleep ignores it too.
    let child = spawn_group("trap '' TERM; sleep 300 & sleep 300; wait");
    let pgid = child.id() as i32;
    let status = reap(child);
    std::thread::sleep(Duration::from_millis(100)); // let the trap be set
    tools
        .declare(
            "p",
            &ToolResources {
                pids: vec![i64::from(pgid)],
                ..Default::default()
            },
        )
        .unwrap();
    let t0 = Instant::now();
    tools.program_ended("p", "released");
    assert!(tools.registry.wait_idle(Duration::from_secs(10)).await);
    assert!(
        t0.elapsed() >= Duration::from_millis(300),
        "waited the grace period"
    );
    assert_eq!(
        status
            .recv_timeout(Duration::from_secs(5))
            .unwrap()
            .signal(),
        Some(libc::SIGKILL)
    );
    assert!(group_dead(pgid));
    assert_eq!(tools.registry.metrics().reclaimed_total, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_docker_socket_fails_visibly_after_the_retries() {
    let t = tempfile::tempdir().unwrap();
    let tools = tools(t.path());
    let dir = sandbox_dir(t.path(), "p");
    tools
        .declare(
            "p",
            &ToolResources {
                docker_ids: vec!["c0ffee".into()],
                dirs: vec![dir.clone()],
                ..Default::default()
            },
        )
        .unwrap();
    tools.program_ended("p", "released");
    assert!(tools.registry.wait_idle(Duration::from_secs(10)).await);
    let shown = tools.registry.program("p").unwrap();
    let d = shown.resources.iter().find(|r| r.kind == "docker").unwrap();
    match &d.state {
        ResourceState::Failed { reason } => {
            assert!(reason.contains("Docker daemon is unreachable"), "{reason}");
            assert!(reason.contains("no-docker.sock"), "{reason}");
        }
        s => panic!("expected failed, got {s:?}"),
    }
    assert_eq!(d.attempts, 3, "retried up to max_attempts");
    assert!(
        !Path::new(&dir).exists(),
        "the other resource is reclaimed regardless"
    );
    let m = tools.registry.metrics();
    assert_eq!((m.reclaimed_total, m.failed_total, m.live), (1, 1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_preparation_runs_in_the_background_and_is_reclaimed_with_the_program() {
    let t = tempfile::tempdir().unwrap();
    let tools = tools(t.path());
    let env = &tools.environments;
    let spec = |command: &str, workdir: Option<&str>, timeout_s: Option<f64>| EnvironmentSpec {
        local: Some(LocalSetup {
            command: command.into(),
            workdir: workdir.map(str::to_string),
            timeout_s,
        }),
        docker: None,
    };
    let t0 = Instant::now();
    let s = env
        .start(
            "p",
            spec(
                "sleep 0.5; echo ready > marker; sleep 600 &",
                None,
                Some(10.0),
            ),
        )
        .unwrap();
    assert!(
        t0.elapsed() < Duration::from_millis(300),
        "start returns at once"
    );
    assert_eq!(s.state, EnvState::Pending);
    let workdir = s.workdir.clone().unwrap();
    assert!(workdir.ends_with("env-p"));
    assert!(matches!(
        env.start("p", spec("true", None, None)),
        Err(ToolError::AlreadyPreparing(_))
    ));
    let s = env.wait("p", Duration::from_secs(10)).await.unwrap();
    assert_eq!(s.state, EnvState::Ready, "{s:?}");
    assert!(s.duration_s.unwrap() >= 0.5);
    assert_eq!(
        std::fs::read_to_string(Path::new(&workdir).join("marker")).unwrap(),
        "ready\n"
    );
    let kinds: Vec<&str> = tools
        .registry
        .program("p")
        .unwrap()
        .resources
        .iter()
        .map(|r| r.kind)
        .collect();
    assert_eq!(kinds, vec!["dir", "process_tree"]);
    tools.program_ended("p", "final");
    assert!(tools.registry.wait_idle(Duration::from_secs(10)).await);
    assert!(!Path::new(&workdir).exists());
    assert_eq!(
        tools.registry.metrics().live,
        0,
        "the background sleep's group was killed"
    );

    // Failures carry the command's stderr; timeouts kill the group.
    env.start("f", spec("echo broken >&2; exit 3", Some("f-dir"), None))
        .unwrap();
    let s = env.wait("f", Duration::from_secs(10)).await.unwrap();
    assert_eq!(s.state, EnvState::Failed);
    assert!(s.error.as_deref().unwrap().contains("broken"), "{s:?}");
    env.start("slow", spec("sleep 30", None, Some(0.3)))
        .unwrap();
    let s = env.wait("slow", Duration::from_secs(10)).await.unwrap();
    assert!(s.error.as_deref().unwrap().contains("timed out"), "{s:?}");
    // Bad specs.
    for bad in [
        spec("true", Some("../escape"), None),
        spec("true", Some("/etc"), None),
        spec("", None, None),
        spec("true", None, Some(-1.0)),
        EnvironmentSpec {
            local: None,
            docker: None,
        },
    ] {
        let e = env.start("bad", bad).unwrap_err();
        assert!(e.is_client_error(), "{e}");
    }
}
