//! Logging to stderr, and with `serve --otlp-traces-endpoint URL` (vLLM's
//! flag) the engine's request and step spans (`agentd::trace`, see
//! `agentd_engine`'s `trace` module) exported over OTLP.
//!
//! The exporter speaks OTLP over HTTP with protobuf bodies
//! (`opentelemetry-otlp`'s `http-proto`, a blocking client on the batch
//! processor's own thread), not gRPC: gRPC would bring tonic and its
//! stack into the build for the same spans. The URL is used as given, as
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is (a collector's is
//! `http://HOST:4318/v1/traces`); vLLM's gRPC default
//! (`grpc://HOST:4317`) is refused with that advice.

use anyhow::{bail, Context as _, Result};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing::Level;
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// The installed subscriber's exporter, flushed when dropped.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            if let Err(e) = p.shutdown() {
                eprintln!("warning: OTLP trace export did not flush: {e}");
            }
        }
    }
}

/// Installs the global subscriber: the log (`RUST_LOG`, default `info`)
/// and, given `otlp_traces`, the exporter of the request and step spans.
pub fn init(otlp_traces: Option<&str>) -> Result<Telemetry> {
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(log_filter(std::env::var("RUST_LOG").ok()));
    let provider = otlp_traces.map(provider).transpose()?;
    let export = provider.as_ref().map(|p| {
        let spans = Targets::new().with_target(agentd_engine::TRACE_TARGET, Level::INFO);
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("agentd"))
            .with_filter(spans)
    });
    tracing_subscriber::registry().with(log).with(export).init();
    if let Some(url) = otlp_traces {
        tracing::info!(
            endpoint = url,
            "exporting request and step spans over OTLP (http/protobuf)"
        );
    }
    Ok(Telemetry { provider })
}

/// `RUST_LOG` (default `info`), without the request and step spans unless
/// it names their target: their events would add lines per request to
/// every `info` log.
fn log_filter(rust_log: Option<String>) -> EnvFilter {
    let mut directives = rust_log.unwrap_or_else(|| "info".into());
    if !directives.contains(agentd_engine::TRACE_TARGET) {
        directives.push_str(",agentd::trace=off");
    }
    EnvFilter::try_new(&directives).unwrap_or_else(|_| EnvFilter::new("info,agentd::trace=off"))
}

fn provider(url: &str) -> Result<SdkTracerProvider> {
    // The HTTP client is built without TLS (a collector is usually a
    // sidecar on loopback; TLS would add its crates to every build).
    if !url.starts_with("http://") {
        bail!(
            "not supported: --otlp-traces-endpoint {url} (OTLP over plain HTTP only: give the \
             collector's http://HOST:4318/v1/traces)"
        );
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(url)
        .build()
        .with_context(|| format!("OTLP exporter for {url}"))?;
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name("agentd").build())
        .build())
}

#[cfg(test)]
mod tests {
    use super::log_filter;

    #[test]
    fn the_log_leaves_out_request_spans_unless_rust_log_names_them() {
        assert!(log_filter(None).to_string().contains("agentd::trace=off"));
        let debug = log_filter(Some("debug".into())).to_string();
        assert!(
            debug.contains("debug") && debug.contains("agentd::trace=off"),
            "{debug}"
        );
        let named = log_filter(Some("info,agentd::trace=info".into())).to_string();
        assert!(!named.contains("agentd::trace=off"), "{named}");
        // A malformed RUST_LOG falls back to the default, not a panic.
        assert!(log_filter(Some("=[".into()))
            .to_string()
            .contains("agentd::trace=off"));
    }
}
