//! The Docker backend's request logic against a mock of the Engine API on a
//! real unix socket (axum on a UnixListener in a temp dir), and against a
//! real daemon when one is reachable.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentd_tools::{
    DockerBackend, DockerConfig, DockerSetup, EnvState, EnvironmentSpec, ReclaimConfig,
    ResourceState, ToolError, ToolResources, Tools, ToolsConfig,
};
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

#[derive(Default)]
struct Daemon {
    /// container id → image
    containers: HashMap<String, String>,
    images: HashSet<String>,
    volumes: HashSet<String>,
    calls: Vec<String>,
    next: u32,
}

type Mock = Arc<Mutex<Daemon>>;

fn log(m: &Mock, method: &str, uri: &Uri) {
    m.lock()
        .unwrap()
        .calls
        .push(format!("{method} {}", uri.path()));
}

async fn inspect(State(m): State<Mock>, uri: Uri, UrlPath(id): UrlPath<String>) -> Response {
    log(&m, "GET", &uri);
    match m.lock().unwrap().containers.get(&id) {
        Some(img) => Json(json!({"Id": id, "Image": img})).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            Json(json!({"message": format!("No such container: {id}")})),
        )
            .into_response(),
    }
}

async fn stop(
    State(m): State<Mock>,
    uri: Uri,
    UrlPath(id): UrlPath<String>,
    Query(q): Query<HashMap<String, String>>,
) -> StatusCode {
    log(&m, "POST", &uri);
    assert_eq!(q.get("t").map(String::as_str), Some("10"));
    if m.lock().unwrap().containers.contains_key(&id) {
        StatusCode::NO_CONTENT
    } else {
        StatusCode::NOT_FOUND
    }
}

async fn remove(
    State(m): State<Mock>,
    uri: Uri,
    UrlPath(id): UrlPath<String>,
    Query(q): Query<HashMap<String, String>>,
) -> StatusCode {
    log(&m, "DELETE", &uri);
    assert_eq!(q.get("force").map(String::as_str), Some("true"));
    let mut d = m.lock().unwrap();
    d.calls
        .push(format!("v={}", q.get("v").cloned().unwrap_or_default()));
    if d.containers.remove(&id).is_some() {
        StatusCode::NO_CONTENT
    } else {
        StatusCode::NOT_FOUND
    }
}

async fn list(
    State(m): State<Mock>,
    uri: Uri,
    Query(q): Query<HashMap<String, String>>,
) -> Json<Value> {
    log(&m, "GET", &uri);
    assert_eq!(q.get("all").map(String::as_str), Some("true"));
    let filters: Value =
        serde_json::from_str(q.get("filters").expect("filters")).expect("filters JSON");
    let image = filters["ancestor"][0]
        .as_str()
        .expect("ancestor")
        .to_string();
    let d = m.lock().unwrap();
    let v: Vec<Value> = d
        .containers
        .iter()
        .filter(|(_, i)| **i == image)
        .map(|(c, _)| json!({"Id": c}))
        .collect();
    Json(json!(v))
}

async fn rm_image(State(m): State<Mock>, uri: Uri, UrlPath(name): UrlPath<String>) -> Response {
    log(&m, "DELETE", &uri);
    if m.lock().unwrap().images.remove(&name) {
        Json(json!([{"Deleted": name}])).into_response()
    } else {
        StatusCode::NOT_FOUND.into_response()
    }
}

async fn image_json(State(m): State<Mock>, uri: Uri, UrlPath(name): UrlPath<String>) -> StatusCode {
    log(&m, "GET", &uri);
    if m.lock().unwrap().images.contains(&name) {
        StatusCode::OK
    } else {
        StatusCode::NOT_FOUND
    }
}

async fn pull(
    State(m): State<Mock>,
    uri: Uri,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    log(&m, "POST", &uri);
    let name = format!("{}:{}", q["fromImage"], q["tag"]);
    if name.starts_with("missing") {
        // The daemon reports pull failures inside a 200 stream.
        return (
            StatusCode::OK,
            "{\"status\":\"Pulling\"}\n{\"error\":\"manifest unknown\"}\n",
        )
            .into_response();
    }
    m.lock().unwrap().images.insert(name);
    (
        StatusCode::OK,
        "{\"status\":\"Pulling\"}\n{\"status\":\"Done\"}\n",
    )
        .into_response()
}

