//! The Docker backend: the Docker Engine HTTP API on its unix socket.
//!
//! Reclaiming a container: inspect it (for its image), stop it, remove it
//! (with its anonymous volumes when configured), then remove its image if no
//! other container — running or not — uses it. Preparing an environment:
//! pull the image unless present, create a container labelled with the
//! program, start it. Every "already gone" answer (404, 304) counts as done.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tracing::{debug, info, warn};

use crate::backend::{Backend, BoxFuture};
use crate::error::ToolError;
use crate::resource::{check_image, check_name, Resource};

/// Longest a single API call may take (image pulls excepted).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
pub struct DockerConfig {
    pub socket: PathBuf,
    /// Seconds `docker stop` waits before killing.
    pub stop_timeout_s: u32,
    /// Remove a reclaimed container's image when no other container uses it.
    pub remove_images: bool,
    /// Remove a reclaimed container's anonymous volumes with it.
    pub remove_volumes: bool,
}

impl Default for DockerConfig {
    fn default() -> Self {
        Self {
            socket: PathBuf::from("/var/run/docker.sock"),
            stop_timeout_s: 10,
            remove_images: true,
            remove_volumes: false,
        }
    }
}

pub struct DockerBackend {
    cfg: DockerConfig,
}

impl DockerBackend {
    pub fn new(cfg: DockerConfig) -> Self {
        info!(socket = %cfg.socket.display(), remove_images = cfg.remove_images, remove_volumes = cfg.remove_volumes, "docker backend");
        Self { cfg }
    }

    pub fn socket(&self) -> &Path {
        &self.cfg.socket
    }

