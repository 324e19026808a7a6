//! The gateway's Prometheus metrics (`GET /metrics`): one process-wide registry and its families.
//!
//! Labels never carry organization, user or key ids: only operation names from the registry,
//! HTTP statuses, enclave methods and outcomes — a bounded set, and nothing about who did what.

use std::sync::OnceLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `submit/<name>` or `query/<name>` for the registry's operations, else a fixed name.
    pub operation: String,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabel {
    pub operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActivityLabels {
    pub activity_type: String,
    pub status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EnclaveLabels {
    /// The gRPC method, e.g. `SignRawPayloads`.
    pub method: String,
    /// `ok`, `error` (the enclave answered with a gRPC error) or `unavailable` (no answer).
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabel {
    pub method: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EnclaveEndpointLabel {
    /// The enclave's socket, as configured (a bounded set).
    pub enclave: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// `delivered`, `retry` or `failed`.
    pub outcome: &'static str,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Seconds, 100 µs to about 26 s.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 19))
}

pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub request_seconds: Histograms<OperationLabel>,
    pub activities: Family<ActivityLabels, Counter>,
    pub enclave_calls: Family<EnclaveLabels, Counter>,
    pub enclave_seconds: Histograms<MethodLabel>,
    pub enclave_unreachable: Family<EnclaveEndpointLabel, Counter>,
    pub commit_seconds: Histogram,
    pub commit_batch: Histogram,
    pub webhook_held: Gauge,
    pub webhook_attempts: Family<OutcomeLabel, Counter>,
    pub policy_wait_seconds: Histogram,
    pub policy_evaluation_seconds: Histogram,
    pub policy_shed: Counter,
}

impl Metrics {
    fn new() -> Self {
        let (requests, request_seconds) = (Family::default(), Family::new_with_constructor(latency as fn() -> _));
        let (activities, enclave_calls) = (Family::default(), Family::default());
        let enclave_seconds = Family::new_with_constructor(latency as fn() -> _);
        let enclave_unreachable = Family::default();
        let (commit_seconds, commit_batch) = (latency(), Histogram::new(exponential_buckets(1.0, 2.0, 10)));
        let (webhook_held, webhook_attempts) = (Gauge::default(), Family::default());
        let (policy_wait_seconds, policy_evaluation_seconds) = (latency(), latency());
        let policy_shed = Counter::default();
        let mut registry = Registry::with_prefix("coffer");
        registry.register("http_requests", "HTTP requests by operation and status", requests.clone());
        registry.register("http_request_seconds", "HTTP request latency by operation", request_seconds.clone());
        registry.register("activities", "Activities recorded, by type and status", activities.clone());
        registry.register("enclave_calls", "Calls to the enclave by method and outcome", enclave_calls.clone());
        registry.register("enclave_call_seconds", "Enclave call latency by method", enclave_seconds.clone());
        registry.register(
            "enclave_unreachable",
            "Calls an enclave did not answer (sent to the next one when there are several), by enclave",
            enclave_unreachable.clone(),
        );
        registry.register("store_commit_seconds", "Store commit latency (one transaction)", commit_seconds.clone());
        registry.register("store_commit_batch_size", "Activities per store commit", commit_batch.clone());
        registry.register(
            "webhook_deliveries_held",
            "Webhook deliveries the worker holds (waiting or in flight)",
            webhook_held.clone(),
        );
        registry.register("webhook_attempts", "Webhook delivery attempts by outcome", webhook_attempts.clone());
        registry.register(
            "policy_evaluation_wait_seconds",
            "Wait for a slot of the policy evaluations asked of the enclave",
            policy_wait_seconds.clone(),
        );
        registry.register(
            "policy_evaluation_seconds",
            "Policy evaluations asked of the enclave (dry runs, decisions ahead of a handler)",
            policy_evaluation_seconds.clone(),
        );
        registry.register(
            "policy_evaluations_shed",
            "Requests answered 503 because no policy evaluation slot came within the wait",
            policy_shed.clone(),
        );
        Metrics {
            registry,
            requests,
            request_seconds,
            activities,
            enclave_calls,
            enclave_seconds,
            enclave_unreachable,
            commit_seconds,
            commit_batch,
            webhook_held,
            webhook_attempts,
            policy_wait_seconds,
            policy_evaluation_seconds,
            policy_shed,
        }
    }

    /// The Prometheus text exposition of every family (OpenMetrics 1.0).
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The process's metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

/// Counts one HTTP request and its latency.
pub fn observe_request(operation: String, status: u16, took: Duration) {
    let m = metrics();
    m.request_seconds.get_or_create(&OperationLabel { operation: operation.clone() }).observe(took.as_secs_f64());
    m.requests.get_or_create(&RequestLabels { operation, status }).inc();
}

/// Counts one recorded activity (or a status change of one).
pub fn observe_activity(activity_type: &str, status: &str) {
    metrics()
        .activities
        .get_or_create(&ActivityLabels { activity_type: activity_type.to_string(), status: status.to_string() })
        .inc();
}

/// Counts one enclave call and its latency.
pub fn observe_enclave_call(method: &str, outcome: &'static str, took: Duration) {
    let m = metrics();
    m.enclave_seconds.get_or_create(&MethodLabel { method: method.to_string() }).observe(took.as_secs_f64());
    m.enclave_calls.get_or_create(&EnclaveLabels { method: method.to_string(), outcome }).inc();
}

/// An enclave did not answer a call.
pub fn observe_enclave_unreachable(enclave: &str) {
    metrics().enclave_unreachable.get_or_create(&EnclaveEndpointLabel { enclave: enclave.to_string() }).inc();
}

/// The wait of a request for a policy evaluation slot.
pub fn observe_policy_evaluation_wait(took: Duration) {
    metrics().policy_wait_seconds.observe(took.as_secs_f64());
}

/// One policy evaluation on the pool.
pub fn observe_policy_evaluation(took: Duration) {
    metrics().policy_evaluation_seconds.observe(took.as_secs_f64());
}

/// A request shed for want of a policy evaluation slot.
pub fn observe_policy_evaluation_shed() {
    metrics().policy_shed.inc();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_render_with_their_labels_and_values() {
        let m = Metrics::new();
        m.requests.get_or_create(&RequestLabels { operation: "submit/create_policy".into(), status: 200 }).inc_by(3);
        m.commit_batch.observe(4.0);
        m.webhook_held.set(7);
        let text = m.render();
        assert!(
            text.contains(r#"coffer_http_requests_total{operation="submit/create_policy",status="200"} 3"#),
            "{text}"
        );
        assert!(text.contains("coffer_store_commit_batch_size_count 1"), "{text}");
        assert!(text.contains("coffer_webhook_deliveries_held 7"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
