//! `agentd serve owner/name` against a loopback server that speaks the
//! Hub's file API (`HF_ENDPOINT`): the listing
//! (`/api/models/{repo}/revision/{rev}`) and `resolve` with `Range`, serving
//! a checkpoint `make-model` wrote. The repository id downloads into a
//! temporary `HF_HOME` in huggingface_hub's layout and serves the greedy
//! tokens of the same directory served directly; a connection cut mid-file
//! leaves no corrupt cache and the next start resumes it; a start with
//! `HF_HUB_OFFLINE=1` and the mock gone serves from the cache; a missing
//! revision, a private repository without a token and an offline start
//! with an empty cache each fail with one clear line.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{http, serve_fails_env, spawn_serve_env};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const COMMIT: &str = "3f1c2a9b8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a";
const TOKEN: &str = "hf_test_secret";

fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// A repository the mock serves: files by name, and whether it needs
/// `Authorization: Bearer TOKEN`.
struct Repo {
    files: Vec<(String, Vec<u8>)>,
    private: bool,
}

/// The loopback Hub. Every request line (with its Range) is logged;
/// `cut_next` downloads of a `.safetensors` file stop half way.
struct MockHub {
    addr: String,
    log: Arc<Mutex<Vec<String>>>,
    cut_next: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Drop for MockHub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees `stop` and closes the port.
        let _ = TcpStream::connect(&self.addr);
    }
}

impl MockHub {
    fn start(repos: HashMap<String, Repo>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let hub = MockHub {
            addr,
            log: Arc::default(),
            cut_next: Arc::default(),
            stop: Arc::default(),
        };
        let (log, cut, stop) = (hub.log.clone(), hub.cut_next.clone(), hub.stop.clone());
        let repos = Arc::new(repos);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (repos, log, cut) = (repos.clone(), log.clone(), cut.clone());
                std::thread::spawn(move || answer(conn, &repos, &log, &cut));
            }
        });
        hub
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn requests(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

fn answer(
    mut conn: TcpStream,
    repos: &HashMap<String, Repo>,
    log: &Mutex<Vec<String>>,
    cut: &AtomicUsize,
) {
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() || line.is_empty() {
        return;
    }
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
        }
    }
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let range = headers.get("range").cloned();
    log.lock()
        .unwrap()
        .push(format!("{path} range={}", range.as_deref().unwrap_or("-")));
    let reply = |conn: &mut TcpStream, status: &str, extra: &str, body: &[u8]| {
        let _ = write!(
            conn,
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n",
            body.len()
        );
        let _ = conn.write_all(body);
    };
    let authorized =
        headers.get("authorization").map(String::as_str) == Some(&format!("Bearer {TOKEN}"));
    // /api/models/{o}/{n}/revision/{rev}?blobs=True
    if let Some(rest) = path.strip_prefix("/api/models/") {
        let parts: Vec<&str> = rest.splitn(4, '/').collect();
        let (repo_id, rev) = match parts.as_slice() {
            [o, n, "revision", rev] => (format!("{o}/{n}"), rev.split('?').next().unwrap_or("")),
            _ => return reply(&mut conn, "400 Bad Request", "", b"{}"),
        };
        let Some(repo) = repos.get(&repo_id) else {
            return reply(
                &mut conn,
                "404 Not Found",
                "X-Error-Code: RepoNotFound\r\n",
                b"{}",
            );
        };
        if repo.private && !authorized {
            return reply(
                &mut conn,
                "401 Unauthorized",
                "X-Error-Code: RepoNotFound\r\n",
                b"{}",
            );
        }
        if rev != "main" && rev != COMMIT {
            return reply(
                &mut conn,
                "404 Not Found",
                "X-Error-Code: RevisionNotFound\r\n",
                b"{}",
            );
        }
        let siblings: Vec<Value> = repo
            .files
            .iter()
            .map(|(name, bytes)| {
                let sha = sha256_hex(bytes);
                if name.ends_with(".safetensors") {
                    json!({"rfilename": name, "size": bytes.len(), "blobId": &sha[..40],
                           "lfs": {"sha256": sha, "size": bytes.len(), "pointerSize": 134}})
                } else {
                    json!({"rfilename": name, "size": bytes.len(), "blobId": &sha[..40]})
                }
            })
            .collect();
        let body = json!({"id": repo_id, "sha": COMMIT, "siblings": siblings}).to_string();
        return reply(
            &mut conn,
            "200 OK",
            "Content-Type: application/json\r\n",
            body.as_bytes(),
        );
    }
    // /{o}/{n}/resolve/{commit}/{file}
    let parts: Vec<&str> = path.trim_start_matches('/').splitn(5, '/').collect();
    let [o, n, "resolve", rev, file] = parts.as_slice() else {
        return reply(&mut conn, "404 Not Found", "", b"");
    };
    let Some(repo) = repos.get(&format!("{o}/{n}")) else {
        return reply(&mut conn, "404 Not Found", "", b"");
    };
    if repo.private && !authorized {
        return reply(&mut conn, "401 Unauthorized", "", b"");
    }
    let Some((_, bytes)) = repo
        .files
        .iter()
        .find(|(f, _)| f == file)
        .filter(|_| *rev == COMMIT)
    else {
        return reply(
            &mut conn,
            "404 Not Found",
            "X-Error-Code: EntryNotFound\r\n",
            b"",
        );
    };
    let from = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.trim_end_matches('-').parse::<usize>().ok())
        .filter(|&f| f < bytes.len());
    let (status, body, extra) = match from {
        Some(f) => (
            "206 Partial Content",
            &bytes[f..],
            format!(
                "Content-Range: bytes {f}-{}/{}\r\n",
                bytes.len() - 1,
                bytes.len()
            ),
        ),
        None => ("200 OK", &bytes[..], String::new()),
    };
    let cutting = file.ends_with(".safetensors")
        && cut
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| c.checked_sub(1))
            .is_ok();
    if cutting {
        // Promise the whole body, send half, hang up.
        let _ = write!(
            conn,
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n",
            body.len()
        );
        let _ = conn.write_all(&body[..body.len() / 2]);
        let _ = conn.flush();
        return;
    }
    reply(&mut conn, status, &extra, body);
}