    /// One HTTP/1.1 exchange on a fresh connection (the daemon is local; a
    /// pool is not worth its state). Returns the status and the whole body.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), ToolError> {
        let op = format!("{method} {path}");
        let unavailable = |reason: String| ToolError::DockerUnavailable {
            socket: self.cfg.socket.display().to_string(),
            reason,
        };
        let exchange = async {
            let stream = tokio::net::UnixStream::connect(&self.cfg.socket)
                .await
                .map_err(|e| unavailable(e.to_string()))?;
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| unavailable(e.to_string()))?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    debug!(error = %e, "docker connection closed with an error");
                }
            });
            let payload = body.map(|b| b.to_string()).unwrap_or_default();
            let req = Request::builder()
                .method(method.clone())
                .uri(path)
                .header("host", "docker")
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(payload)))
                .map_err(|e| ToolError::Invalid {
                    what: "docker request",
                    reason: e.to_string(),
                })?;
            let resp = sender
                .send_request(req)
                .await
                .map_err(|e| unavailable(e.to_string()))?;
            let status = resp.status();
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| unavailable(e.to_string()))?
                .to_bytes();
            Ok::<_, ToolError>((status, bytes))
        };
        let (status, bytes) = tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| unavailable(format!("{op} timed out after {}s", timeout.as_secs())))??;
        debug!(%op, status = status.as_u16(), "docker API");
        Ok((status, bytes))
    }

    fn api_error(op: &str, status: StatusCode, body: &[u8]) -> ToolError {
        let message = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| v["message"].as_str().map(str::to_string))
            .unwrap_or_else(|| String::from_utf8_lossy(body).chars().take(300).collect());
        ToolError::Docker {
            op: op.to_string(),
            status: status.as_u16(),
            message,
        }
    }

    /// Whether the daemon answers `/_ping`.
    pub async fn ping(&self) -> Result<(), ToolError> {
        let (s, b) = self
            .call(Method::GET, "/_ping", None, Duration::from_secs(5))
            .await?;
        if s.is_success() {
            Ok(())
        } else {
            Err(Self::api_error("ping", s, &b))
        }
    }

    /// Stops and removes container `id`, then its image if unused.
    pub async fn remove_container(&self, id: &str) -> Result<(), ToolError> {
        check_name("docker container id", id)?;
        let (s, b) = self
            .call(
                Method::GET,
                &format!("/containers/{id}/json"),
                None,
                CALL_TIMEOUT,
            )
            .await?;
        if s == StatusCode::NOT_FOUND {
            info!(container = id, "container already gone");
            return Ok(());
        }
        if !s.is_success() {
            return Err(Self::api_error("inspect container", s, &b));
        }
        let image = serde_json::from_slice::<Value>(&b)
            .ok()
            .and_then(|v| v["Image"].as_str().map(str::to_string));
        let stop = format!("/containers/{id}/stop?t={}", self.cfg.stop_timeout_s);
        let wait = CALL_TIMEOUT + Duration::from_secs(u64::from(self.cfg.stop_timeout_s));
        let (s, b) = self.call(Method::POST, &stop, None, wait).await?;
        // 304: already stopped; 404: removed meanwhile.
        if !(s.is_success() || s == StatusCode::NOT_MODIFIED || s == StatusCode::NOT_FOUND) {
            return Err(Self::api_error("stop container", s, &b));
        }
        let rm = format!("/containers/{id}?force=true&v={}", self.cfg.remove_volumes);
        let (s, b) = self.call(Method::DELETE, &rm, None, CALL_TIMEOUT).await?;
        if !(s.is_success() || s == StatusCode::NOT_FOUND) {
            return Err(Self::api_error("remove container", s, &b));
        }
        info!(container = id, image = ?image, "container stopped and removed");
        if let (true, Some(image)) = (self.cfg.remove_images, image) {
            self.remove_image_if_unused(&image).await?;
        }
        Ok(())
    }

    async fn remove_image_if_unused(&self, image: &str) -> Result<(), ToolError> {
        check_image(image)?;
        let filters = json!({ "ancestor": [image] }).to_string();
        let list = format!(
            "/containers/json?all=true&filters={}",
            percent_encode(&filters)
        );
        let (s, b) = self.call(Method::GET, &list, None, CALL_TIMEOUT).await?;
        if !s.is_success() {
            return Err(Self::api_error("list containers", s, &b));
        }
        let users = serde_json::from_slice::<Value>(&b)
            .ok()
            .and_then(|v| v.as_array().map(Vec::len))
            .unwrap_or(usize::MAX);
        if users > 0 {
            debug!(image, users, "image still used: kept");
            return Ok(());
        }
        let (s, b) = self
            .call(
                Method::DELETE,
                &format!("/images/{}", percent_encode(image)),
                None,
                CALL_TIMEOUT,
            )
            .await?;
        match s {
            s if s.is_success() => {
                info!(image, "unused image removed");
                Ok(())
            }
            StatusCode::NOT_FOUND => Ok(()),
            // A container created since the listing, or a dependent image:
            // keeping the image is the safe outcome.
            StatusCode::CONFLICT => {
                debug!(image, "image in use after all: kept");
                Ok(())
            }
            s => Err(Self::api_error("remove image", s, &b)),
        }
    }

    pub async fn remove_volume(&self, name: &str) -> Result<(), ToolError> {
        check_name("volume name", name)?;
        let (s, b) = self
            .call(
                Method::DELETE,
                &format!("/volumes/{name}"),
                None,
                CALL_TIMEOUT,
            )
            .await?;
        if s.is_success() || s == StatusCode::NOT_FOUND {
            info!(volume = name, "volume removed");
            Ok(())
        } else {
            Err(Self::api_error("remove volume", s, &b))
        }
    }

    /// Pulls `image` unless present, creates a container of it labelled with
    /// `program`, starts it; returns the container id. `timeout` bounds the
    /// pull.
    pub async fn create_environment(
        &self,
        program: &str,
        image: &str,
        cmd: Option<&[String]>,
        timeout: Duration,
    ) -> Result<String, ToolError> {
        check_image(image)?;
        let enc = percent_encode(image);
        let (s, _) = self
            .call(
                Method::GET,
                &format!("/images/{enc}/json"),
                None,
                CALL_TIMEOUT,
            )
            .await?;
        if s == StatusCode::NOT_FOUND {
            // Without a tag the API pulls every tag of the repository.
            let (name, tag) = split_tag(image);
            let pull = format!(
                "/images/create?fromImage={}&tag={}",
                percent_encode(name),
                percent_encode(tag)
            );
            info!(image, "pulling image");
            let (s, b) = self.call(Method::POST, &pull, None, timeout).await?;
            if !s.is_success() {
                return Err(Self::api_error("pull image", s, &b));
            }
            // The pull streams JSON progress lines; a failure arrives as a
            // line with "error" under a 200.
            for line in b.split(|&c| c == b'\n') {
                if let Ok(v) = serde_json::from_slice::<Value>(line) {
                    if let Some(e) = v["error"].as_str() {
                        return Err(ToolError::Docker {
                            op: "pull image".into(),
                            status: 200,
                            message: e.to_string(),
                        });
                    }
                }
            }
        }
        let mut spec = json!({ "Image": image, "Labels": { "agentd.program": program } });
        if let Some(cmd) = cmd {
            spec["Cmd"] = json!(cmd);
        }
        let (s, b) = self
            .call(Method::POST, "/containers/create", Some(spec), CALL_TIMEOUT)
            .await?;
        if !s.is_success() {
            return Err(Self::api_error("create container", s, &b));
        }
        let id = serde_json::from_slice::<Value>(&b)
            .ok()
            .and_then(|v| v["Id"].as_str().map(str::to_string))
            .ok_or_else(|| Self::api_error("create container (no Id)", s, &b))?;
        check_name("docker container id", &id)?;
        let (s, b) = self
            .call(
                Method::POST,
                &format!("/containers/{id}/start"),
                None,
                CALL_TIMEOUT,
            )
            .await?;
        if !(s.is_success() || s == StatusCode::NOT_MODIFIED) {
            // Created but not started: still the caller's to reclaim.
            warn!(container = %id, status = s.as_u16(), "container created but did not start");
            return Err(Self::api_error("start container", s, &b));
        }
        info!(container = %id, image, program, "environment container started");
        Ok(id)
    }
}

