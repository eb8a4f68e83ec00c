//! OpenTelemetry traces (`[telemetry]`): spans exported over OTLP/HTTP, W3C trace context
//! taken from incoming requests and sent on with webhook deliveries and upstream calls.
//!
//! Off unless `otlp_endpoint` is set, and then nothing here costs more than one relaxed
//! atomic load per request ([`on`]): no span is made, no header read. On, the spans are
//! `tracing` spans of the target [`TARGET`] at `TRACE` level, which the binary's OTLP
//! layer takes (and its log output, at its default `info`, ignores):
//!
//! - `a2a.request` — each request on every dialect and binding, its parent the caller's
//!   `traceparent`/`tracestate`; the method, agent and task once known, and the outcome;
//! - `a2a.task` — one task from submit to its final state, a child of the request that
//!   submitted it; the later requests about the task (get, cancel, subscribe) link to it;
//! - `a2a.store.commit` — a task's write from the append to durability;
//! - `a2a.webhook.delivery` — each delivery attempt, a child of its task, its request
//!   carrying the trace (`traceparent`);
//! - `a2a.agent.run` — the backend's run, whose upstream calls (the `openai` backend) carry
//!   the trace.
//!
//! Attribute names follow the draft A2A semantic conventions (`a2a.*`) where they exist.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;

use dashmap::DashMap;
use hyper::HeaderMap;
use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::config::TelemetryConfig;

/// The log filter of `spec` (`RUST_LOG`'s syntax: `"info"`, `"a2ad=debug,info"`, ...).
///
/// ractor wraps every actor in two spans at `INFO` ("Actor", its id formatted), entered
/// and left at each poll: at the default `info`, a task actor's spans cost more than its
/// own work on an echo turn (+5.6k instructions a request). They say nothing a2ad's own
/// lines do not (each names its task), so ractor is capped at `warn` unless `spec` names
/// ractor itself; a `spec` whose level for other targets is `warn` or quieter is kept as
/// it is (ractor then stays as quiet as the rest).
///
/// # Errors
/// When `spec` is not a filter.
pub fn log_filter(
    spec: &str,
) -> Result<tracing_subscriber::EnvFilter, tracing_subscriber::filter::ParseError> {
    use tracing_subscriber::filter::LevelFilter;
    let filter = tracing_subscriber::EnvFilter::builder().parse(spec)?;
    // The level of the targets no directive names (the last such directive wins).
    let rest = spec
        .split(',')
        .filter_map(|d| d.trim().parse::<LevelFilter>().ok())
        .next_back();
    match rest {
        Some(level) if level > LevelFilter::WARN && !names_ractor(spec) => {
            Ok(filter.add_directive("ractor=warn".parse()?))
        }
        _ => Ok(filter),
    }
}

/// Whether a directive of `spec` is for ractor's own targets (`ractor`, `ractor::actor`,
/// `ractor[span]`, each with or without `=level`); a crate whose name merely contains
/// "ractor" is not ractor.
fn names_ractor(spec: &str) -> bool {
    spec.split(',').any(|d| {
        let target = d.trim().split(['=', '[']).next().unwrap_or_default();
        target == "ractor" || target.starts_with("ractor::")
    })
}

/// The target of every span exported.
pub const TARGET: &str = "a2ad::otel";

static ON: AtomicBool = AtomicBool::new(false);

/// Whether traces are exported (a [`Telemetry`] was started).
#[inline]
pub fn on() -> bool {
    ON.load(Relaxed)
}

/// The exporter of a process: make the layer with [`Telemetry::layer`], install it, and call
/// [`Telemetry::shutdown`] before exiting so the last spans are sent.
pub struct Telemetry {
    provider: opentelemetry_sdk::trace::SdkTracerProvider,
}

