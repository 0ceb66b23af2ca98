//! Slow and silent clients: thousands of connections that never finish
//! their request head are closed after the header timeout, the server
//! never holds more than its connection cap, and `/health` answers.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use agentd_server::ConnectionLimits;

use crate::common;

/// Open file descriptors of this process (the server runs in it).
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

#[test]
fn half_open_connections_time_out_and_health_still_answers() {
    const FLOOD: usize = 3000;
    const CAP: usize = 2048;
    let timeout = Duration::from_millis(1500);
    let srv = common::start_tweaked(
        None,
        common::test_config(),
        agentd_tools::ToolsConfig::default(),
        |s| {
            s.connections = ConnectionLimits {
                header_read_timeout: timeout,
                max_connections: CAP,
            }
        },
    );
    let addr = srv.addr;
    let before = open_fds();
    // Each sends half a request head and then nothing.
    let mut flood = Vec::with_capacity(FLOOD);
    let mut refused = 0;
    for _ in 0..FLOOD {
        // A generous timeout: on a loaded 2-core VM the kernel's SYN queue
        // and the accept loop fall behind a tight connect loop for a moment
        // (200 ms gave up after 400-800 connections in one run of five).
        let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(1000)) else {
            // The listen backlog is full: that is the back-pressure.
            refused += 1;
            if refused == 3 {
                break;
            }
            continue;
        };
        refused = 0;
        let _ = s.write_all(b"GET /health HTTP/1.1\r\nHost: t\r\n");
        flood.push(s);
    }
    // On a loaded machine the kernel may stop queueing before the cap is
    // reached; thousands are enough to show the limit and the timeout.
    assert!(flood.len() >= 1000, "only {} connected", flood.len());
    // The server side holds at most CAP of them (the test's own client
    // sockets are the other `flood.len()` fds).
    std::thread::sleep(Duration::from_millis(300));
    let server_fds = open_fds().saturating_sub(before + flood.len());
    assert!(
        server_fds <= CAP + 16,
        "{server_fds} server fds for a cap of {CAP}"
    );
    // A real client gets through while the flood is still open: accepted
    // as silent connections time out.
    let t0 = Instant::now();
    let r = common::get(addr, "/health");
    assert_eq!(r.status, 200);
    let waited = t0.elapsed();
    assert!(waited < Duration::from_secs(30), "{waited:?}");
    // The first silent connections were closed by the server (EOF), not
    // kept forever.
    let mut closed = 0;
    for s in flood.iter_mut().take(CAP) {
        s.set_read_timeout(Some(timeout * 4)).ok();
        let mut buf = [0u8; 64];
        if matches!(s.read(&mut buf), Ok(0) | Err(_)) {
            closed += 1;
        }
    }
    assert_eq!(
        closed,
        CAP.min(flood.len()),
        "silent connections the server closed"
    );
    println!(
        "connection flood: {} half-open connections ({} connected), cap {CAP}, /health answered after {:.2}s",
        FLOOD,
        flood.len(),
        waited.as_secs_f64()
    );
    drop(flood);
    crate::assert_settled(addr);
    srv.stop();
}

#[test]
fn an_idle_keep_alive_connection_is_closed() {
    let timeout = Duration::from_millis(500);
    let srv = common::start_tweaked(
        None,
        common::test_config(),
        agentd_tools::ToolsConfig::default(),
        |s| {
            s.connections = ConnectionLimits {
                header_read_timeout: timeout,
                ..ConnectionLimits::default()
            }
        },
    );
    let mut s = TcpStream::connect(srv.addr).expect("connect");
    s.write_all(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        .expect("write");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let mut buf = [0u8; 1024];
    let n = s.read(&mut buf).expect("response");
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    // Then nothing: the server hangs up once the connection idles.
    let t0 = Instant::now();
    let n = s.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "closed");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    srv.stop();
}
