//! 200 agent programs churned over a real socket, each declaring a real
//! directory and a real process group and ending by `final` or by release:
//! afterwards nothing is live, every directory is gone and every process
//! dead. Prints the figures (programs, resources, reclaim latency p50/p99).

mod common;

use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use agentd_tools::{DockerConfig, ReclaimConfig, ToolsConfig};
use common::{assert_terminated, get, metric, post, start_tools, test_config, tool_process};
use serde_json::{json, Value};

fn completion(addr: std::net::SocketAddr, extra: Value) -> common::Resp {
    let mut body =
        json!({"model": common::MODEL, "prompt": "ls -la", "max_tokens": 1, "temperature": 0});
    for (k, v) in extra.as_object().expect("object") {
        body[k] = v.clone();
    }
    post(addr, "/v1/completions", &body)
}

fn program(addr: std::net::SocketAddr, id: &str) -> Value {
    let r = get(addr, &format!("/programs/{id}"));
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[test]
fn churning_200_programs_leaves_no_live_resource() {
    const PROGRAMS: usize = 200;
    const WORKERS: usize = 8;
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().canonicalize().expect("canonical");
    let srv = start_tools(
        None,
        test_config(),
        ToolsConfig {
            sandbox_root: Some(root.clone()),
            kill_grace: Duration::from_millis(500),
            docker: DockerConfig {
                socket: root.join("missing-docker.sock"),
                ..DockerConfig::default()
            },
            reclaim: ReclaimConfig {
                concurrency: 8,
                ..ReclaimConfig::default()
            },
            foreign_pids: agentd_tools::ForeignPids {
                allow: true,
                any_uid: false,
            },
            ..ToolsConfig::default()
        },
    );
    let addr = srv.addr;
    let t0 = Instant::now();
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let root = root.clone();
            std::thread::spawn(move || {
                let mut children = Vec::new();
                for i in (w..PROGRAMS).step_by(WORKERS) {
                    let id = format!("churn-{i}");
                    let dir = root.join(&id);
                    std::fs::create_dir_all(dir.join("tmp")).expect("mkdir");
                    std::fs::write(dir.join("tmp/out.log"), b"log").expect("write");
                    let child = tool_process();
                    // Alternate how programs end: final, or a release.
                    let fin = i % 2 == 0;
                    let r = completion(
                        addr,
                        json!({"program_id": id, "final": fin,
                               "extra_body": {"tool_resources": {"dirs": [dir], "pids": [child.id()]}}}),
                    );
                    assert_eq!(r.status, 200, "{}", r.body);
                    if !fin {
                        let r = post(addr, "/programs/release", &json!({"program_id": id}));
                        assert_eq!(r.status, 200, "{}", r.body);
                    }
                    children.push((id, dir, child));
                }
                children
            })
        })
        .collect();
    let children: Vec<(String, PathBuf, Child)> = workers
        .into_iter()
        .flat_map(|w| w.join().expect("worker"))
        .collect();
    let submitted = t0.elapsed();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let m = get(addr, "/metrics").body;
        if metric(&m, "agentd:tool_resources_live") == 0.0 {
            break;
        }
        assert!(Instant::now() < deadline, "resources still live:\n{m}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let total = t0.elapsed();
    let mut latencies = Vec::new();
    for (id, dir, child) in children {
        let v = program(addr, &id);
        for r in v["tool_resources"]["resources"]
            .as_array()
            .expect("resources")
        {
            assert_eq!(r["state"], "reclaimed", "{id}: {r}");
            latencies.push(r["reclaim_latency_s"].as_f64().expect("latency"));
        }
        assert!(!dir.exists(), "{id}'s directory remains");
        assert_terminated(child);
    }
    latencies.sort_by(f64::total_cmp);
    let m = get(addr, "/metrics").body;
    let reclaimed = metric(&m, "agentd:tool_resources_reclaimed_total");
    let failed = metric(&m, "agentd:tool_resources_failed_total");
    let live = metric(&m, "agentd:tool_resources_live");
    eprintln!(
        "CHURN: programs={PROGRAMS} resources={} (dirs+process groups) reclaimed={reclaimed} failed={failed} live={live} \
         reclaim latency p50={:.1}ms p99={:.1}ms max={:.1}ms; requests done in {:.2}s, all reclaimed at {:.2}s",
        latencies.len(),
        percentile(&latencies, 0.5) * 1e3,
        percentile(&latencies, 0.99) * 1e3,
        latencies.last().copied().unwrap_or(0.0) * 1e3,
        submitted.as_secs_f64(),
        total.as_secs_f64(),
    );
    assert_eq!(latencies.len(), 2 * PROGRAMS);
    assert_eq!((reclaimed, failed, live), (400.0, 0.0, 0.0));
    let left: Vec<_> = std::fs::read_dir(&root).expect("root").collect();
    assert!(left.is_empty(), "the sandbox root is empty: {left:?}");
    srv.stop();
}