impl Telemetry {
    /// Starts the exporter of `[telemetry]`; `None` when no endpoint is configured.
    ///
    /// # Errors
    /// When the exporter cannot be built.
    pub fn start(config: &TelemetryConfig) -> Result<Option<Self>, String> {
        use opentelemetry_otlp::WithExportConfig as _;
        let Some(endpoint) = &config.otlp_endpoint else {
            return Ok(None);
        };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
            .with_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| e.to_string())?;
        let sampler = opentelemetry_sdk::trace::Sampler::ParentBased(Box::new(
            opentelemetry_sdk::trace::Sampler::TraceIdRatioBased(config.sampling_ratio),
        ));
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_sampler(sampler)
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name(config.service_name.clone())
                    .build(),
            )
            .build();
        opentelemetry::global::set_text_map_propagator(
            opentelemetry_sdk::propagation::TraceContextPropagator::new(),
        );
        ON.store(true, Relaxed);
        Ok(Some(Self { provider }))
    }

    /// The `tracing` layer that exports the spans of [`TARGET`].
    pub fn layer<S>(&self) -> impl tracing_subscriber::Layer<S> + use<S>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        use tracing_subscriber::Layer as _;
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("a2ad"))
            .with_filter(
                tracing_subscriber::filter::Targets::new()
                    .with_target(TARGET, tracing::Level::TRACE),
            )
    }

    /// Sends what is left and stops.
    pub fn shutdown(self) {
        ON.store(false, Relaxed);
        let _ = self.provider.force_flush();
        let _ = self.provider.shutdown();
    }

    /// [`Telemetry::shutdown`] on a thread of its own, waited for at most `wait`: whether
    /// it finished. A collector that accepts and never answers would otherwise hold the
    /// caller for the exporter's whole time-out (10 s); past `wait` the thread is left
    /// behind (it ends with the process).
    pub fn shutdown_within(self, wait: Duration) -> bool {
        ON.store(false, Relaxed);
        let (done, finished) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("a2ad-otel-stop".into())
            .spawn(move || {
                self.shutdown();
                let _ = done.send(());
            });
        spawned.is_ok() && finished.recv_timeout(wait).is_ok()
    }
}

struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .map(hyper::header::HeaderName::as_str)
            .collect()
    }
}

struct HeaderInjector<'a>(&'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            hyper::header::HeaderName::from_bytes(key.as_bytes()),
            hyper::header::HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

/// The span of one request, its parent the caller's trace context (`traceparent`).
pub(crate) fn request_span(headers: &HeaderMap, path: &str) -> tracing::Span {
    let span = tracing::trace_span!(
        target: TARGET,
        "a2a.request",
        otel.kind = "server",
        url.path = path,
        rpc.system = tracing::field::Empty,
        rpc.method = tracing::field::Empty,
        rpc.response.status_code = tracing::field::Empty,
        a2a.protocol.dialect = tracing::field::Empty,
        a2a.agent.id = tracing::field::Empty,
        a2a.task.id = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    let parent =
        opentelemetry::global::get_text_map_propagator(|p| p.extract(&HeaderExtractor(headers)));
    if parent.span().span_context().is_valid() {
        let _ = span.set_parent(parent);
    }
    span
}

/// A span's trace id (32 hex digits), when it belongs to a trace: what JSON logs show as
/// the request's `trace_id`.
pub(crate) fn trace_id(span: &tracing::Span) -> Option<String> {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| sc.trace_id().to_string())
}

/// Marks the current request's span (a request refused before any operation ran: no key,
/// an agent not allowed or unknown, a wrong method or content type, a body too large) as
/// an error with its code, as [`request_span`]'s operations are marked when they fail.
pub(crate) fn refused(code: i64) {
    if on() {
        let span = tracing::Span::current();
        span.record("rpc.response.status_code", code.to_string());
        span.record("otel.status_code", "ERROR");
    }
}

/// Puts the current span's trace context on an outgoing request (`traceparent`,
/// `tracestate`).
pub(crate) fn inject_current(headers: &mut HeaderMap) {
    inject(&tracing::Span::current(), headers);
}

/// Puts a span's trace context on an outgoing request.
pub(crate) fn inject(span: &tracing::Span, headers: &mut HeaderMap) {
    let cx = span.context();
    if cx.span().span_context().is_valid() {
        opentelemetry::global::get_text_map_propagator(|p| {
            p.inject_context(&cx, &mut HeaderInjector(headers));
        });
    }
}