fn agentd() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_agentd"))
}

/// The tiny Qwen3 as `make-model` writes it (weights, config, tokenizer).
fn make_model(dir: &Path) {
    let card = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/qwen3-tiny.json");
    let out = agentd()
        .args(["make-model", "--config"])
        .arg(&card)
        .arg("--out")
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The repository the mock serves: the model's files, plus files a model
/// does not need (never fetched).
fn repo_of(dir: &Path, private: bool) -> Repo {
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            files.push((
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            ));
        }
    }
    files.push(("README.md".into(), b"# tiny\n".to_vec()));
    files.push(("pytorch_model.bin".into(), vec![7u8; 1000]));
    files.push(("original/consolidated.safetensors".into(), vec![1u8; 100]));
    Repo { files, private }
}

/// Environment of a start against `endpoint` with its cache in `hf_home`.
fn hub_env<'a>(endpoint: &'a str, hf_home: &'a str, offline: bool) -> Vec<(&'a str, &'a str)> {
    vec![
        ("HF_ENDPOINT", endpoint),
        ("HF_HOME", hf_home),
        ("HF_HUB_CACHE", ""),
        ("HF_TOKEN", ""),
        ("HF_HUB_OFFLINE", if offline { "1" } else { "0" }),
        // A proxy set for the machine (ureq honours *_PROXY) must not carry
        // the loopback Hub's traffic.
        ("NO_PROXY", "127.0.0.1,localhost"),
        ("no_proxy", "127.0.0.1,localhost"),
    ]
}

/// Greedy completion of a fixed prompt: the generated token ids.
fn greedy(addr: &str, model: &str) -> Vec<u64> {
    let (status, body) = http(
        addr,
        "POST",
        "/v1/completions",
        Some(
            &json!({"model": model, "prompt": "The capital of France is", "max_tokens": 12,
                     "temperature": 0, "ignore_eos": true, "return_token_ids": true}),
        ),
    );
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let ids: Vec<u64> = v["choices"][0]["token_ids"]
        .as_array()
        .unwrap_or_else(|| panic!("token_ids in {v}"))
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    assert_eq!(ids.len(), 12, "{v}");
    ids
}

fn error_line(lines: &[String]) -> String {
    let errors: Vec<&String> = lines.iter().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "one error line: {lines:#?}");
    errors[0].clone()
}