async fn create(State(m): State<Mock>, uri: Uri, Json(spec): Json<Value>) -> Response {
    log(&m, "POST", &uri);
    let mut d = m.lock().unwrap();
    let image = spec["Image"].as_str().unwrap().to_string();
    assert!(spec["Labels"]["agentd.program"].is_string());
    d.next += 1;
    let id = format!("c{:04}", d.next);
    d.containers.insert(id.clone(), image);
    (StatusCode::CREATED, Json(json!({"Id": id, "Warnings": []}))).into_response()
}

async fn start(State(m): State<Mock>, uri: Uri) -> StatusCode {
    log(&m, "POST", &uri);
    StatusCode::NO_CONTENT
}

async fn rm_volume(State(m): State<Mock>, uri: Uri, UrlPath(name): UrlPath<String>) -> StatusCode {
    log(&m, "DELETE", &uri);
    if m.lock().unwrap().volumes.remove(&name) {
        StatusCode::NO_CONTENT
    } else {
        StatusCode::NOT_FOUND
    }
}

/// Serves the mock on `dir/docker.sock`.
async fn mock(dir: &Path) -> (Mock, PathBuf) {
    let m: Mock = Arc::default();
    let app = Router::new()
        .route("/_ping", get(|| async { "OK" }))
        .route("/containers/json", get(list))
        .route("/containers/create", post(create))
        .route("/containers/{id}/json", get(inspect))
        .route("/containers/{id}/stop", post(stop))
        .route("/containers/{id}/start", post(start))
        .route("/containers/{id}", delete(remove))
        .route("/images/create", post(pull))
        .route("/images/{name}/json", get(image_json))
        .route("/images/{name}", delete(rm_image))
        .route("/volumes/{name}", delete(rm_volume))
        .with_state(m.clone());
    let sock = dir.join("docker.sock");
    let listener = tokio::net::UnixListener::bind(&sock).unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (m, sock)
}