/// The trace context of each task's span, by task key, for what happens after the task's
/// actor is gone (webhook deliveries of its last events). Process-wide, like the exporter
/// and the subscriber. Bounded: past [`MAX_TASKS`] entries it starts over (a delivery
/// then starts a trace of its own).
static TASKS: std::sync::LazyLock<DashMap<String, opentelemetry::Context>> =
    std::sync::LazyLock::new(DashMap::new);

const MAX_TASKS: usize = 100_000;

/// The key a task's trace is kept under.
pub(crate) fn task_key(key: &crate::model::TaskKey) -> String {
    format!("{}\u{1}{}\u{1}{}", key.principal, key.agent, key.task)
}

/// A new task's span: a child of the current span (the request that submitted it).
pub(crate) fn task_span(key: &crate::model::TaskKey, context: &str) -> tracing::Span {
    let span = tracing::trace_span!(
        target: TARGET,
        "a2a.task",
        a2a.agent.id = key.agent.as_str(),
        a2a.task.id = key.task.as_str(),
        a2a.context.id = context,
        a2a.task.state = tracing::field::Empty,
    );
    if TASKS.len() >= MAX_TASKS {
        TASKS.clear();
    }
    TASKS.insert(task_key(key), span.context());
    span
}

/// The trace context of a task's span, if it is known.
pub(crate) fn task_trace(key: &crate::model::TaskKey) -> Option<opentelemetry::Context> {
    TASKS.get(&task_key(key)).map(|c| c.clone())
}

/// Links the current span (a request about a task) to the task's span, when known.
pub(crate) fn link_current_to_task(key: &crate::model::TaskKey) {
    if let Some(cx) = task_trace(key) {
        tracing::Span::current().add_link(cx.span().span_context().clone());
    }
}

/// A span whose parent is a task's trace context (or none: a trace of its own).
pub(crate) fn child_of(
    parent: Option<opentelemetry::Context>,
    span: tracing::Span,
) -> tracing::Span {
    if let Some(parent) = parent {
        let _ = span.set_parent(parent);
    }
    span
}

#[cfg(test)]
mod tests {
    use super::log_filter;
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;

    /// One at a time: `tracing` keeps each callsite's interest for every subscriber in the
    /// process, and another test's subscriber, made meanwhile, would change it.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// Whether a span of `target` at `INFO` is made under the filter of `spec`, as the
    /// binary wires its log output.
    fn info_span_made(spec: &str, target: &'static str) -> bool {
        let _one = ONE_AT_A_TIME
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let logs = tracing_subscriber::fmt::layer()
            .with_writer(std::io::sink)
            .with_filter(log_filter(spec).expect("a filter"));
        let subscriber = tracing_subscriber::registry().with(logs);
        tracing::subscriber::with_default(subscriber, || match target {
            "ractor::actor" => !tracing::info_span!(target: "ractor::actor", "Actor").is_disabled(),
            _ => !tracing::info_span!(target: "a2ad::http", "request").is_disabled(),
        })
    }

    #[test]
    fn ractors_spans_are_left_out_at_the_default_level() {
        assert!(!info_span_made("info", "ractor::actor"));
        assert!(!info_span_made("a2ad=debug,debug", "ractor::actor"));
        // a2ad's own spans and events at that level stay.
        assert!(info_span_made("info", "a2ad::http"));
    }

    #[test]
    fn a_filter_that_names_ractor_is_kept_as_written() {
        assert!(info_span_made("info,ractor=info", "ractor::actor"));
        assert!(info_span_made("ractor=trace", "ractor::actor"));
        assert!(info_span_made("info,ractor::actor=info", "ractor::actor"));
        // Another crate whose name contains "ractor" does not lift the cap.
        assert!(!info_span_made("info,myractor=debug", "ractor::actor"));
    }

    #[test]
    fn a_quieter_filter_is_not_made_louder_for_ractor() {
        // At `error`, ractor's warnings stay out as everything else's do.
        let filter = log_filter("error").expect("a filter");
        assert_eq!(filter.to_string(), "error");
        assert!(!info_span_made("error", "ractor::actor"));
        assert!(log_filter("not a = filter [").is_err());
    }
}
