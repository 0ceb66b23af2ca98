//! Tests of `local.rs`.

use super::*;
use std::os::unix::process::CommandExt;

fn sandbox() -> (tempfile::TempDir, LocalSandbox) {
    let t = tempfile::tempdir().unwrap();
    let foreign = ForeignPids {
        allow: true,
        any_uid: false,
    };
    let s = LocalSandbox::new(Some(t.path()), Duration::from_millis(200), foreign).unwrap();
    (t, s)
}

#[test]
fn paths_must_stay_strictly_inside_the_root() {
    let (t, s) = sandbox();
    let root = t.path().canonicalize().unwrap();
    assert_eq!(
        s.check_dir(Path::new("p1/work")).unwrap(),
        root.join("p1/work")
    );
    std::fs::create_dir(root.join("p2")).unwrap();
    assert_eq!(s.check_dir(&root.join("p2")).unwrap(), root.join("p2"));
    for bad in [
        root.clone(),
        root.join("p2/../../x"),
        PathBuf::from("/etc"),
        PathBuf::from("/"),
    ] {
        let e = s.check_dir(&bad).unwrap_err();
        assert!(matches!(e, ToolError::Refused { .. }), "{bad:?}: {e}");
    }
    // A symlink inside the root that points outside is an escape.
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), root.join("esc")).unwrap();
    let e = s.check_dir(&root.join("esc/sub")).unwrap_err();
    assert!(e.to_string().contains("not inside the sandbox root"), "{e}");
    std::os::unix::fs::symlink("/nonexistent-target", root.join("dangling")).unwrap();
    assert!(s.check_dir(&root.join("dangling/x")).is_err());
    // Paths the kernel refuses are the client's error, naming the path.
    std::fs::write(root.join("file"), b"x").unwrap();
    let long = "n".repeat(300);
    for bad in ["file/sub", "a\0b", long.as_str()] {
        let e = s.check_dir(Path::new(bad)).unwrap_err();
        assert!(matches!(e, ToolError::Refused { .. }), "{bad:?}: {e}");
        assert!(e.is_client_error());
        assert!(e.to_string().contains(&bad[..4.min(bad.len())]), "{e}");
    }
    let none = LocalSandbox::new(None, Duration::ZERO, ForeignPids::default()).unwrap();
    assert!(none
        .check_dir(Path::new("/tmp/x"))
        .unwrap_err()
        .to_string()
        .contains("--sandbox-root"));
}

#[test]
fn pids_that_must_never_be_signalled_are_refused() {
    let (_t, s) = sandbox();
    for pid in [-5, 0, 1, std::process::id() as i32] {
        assert!(
            matches!(s.check_pid(pid), Err(ToolError::Refused { .. })),
            "{pid}"
        );
    }
    // A child in our own process group.
    let mut same = std::process::Command::new("sleep")
        .arg("5")
        .spawn()
        .unwrap();
    let e = s.check_pid(same.id() as i32).unwrap_err();
    assert!(e.to_string().contains("own process group"), "{e}");
    same.kill().unwrap();
    same.wait().unwrap();
    // Without --allow-foreign-pids no declared pid is admitted.
    let mut own = std::process::Command::new("sleep")
        .arg("5")
        .process_group(0)
        .spawn()
        .unwrap();
    let strict = LocalSandbox::new(None, Duration::ZERO, ForeignPids::default()).unwrap();
    let e = strict.check_pid(own.id() as i32).unwrap_err();
    assert!(e.to_string().contains("--allow-foreign-pids"), "{e}");
    assert!(
        s.check_pid(own.id() as i32).is_ok(),
        "admitted with the flag"
    );
    own.kill().unwrap();
    own.wait().unwrap();
    // Another uid's process (spawnable only as root): refused even with
    // the flag unless any uid is allowed.
    // SAFETY: geteuid only reads process state.
    if unsafe { libc::geteuid() } == 0 {
        let mut other = std::process::Command::new("sleep")
            .arg("5")
            .uid(65534)
            .gid(65534)
            .process_group(0)
            .spawn()
            .unwrap();
        let e = s.check_pid(other.id() as i32).unwrap_err();
        assert!(e.to_string().contains("uid 65534"), "{e}");
        let any = ForeignPids {
            allow: true,
            any_uid: true,
        };
        let lax = LocalSandbox::new(None, Duration::ZERO, any).unwrap();
        assert!(lax.check_pid(other.id() as i32).is_ok());
        other.kill().unwrap();
        other.wait().unwrap();
    }
}

#[tokio::test]
async fn a_reused_pid_is_never_signalled() {
    let (_t, s) = sandbox();
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .process_group(0)
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let Resource::ProcessGroup { started, .. } = s.check_pid(pid).unwrap() else {
        panic!("a group leader");
    };
    assert!(started > 0, "start time read from /proc");
    // As if the declared process had died and its pid been reused by
    // this one: different start time.
    let other = Resource::ProcessGroup {
        pid,
        started: started - 1,
    };
    s.reclaim(&other).await.unwrap();
    assert!(child.try_wait().unwrap().is_none(), "left alone");
    let declared = Resource::ProcessGroup { pid, started };
    s.reclaim(&declared).await.unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&child.wait().unwrap()),
        Some(libc::SIGTERM)
    );
}

#[tokio::test]
async fn a_symlink_swapped_in_after_declaration_is_left_alone() {
    let (t, s) = sandbox();
    let root = t.path().canonicalize().unwrap();
    let d = s.check_dir(Path::new("work")).unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("keep"), b"x").unwrap();
    std::os::unix::fs::symlink(outside.path(), root.join("work")).unwrap();
    assert!(s.reclaim(&Resource::Dir(d)).await.is_err());
    assert!(outside.path().join("keep").exists());
}