fn backend(sock: &Path) -> DockerBackend {
    DockerBackend::new(DockerConfig {
        socket: sock.to_path_buf(),
        ..DockerConfig::default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_is_stopped_and_removed_and_its_image_only_when_unused() {
    let t = tempfile::tempdir().unwrap();
    let (m, sock) = mock(t.path()).await;
    {
        let mut d = m.lock().unwrap();
        d.containers.insert("a1".into(), "img:1".into());
        d.containers.insert("b1".into(), "img:1".into());
        d.images.insert("img:1".into());
    }
    let docker = backend(&sock);
    docker.ping().await.unwrap();
    docker.remove_container("a1").await.unwrap();
    let calls = std::mem::take(&mut m.lock().unwrap().calls);
    assert_eq!(
        calls,
        vec![
            "GET /containers/a1/json",
            "POST /containers/a1/stop",
            "DELETE /containers/a1",
            "v=false",
            "GET /containers/json"
        ],
        "b1 still uses img:1, so it is kept"
    );
    assert!(m.lock().unwrap().images.contains("img:1"));
    docker.remove_container("b1").await.unwrap();
    let calls = std::mem::take(&mut m.lock().unwrap().calls);
    assert_eq!(calls.last().unwrap(), "DELETE /images/img%3A1", "{calls:?}");
    assert!(m.lock().unwrap().images.is_empty() && m.lock().unwrap().containers.is_empty());
    // Gone already: one inspect, nothing else.
    docker.remove_container("b1").await.unwrap();
    assert_eq!(m.lock().unwrap().calls, vec!["GET /containers/b1/json"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_go_with_their_container_when_asked_and_alone_by_name() {
    let t = tempfile::tempdir().unwrap();
    let (m, sock) = mock(t.path()).await;
    m.lock()
        .unwrap()
        .containers
        .insert("v1".into(), "x:1".into());
    m.lock().unwrap().volumes.insert("data".into());
    let docker = DockerBackend::new(DockerConfig {
        socket: sock,
        remove_volumes: true,
        remove_images: false,
        ..DockerConfig::default()
    });
    docker.remove_container("v1").await.unwrap();
    docker.remove_volume("data").await.unwrap();
    let calls = m.lock().unwrap().calls.clone();
    assert!(calls.contains(&"v=true".to_string()), "{calls:?}");
    assert!(
        !calls.iter().any(|c| c.starts_with("GET /containers/json")),
        "images kept: no listing"
    );
    assert_eq!(calls.last().unwrap(), "DELETE /volumes/data");
    assert!(m.lock().unwrap().volumes.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_docker_environment_is_pulled_created_started_and_reclaimed_with_its_program() {
    let t = tempfile::tempdir().unwrap();
    let (m, sock) = mock(t.path()).await;
    let tools = Tools::new(ToolsConfig {
        docker: DockerConfig {
            socket: sock,
            ..DockerConfig::default()
        },
        ..ToolsConfig::default()
    })
    .unwrap();
    let spec = |image: &str| EnvironmentSpec {
        local: None,
        docker: Some(DockerSetup {
            image: image.into(),
            cmd: Some(vec!["sleep".into(), "60".into()]),
            timeout_s: Some(10.0),
        }),
    };
    let s = tools.environments.start("p", spec("busybox:1.36")).unwrap();
    assert_eq!((s.state, s.kind), (EnvState::Pending, "docker"));
    let s = tools
        .environments
        .wait("p", Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(s.state, EnvState::Ready, "{s:?}");
    let id = s.container.clone().unwrap();
    let calls = m.lock().unwrap().calls.clone();
    assert_eq!(
        calls,
        vec![
            "GET /images/busybox%3A1.36/json",
            "POST /images/create",
            "POST /containers/create",
            &format!("POST /containers/{id}/start")
        ]
    );
    let r = tools.registry.program("p").unwrap();
    assert_eq!(
        (r.resources[0].kind, r.resources[0].id.as_str()),
        ("docker", id.as_str())
    );
    tools.program_ended("p", "final");
    assert!(tools.registry.wait_idle(Duration::from_secs(10)).await);
    {
        let d = m.lock().unwrap();
        assert!(
            d.containers.is_empty() && d.images.is_empty(),
            "container and its unused image removed"
        );
    }
    // A failed pull is reported with the daemon's message.
    tools.environments.start("q", spec("missing/img")).unwrap();
    let s = tools
        .environments
        .wait("q", Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(s.state, EnvState::Failed);
    assert!(s.error.unwrap().contains("manifest unknown"));
}

#[tokio::test]
async fn a_missing_socket_is_a_clear_error() {
    let docker = backend(Path::new("/nonexistent/docker.sock"));
    let e = docker.remove_container("abc").await.unwrap_err();
    assert!(matches!(e, ToolError::DockerUnavailable { .. }), "{e}");
    assert!(e.to_string().contains("/nonexistent/docker.sock"), "{e}");
    assert!(e.is_retryable() && !e.is_client_error());
}

/// Against a real daemon when one answers on the default socket: create a
/// container from an image already present (nothing is pulled), declare it,
/// end the program, and check the daemon no longer knows it. Images are
/// kept (never delete a real machine's images in a test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_daemon_when_reachable() {
    let sock = PathBuf::from(
        std::env::var("DOCKER_SOCKET").unwrap_or_else(|_| "/var/run/docker.sock".into()),
    );
    let probe = backend(&sock);
    if let Err(e) = probe.ping().await {
        eprintln!("SKIPPED real_daemon_when_reachable: no Docker daemon ({e})");
        return;
    }
    let out = std::process::Command::new("docker")
        .args(["images", "--format", "{{.Repository}}:{{.Tag}}"])
        .output();
    let image = out
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| {
            s.lines()
                .find(|l| !l.contains("<none>"))
                .map(str::to_string)
        });
    let Some(image) = image else {
        eprintln!("SKIPPED real_daemon_when_reachable: the daemon has no local image to create a container from");
        return;
    };
    let tools = Tools::new(ToolsConfig {
        docker: DockerConfig {
            socket: sock.clone(),
            remove_images: false,
            ..DockerConfig::default()
        },
        reclaim: ReclaimConfig::default(),
        ..ToolsConfig::default()
    })
    .unwrap();
    let spec = EnvironmentSpec {
        local: None,
        docker: Some(DockerSetup {
            image,
            cmd: None,
            timeout_s: Some(60.0),
        }),
    };
    tools.environments.start("real", spec).unwrap();
    let s = tools
        .environments
        .wait("real", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(s.state, EnvState::Ready, "{s:?}");
    let id = s.container.unwrap();
    tools.declare("real", &ToolResources::default()).unwrap();
    tools.program_ended("real", "released");
    assert!(tools.registry.wait_idle(Duration::from_secs(60)).await);
    let r = tools.registry.program("real").unwrap();
    assert_eq!(r.resources[0].state, ResourceState::Reclaimed);
    let gone = std::process::Command::new("docker")
        .args(["inspect", &id])
        .output()
        .unwrap();
    assert!(!gone.status.success(), "container {id} still exists");
}