#[test]
fn serve_repo_id_downloads_resumes_and_serves_offline() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    make_model(&src);
    let hub = MockHub::start(HashMap::from([(
        "acme/tiny".to_owned(),
        repo_of(&src, false),
    )]));
    let endpoint = hub.endpoint();
    let hf_home = tmp.path().join("hf");
    let hf = hf_home.to_str().unwrap();
    let args = ["acme/tiny", "--num-kv-blocks", "64"];

    // 1. The connection drops half way through the weights: one error line
    // naming the kept partial file; the snapshot holds no weights.
    hub.cut_next.store(1, Ordering::SeqCst);
    let (status, lines) = serve_fails_env("serve-hub", args, &hub_env(&endpoint, hf, false));
    assert!(!status.success());
    let err = error_line(&lines);
    assert!(
        err.contains("model.safetensors") && err.contains("resumes"),
        "{err}"
    );
    let repo_dir = hf_home.join("hub/models--acme--tiny");
    let snapshot = repo_dir.join("snapshots").join(COMMIT);
    assert!(snapshot.join("config.json").is_file());
    assert!(
        !snapshot.join("model.safetensors").exists(),
        "no weights before they are whole"
    );
    let weights = std::fs::read(src.join("model.safetensors")).unwrap();
    let partial = repo_dir.join(format!("blobs/{}.incomplete", sha256_hex(&weights)));
    let kept = std::fs::metadata(&partial).unwrap().len();
    assert!(kept > 0 && kept < weights.len() as u64, "{kept}");

    // 2. The next start resumes at the partial file's end and serves.
    let (server, addr, _logs) = spawn_serve_env("serve-hub", args, &hub_env(&endpoint, hf, false));
    let from_hub = greedy(&addr, "acme/tiny");
    let (_, models) = http(&addr, "GET", "/v1/models", None);
    assert!(models.contains("\"acme/tiny\""), "{models}");
    drop(server);
    let reqs = hub.requests();
    assert!(
        reqs.iter()
            .any(|r| r.contains("/resolve/") && r.ends_with(&format!("range=bytes={kept}-"))),
        "a Range request resumes the weights: {reqs:#?}"
    );
    // Only the files a model needs were fetched.
    for unwanted in ["README.md", "pytorch_model.bin", "consolidated"] {
        assert!(
            !reqs.iter().any(|r| r.contains(unwanted)),
            "{unwanted} fetched: {reqs:#?}"
        );
    }
    // huggingface_hub's layout: refs/main, snapshot links into blobs/,
    // the blob byte-identical to the source, no partial file left.
    assert_eq!(
        std::fs::read_to_string(repo_dir.join("refs/main")).unwrap(),
        COMMIT
    );
    let link = std::fs::read_link(snapshot.join("model.safetensors")).unwrap();
    assert!(link.starts_with("../../blobs"), "{}", link.display());
    assert_eq!(
        std::fs::read(snapshot.join("model.safetensors")).unwrap(),
        weights
    );
    assert!(!partial.exists());

    // 3. The directory itself serves the same greedy tokens.
    let (server, addr, _logs) = spawn_serve_env(
        "serve-hub",
        [
            src.to_str().unwrap(),
            "--num-kv-blocks",
            "64",
            "--served-model-name",
            "acme/tiny",
        ],
        &[],
    );
    assert_eq!(greedy(&addr, "acme/tiny"), from_hub);
    drop(server);

    // 4. Offline, with the Hub gone: served from the cache, no request.
    let seen = hub.requests().len();
    drop(hub);
    let (_server, addr, logs) = spawn_serve_env("serve-hub", args, &hub_env(&endpoint, hf, true));
    assert_eq!(greedy(&addr, "acme/tiny"), from_hub);
    let logs: Vec<String> = logs.try_iter().collect();
    assert!(
        logs.iter()
            .any(|l| l.contains("model found in the Hugging Face cache")),
        "{logs:#?}"
    );
    assert!(seen > 0);
}

#[test]
fn hub_failures_are_one_clear_line() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    make_model(&src);
    let hub = MockHub::start(HashMap::from([
        ("acme/tiny".to_owned(), repo_of(&src, false)),
        ("acme/private".to_owned(), repo_of(&src, true)),
    ]));
    let endpoint = hub.endpoint();
    let hf_home = tmp.path().join("hf");
    let hf = hf_home.to_str().unwrap();
    let env = hub_env(&endpoint, hf, false);
    let fails = |args: &[&str], env: &[(&str, &str)]| {
        let (status, lines) = serve_fails_env("serve-hub-errors", args, env);
        assert!(!status.success());
        error_line(&lines)
    };

    let err = fails(&["acme/tiny", "--revision", "v9"], &env);
    assert!(err.contains("revision \"v9\" not found"), "{err}");
    let err = fails(&["acme/nothing"], &env);
    assert!(err.contains("repository not found"), "{err}");

    // Private: 401 without a token, names HF_TOKEN; the token opens it.
    let err = fails(&["acme/private"], &env);
    assert!(err.contains("401") && err.contains("HF_TOKEN"), "{err}");
    let mut with_token = env.clone();
    with_token.retain(|(k, _)| *k != "HF_TOKEN");
    with_token.push(("HF_TOKEN", TOKEN));
    let (_server, addr, _logs) = spawn_serve_env(
        "serve-hub-errors",
        ["acme/private", "--num-kv-blocks", "64"],
        &with_token,
    );
    assert_eq!(greedy(&addr, "acme/private").len(), 12);

    // Offline with an empty cache: the missing files and the cache path,
    // and no request reaches the Hub.
    let before = hub.requests().len();
    let err = fails(&["acme/tiny"], &hub_env(&endpoint, hf, true));
    assert!(
        err.contains("HF_HUB_OFFLINE")
            && err.contains("models--acme--tiny")
            && err.contains("refs/main"),
        "{err}"
    );
    assert_eq!(hub.requests().len(), before, "offline made a request");
    // A KV cache too small for the model's window is refused from the
    // config alone, before any weights are requested.
    let before = hub.requests().len();
    let err = fails(&["acme/tiny", "--kv-cache-memory", "65536"], &env);
    assert!(
        err.contains("cannot hold one request") && err.contains("before downloading"),
        "{err}"
    );
    let asked = hub.requests()[before..].to_vec();
    assert!(
        asked.iter().any(|r| r.contains("/config.json")),
        "{asked:?}"
    );
    assert!(
        !asked.iter().any(|r| r.contains(".safetensors")),
        "{asked:?}"
    );
    // Neither a directory nor an id.
    let err = fails(&["no-such-dir"], &env);
    assert!(
        err.contains("neither a directory nor a repository id"),
        "{err}"
    );
}
