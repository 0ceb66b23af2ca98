//! Who may kill what (issue 15): declared pids are refused unless the
//! operator opts in; environment commands are off unless allowed, run as
//! the sandbox user, and everything they start — `setsid` and double-forked
//! children too — dies with the program.

mod common;

use std::time::{Duration, Instant};

use agentd_tools::ToolsConfig;
use common::{get, post, start_tools, test_config, tool_process};
use serde_json::json;

/// Pids of live (not zombie) processes whose command line is `sleep <arg>`.
fn sleepers(arg: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let live = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rfind(')')
                .is_some_and(|i| !s[i + 1..].trim_start().starts_with('Z'))
        });
        if live && cmd == format!("sleep\0{arg}\0").as_bytes() {
            out.push(pid);
        }
    }
    out
}

#[test]
fn declared_pids_and_environment_commands_are_off_by_default() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let srv = start_tools(
        None,
        test_config(),
        ToolsConfig {
            sandbox_root: Some(tmp.path().to_path_buf()),
            ..ToolsConfig::default()
        },
    );
    let mut victim = tool_process();
    let r = post(
        srv.addr,
        "/programs/p/resources",
        &json!({"pids": [victim.id()]}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("--allow-foreign-pids"), "{}", r.body);
    let r = post(
        srv.addr,
        "/programs/p/environment",
        &json!({"local": {"command": "true"}}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.body.contains("--allow-environment-commands"),
        "{}",
        r.body
    );
    // A release of the program signals nothing.
    post(srv.addr, "/programs/release", &json!({"program_id": "p"}));
    std::thread::sleep(Duration::from_millis(200));
    assert!(victim.try_wait().expect("try_wait").is_none(), "left alone");
    victim.kill().expect("kill");
    victim.wait().expect("wait");
    srv.stop();
}

#[test]
fn an_environments_detached_children_die_with_its_program() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().canonicalize().expect("root");
    let srv = start_tools(
        None,
        test_config(),
        ToolsConfig {
            sandbox_root: Some(root.clone()),
            kill_grace: Duration::from_millis(300),
            commands: common::test_commands(&root),
            ..ToolsConfig::default()
        },
    );
    // A new session, a double fork, and a process group of its own.
    let command = "setsid sleep 4242 & (sleep 4243 &) ; (set -m; sleep 4244 &) ; id -u > whoami";
    let r = post(
        srv.addr,
        "/programs/env/environment",
        &json!({"local": {"command": command, "workdir": "env"}}),
    );
    assert_eq!(r.status, 202, "{}", r.body);
    let s = get(srv.addr, "/programs/env/environment?wait=30").json();
    assert_eq!(s["state"], "ready", "{s}");
    let whoami = std::fs::read_to_string(root.join("env/whoami")).expect("whoami");
    // SAFETY: geteuid only reads process state.
    if unsafe { libc::geteuid() } == 0 {
        assert_eq!(whoami.trim(), "65534", "ran as the sandbox user");
    }
    for arg in ["4242", "4243", "4244"] {
        assert_eq!(sleepers(arg).len(), 1, "sleep {arg} running");
    }
    let r = post(srv.addr, "/programs/release", &json!({"program_id": "env"}));
    assert_eq!(r.status, 200, "{}", r.body);
    let deadline = Instant::now() + Duration::from_secs(15);
    while ["4242", "4243", "4244"]
        .iter()
        .any(|a| !sleepers(a).is_empty())
    {
        assert!(
            Instant::now() < deadline,
            "survivors: {:?}",
            ["4242", "4243", "4244"].map(sleepers)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The directory goes after the processes (the reclaim kills, then
    // removes): wait for it under the same deadline.
    while root.join("env").exists() {
        assert!(Instant::now() < deadline, "its directory is reclaimed");
        std::thread::sleep(Duration::from_millis(20));
    }
    srv.stop();
}