/// `name[:tag]` → (name, tag or "latest"); a `:` inside a registry host
/// (before the last `/`) is not a tag, and a digest is kept whole.
fn split_tag(image: &str) -> (&str, &str) {
    if image.contains('@') {
        return (image, "");
    }
    let slash = image.rfind('/').map_or(0, |i| i + 1);
    match image[slash..].rfind(':') {
        Some(i) => (&image[..slash + i], &image[slash + i + 1..]),
        None => (image, "latest"),
    }
}

/// Percent-encodes everything but unreserved characters (RFC 3986).
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Backend for DockerBackend {
    fn name(&self) -> &'static str {
        "docker"
    }

    fn handles(&self, r: &Resource) -> bool {
        matches!(r, Resource::DockerContainer(_) | Resource::DockerVolume(_))
    }

    /// Declaring never contacts the daemon (it may be down now and up at
    /// reclaim time); names were checked when parsed.
    fn admit(&self, r: Resource) -> Result<Resource, ToolError> {
        match &r {
            Resource::DockerContainer(n) => check_name("docker container id", n)?,
            Resource::DockerVolume(n) => check_name("volume name", n)?,
            other => return Err(ToolError::NoBackend(other.to_string())),
        }
        Ok(r)
    }

    fn reclaim<'a>(&'a self, r: &'a Resource) -> BoxFuture<'a, Result<(), ToolError>> {
        Box::pin(async move {
            match r {
                Resource::DockerContainer(id) => self.remove_container(id).await,
                Resource::DockerVolume(v) => self.remove_volume(v).await,
                other => Err(ToolError::NoBackend(other.to_string())),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_and_encoding() {
        assert_eq!(split_tag("busybox"), ("busybox", "latest"));
        assert_eq!(split_tag("busybox:1.36"), ("busybox", "1.36"));
        assert_eq!(split_tag("reg:5000/a/b"), ("reg:5000/a/b", "latest"));
        assert_eq!(split_tag("reg:5000/a/b:v2"), ("reg:5000/a/b", "v2"));
        assert_eq!(
            percent_encode(r#"{"a":["x/y"]}"#),
            "%7B%22a%22%3A%5B%22x%2Fy%22%5D%7D"
        );
    }
}
