//! Metrics: the Prometheus recorder, every metric's HELP text and unit, the
//! histograms' buckets, and `mpush_build_info`. `CATALOG` is the one list
//! of names (a test checks that the sources use no other, and the Grafana
//! dashboard in docs/ops/ is built from it).

use std::sync::OnceLock;

use metrics::Unit;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

use Kind::{Counter, Gauge, Histogram};

/// (name, kind, unit, help)
pub const CATALOG: &[(&str, Kind, Unit, &str)] = &[
    (
        "mpush_build_info",
        Gauge,
        Unit::Count,
        "Always 1; the labels name the version and the Rust it was built with",
    ),
    (
        "mpush_connections",
        Gauge,
        Unit::Count,
        "Open client connections (bound or not), updated every second",
    ),
    (
        "mpush_bound_connections",
        Gauge,
        Unit::Count,
        "Connections bound to a user on this node, updated every second",
    ),
    (
        "mpush_trace_queue_depth",
        Gauge,
        Unit::Count,
        "Trace events waiting for the trace writer (Redis; the memory store takes each in place), updated every second",
    ),
    (
        "mpush_inbox_messages",
        Gauge,
        Unit::Count,
        "Offline messages held in the embedded store (not reported on Redis), updated every second",
    ),
    (
        "mpush_connections_total",
        Counter,
        Unit::Count,
        "Client connections accepted",
    ),
    (
        "mpush_connections_refused_total",
        Counter,
        Unit::Count,
        "Client connections refused, by reason (max_connections, per_ip, rate)",
    ),
    (
        "mpush_accept_errors_total",
        Counter,
        Unit::Count,
        "accept() failures (e.g. out of file descriptors)",
    ),
    (
        "mpush_handshakes_total",
        Counter,
        Unit::Count,
        "Completed handshakes, by kind (full, fast)",
    ),
    (
        "mpush_handshakes_refused_total",
        Counter,
        Unit::Count,
        "Handshakes refused (RSA queue full: busy; given up while queued, by its deadline or its client: expired)",
    ),
    (
        "mpush_handshake_duration_seconds",
        Histogram,
        Unit::Seconds,
        "From accept to a completed handshake, by kind (full, fast)",
    ),
    (
        "mpush_tls_handshakes_total",
        Counter,
        Unit::Count,
        "TLS handshakes completed on the client listeners and the HTTPS API, by kind (full, resumed: a session ticket spared the certificate signature)",
    ),
    (
        "mpush_tls_suites_total",
        Counter,
        Unit::Count,
        "TLS handshakes completed on the client listeners and the HTTPS API, by the cipher suite negotiated (AES-128-GCM unless the client puts ChaCha20 first)",
    ),
    (
        "mpush_tls_handshake_errors_total",
        Counter,
        Unit::Count,
        "TLS handshakes that failed or timed out, on the client listeners and the HTTPS API",
    ),
    (
        "mpush_tls_reloads_total",
        Counter,
        Unit::Count,
        "TLS certificate reloads",
    ),
    (
        "mpush_tls_reload_errors_total",
        Counter,
        Unit::Count,
        "TLS certificate reloads that failed (the certificate in use stays)",
    ),
    (
        "mpush_protocol_errors_total",
        Counter,
        Unit::Count,
        "Connections closed for a protocol error",
    ),
    (
        "mpush_bind_refused_total",
        Counter,
        Unit::Count,
        "Binds refused by bind authentication",
    ),
    (
        "mpush_bindings_restored_total",
        Counter,
        Unit::Count,
        "Bindings restored by a fast connect (ADR 0008), by outcome: bound, failed (the client binds itself)",
    ),
    (
        "mpush_binding_store_errors_total",
        Counter,
        Unit::Count,
        "Kept bindings the session store did not write, by op: keep, clear",
    ),
    (
        "mpush_kicks_total",
        Counter,
        Unit::Count,
        "Kicks sent to connections",
    ),
    (
        "mpush_resume_replays_total",
        Counter,
        Unit::Count,
        "Fast connects refused as replays of a used ticket",
    ),
    (
        "mpush_pushes_total",
        Counter,
        Unit::Count,
        "Pushes handed to a connection or another node",
    ),
    (
        "mpush_push_write_delay_seconds",
        Histogram,
        Unit::Seconds,
        "From the server accepting a push (API, forward, inbox replay) to its write on the socket",
    ),
    (
        "mpush_push_ack_seconds",
        Histogram,
        Unit::Seconds,
        "From the server accepting a push to the client's ACK",
    ),
    (
        "mpush_acks_total",
        Counter,
        Unit::Count,
        "ACKs received, by mode",
    ),
    (
        "mpush_push_retries_total",
        Counter,
        Unit::Count,
        "Pushes sent again for want of an ACK",
    ),
    (
        "mpush_slow_consumer_total",
        Counter,
        Unit::Count,
        "Pushes not queued: the connection's command queue was full",
    ),
    (
        "mpush_slow_consumer_closed_total",
        Counter,
        Unit::Count,
        "Connections closed because a write took longer than limits.write_timeout_ms",
    ),
    (
        "mpush_broadcast_deliveries_total",
        Counter,
        Unit::Count,
        "Broadcast copies handed to connections",
    ),
    (
        "mpush_node_port_silent_total",
        Counter,
        Unit::Count,
        "Connections to the node port, counted when they arrive (before they say anything)",
    ),
    (
        "mpush_node_port_evicted_total",
        Counter,
        Unit::Count,
        "Node-port connections closed while silent to make room for new ones (a full queue: strangers holding sockets)",
    ),
    (
        "mpush_redis_reasserts_total",
        Counter,
        Unit::Count,
        "Times this node put its registration and routes back into Redis at once (Redis came back, or lost its data)",
    ),
    (
        "mpush_kept_delivered_total",
        Counter,
        Unit::Count,
        "Messages kept in an inbox for a user connected here, handed over when another node announced them (or found when Redis came back)",
    ),
    (
        "mpush_idempotent_replays_total",
        Counter,
        Unit::Count,
        "Requests answered with the answer kept for their Idempotency-Key (or traceId): nothing sent again",
    ),
    (
        "mpush_idempotency_settled_late_total",
        Counter,
        Unit::Count,
        "Idempotency keys the store took only on a later try (it was unreachable when the request ended)",
    ),
    (
        "mpush_idempotency_unsettled_total",
        Counter,
        Unit::Count,
        "Idempotency keys the store never took within their claim's life: a retry after that is sent again",
    ),
    (
        "mpush_idempotency_evicted_total",
        Counter,
        Unit::Count,
        "Idempotency keys the embedded store forgot before their window ended (over delivery.idempotency_max_keys or _bytes)",
    ),
    (
        "mpush_broadcast_condition_evaluations_total",
        Counter,
        Unit::Count,
        "Broadcast conditions evaluated, one per connection that passed the other filters",
    ),
    (
        "mpush_broadcast_condition_errors_total",
        Counter,
        Unit::Count,
        "Condition evaluations without a result (not selected), by kind: type (a method of a missing field, as in mpush), work or memory (over the per-connection budget)",
    ),
    (
        "mpush_flow_control_waits_total",
        Counter,
        Unit::Count,
        "Times a push or broadcast waited for the rate limit",
    ),
    (
        "mpush_inbox_full_total",
        Counter,
        Unit::Count,
        "Offline messages refused: the user's inbox was full",
    ),
    (
        "mpush_forwards_total",
        Counter,
        Unit::Count,
        "Pushes forwarded to another node and taken there",
    ),
    (
        "mpush_forward_errors_total",
        Counter,
        Unit::Count,
        "Forwards to another node that failed",
    ),
    (
        "mpush_node_auth_refused_total",
        Counter,
        Unit::Count,
        "Node-to-node connections that failed the secret's challenge",
    ),
    (
        "mpush_cluster_malformed_total",
        Counter,
        Unit::Count,
        "Malformed cluster messages ignored",
    ),
    (
        "mpush_redis_errors_total",
        Counter,
        Unit::Count,
        "Redis failures seen by a store, by store",
    ),
    (
        "mpush_redis_command_duration_seconds",
        Histogram,
        Unit::Seconds,
        "Redis round trips, by command (PIPELINE for pipelines)",
    ),
    (
        "mpush_redis_command_errors_total",
        Counter,
        Unit::Count,
        "Redis commands that failed, by command",
    ),
    (
        "mpush_sessions_evicted_total",
        Counter,
        Unit::Count,
        "Resumable sessions forgotten for the memory bounds",
    ),
    (
        "mpush_sessions_unsealable_total",
        Counter,
        Unit::Count,
        "Stored sessions that could not be unsealed (a changed key)",
    ),
    (
        "mpush_traces_evicted_total",
        Counter,
        Unit::Count,
        "Traces forgotten for the memory bounds",
    ),
    (
        "mpush_traces_untraced_total",
        Counter,
        Unit::Count,
        "Pushes sent without a trace record (the trace store was down)",
    ),
    (
        "mpush_trace_events_dropped_total",
        Counter,
        Unit::Count,
        "Trace events dropped: the trace writer's queue was full (Redis, past the backpressure's deadline; the memory store takes each in place)",
    ),
    (
        "mpush_route_cache_hits_total",
        Counter,
        Unit::Count,
        "Route lookups of delivery answered by the node's client-side route cache (cluster mode)",
    ),
    (
        "mpush_route_cache_misses_total",
        Counter,
        Unit::Count,
        "Route lookups of delivery read from Redis (not in the route cache)",
    ),
    (
        "mpush_route_cache_invalidations_total",
        Counter,
        Unit::Count,
        "Cached routes dropped: Redis reported a change of the user's routes, or the cache was full",
    ),
    (
        "mpush_trace_backpressure_waits_total",
        Counter,
        Unit::Count,
        "Pushes that waited for the trace writer's queue to drain below half",
    ),
    (
        "mpush_trace_backpressure_timeouts_total",
        Counter,
        Unit::Count,
        "Pushes that went on after waiting the trace store's deadline for room",
    ),
    (
        "mpush_sink_backpressure_waits_total",
        Counter,
        Unit::Count,
        "Pushes with callbacks that waited for a callback queue to drain below half",
    ),
    (
        "mpush_sink_backpressure_timeouts_total",
        Counter,
        Unit::Count,
        "Pushes with callbacks that went on after waiting sinks.accept_timeout_ms for room",
    ),
    (
        "mpush_trace_events_lost_total",
        Counter,
        Unit::Count,
        "Trace events the trace store did not take",
    ),
    (
        "mpush_api_refused_total",
        Counter,
        Unit::Count,
        "API requests refused (authentication, Host or Origin checks)",
    ),
    (
        "mpush_http_connections_refused_total",
        Counter,
        Unit::Count,
        "HTTP connections refused over limits.http_max_connections",
    ),
    (
        "mpush_http_idle_closed_total",
        Counter,
        Unit::Count,
        "Kept-alive HTTP connections closed when idle",
    ),
    (
        "mpush_http_proxy_requests_total",
        Counter,
        Unit::Count,
        "HTTP_PROXY requests by outcome: forwarded, unmapped, bad_request, too_large, response_too_large, timeout, backend_error, conn_limit, user_limit, busy",
    ),
    (
        "mpush_api_request_duration_seconds",
        Histogram,
        Unit::Seconds,
        "Time the HTTP API took from a request's headers to its answer, by route (push, push_batch, broadcast, topic_push, trace, user, kick, subscribe, compat, metrics, other)",
    ),
    (
        "mpush_http_proxy_duration_seconds",
        Histogram,
        Unit::Seconds,
        "Time from an HTTP_PROXY request to its answer (the backend's, or the proxy's refusal)",
    ),
    (
        "mpush_up_pushes_total",
        Counter,
        Unit::Count,
        "Up-pushes received from clients",
    ),
    (
        "mpush_up_pushes_accepted_total",
        Counter,
        Unit::Count,
        "Up-pushes accepted by every sink",
    ),
    (
        "mpush_up_pushes_refused_total",
        Counter,
        Unit::Count,
        "Up-pushes refused, by reason (conn_rate, user_rate, sink)",
    ),
    (
        "mpush_up_push_abuse_closed_total",
        Counter,
        Unit::Count,
        "Connections closed for up-pushes over the rate limit",
    ),
    (
        "mpush_sink_queue_depth",
        Gauge,
        Unit::Count,
        "Events waiting in a sink (queued or in a batch being sent), by sink, updated every second",
    ),
    (
        "mpush_sink_events_delivered_total",
        Counter,
        Unit::Count,
        "Events a sink handed on, by sink",
    ),
    (
        "mpush_sink_retries_total",
        Counter,
        Unit::Count,
        "Failed deliveries retried, by sink",
    ),
    (
        "mpush_sink_refused_total",
        Counter,
        Unit::Count,
        "Up-pushes a sink refused (full, or not accepted in time), by sink",
    ),
    (
        "mpush_sink_events_dropped_total",
        Counter,
        Unit::Count,
        "Lifecycle and callback events dropped: the sink's queue was full, by sink and kind",
    ),
    (
        "mpush_callbacks_total",
        Counter,
        Unit::Count,
        "Delivery callbacks produced",
    ),
    (
        "mpush_callback_watch_refused_total",
        Counter,
        Unit::Count,
        "Pushes with callbacks refused: too many watched",
    ),
];

/// The label values each labelled metric is registered with at start, so
/// that every series the dashboard and the docs name exists (at zero) on a
/// fresh node: `rate(x) > 0` can then tell "none" from "missing". Metrics
/// whose label values are open (a Redis command, a sink's name) start as one
/// unlabelled zero series; the labelled ones appear beside it on first use
/// (sums are unchanged).
pub const LABELS: &[(&str, &str, &[&str])] = &[
    (
        "mpush_api_request_duration_seconds",
        "route",
        &[
            "push",
            "push_batch",
            "broadcast",
            "topic_push",
            "trace",
            "user",
            "kick",
            "subscribe",
            "compat",
            "metrics",
            "other",
        ],
    ),
    (
        "mpush_connections_refused_total",
        "reason",
        &["max_connections", "per_ip", "rate"],
    ),
    ("mpush_handshakes_total", "kind", &["full", "fast"]),
    ("mpush_tls_handshakes_total", "kind", &["full", "resumed"]),
    (
        "mpush_handshakes_refused_total",
        "reason",
        &["busy", "expired"],
    ),
    (
        "mpush_handshake_duration_seconds",
        "kind",
        &["full", "fast"],
    ),
    ("mpush_api_refused_total", "reason", &["host", "origin"]),
    (
        "mpush_broadcast_condition_errors_total",
        "kind",
        &["type", "work", "memory"],
    ),
    (
        "mpush_redis_errors_total",
        "store",
        &["routes", "sessions", "inbox", "traces", "idempotency"],
    ),
    (
        "mpush_up_pushes_refused_total",
        "reason",
        &["conn_rate", "user_rate", "sink"],
    ),
    (
        "mpush_http_proxy_requests_total",
        "outcome",
        &[
            "forwarded",
            "backend_error",
            "bad_request",
            "busy",
            "response_too_large",
            "timeout",
            "too_large",
            "unmapped",
            "user_limit",
            "conn_limit",
        ],
    ),
];

/// Registers every catalogued series at zero (see `LABELS`). Gauges that a
/// sampler keeps are set by it within a second; they start at 0 here.
fn zero_series() {
    for (name, kind, ..) in CATALOG {
        if *name == "mpush_build_info" {
            continue;
        }
        let labelled = LABELS.iter().find(|(n, ..)| n == name);
        let sets: Vec<Vec<(&'static str, &'static str)>> = match labelled {
            Some((_, key, values)) => values.iter().map(|v| vec![(*key, *v)]).collect(),
            None => vec![Vec::new()],
        };
        for labels in sets {
            let labels: Vec<metrics::Label> = labels
                .into_iter()
                .map(|(k, v)| metrics::Label::new(k, v))
                .collect();
            match kind {
                Counter => metrics::counter!(*name, labels).increment(0),
                Gauge => metrics::gauge!(*name, labels).set(0.0),
                // Registered: rendered with empty buckets until a sample.
                Histogram => drop(metrics::histogram!(*name, labels)),
            }
        }
    }
}

/// Seconds: from 100 µs to 30 s.
const BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
];

/// The process's Prometheus recorder, installed once (tests start many
/// servers in one process).
pub fn handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)
                .expect("valid buckets")
                .build_recorder();
            let handle = recorder.handle();
            // Fails only if another recorder is installed; then ours just renders nothing.
            if metrics::set_global_recorder(recorder).is_ok() {
                describe();
                zero_series();
                // Histogram samples wait in a buffer until folded into their
                // buckets: fold them every few seconds, scraped or not, so a
                // node nobody scrapes does not hold every sample.
                let upkeep = handle.clone();
                let _ = std::thread::Builder::new()
                    .name("metrics-upkeep".into())
                    .spawn(move || {
                        loop {
                            std::thread::sleep(std::time::Duration::from_millis(250));
                            upkeep.run_upkeep();
                        }
                    });
            }
            handle
        })
        .clone()
}

fn describe() {
    for (name, kind, unit, help) in CATALOG {
        match kind {
            Counter => metrics::describe_counter!(*name, *unit, *help),
            Gauge => metrics::describe_gauge!(*name, *unit, *help),
            Histogram => metrics::describe_histogram!(*name, *unit, *help),
        }
    }
    metrics::gauge!(
        "mpush_build_info",
        "version" => env!("CARGO_PKG_VERSION"),
        "rust" => option_env!("CARGO_PKG_RUST_VERSION").unwrap_or(""),
    )
    .set(1.0);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every metric the sources record is in the catalog, once, and the
    /// catalog names nothing the sources do not record.
    #[test]
    fn the_catalog_is_every_metric_and_only_those() {
        fn sources(dir: &std::path::Path, out: &mut String) {
            for e in std::fs::read_dir(dir).expect("dir").flatten() {
                let p = e.path();
                if p.is_dir() {
                    sources(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") && !p.ends_with("telemetry.rs") {
                    out.push_str(&std::fs::read_to_string(&p).expect("read"));
                }
            }
        }
        let mut text = String::new();
        sources(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut text,
        );
        let mut used = std::collections::BTreeSet::new();
        for (i, _) in text.match_indices("\"mpush_") {
            let rest = &text[i + 1..];
            let end = rest.find('"').unwrap_or(0);
            let name = &rest[..end];
            if name.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                used.insert(name.to_owned());
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for (name, ..) in CATALOG {
            assert!(names.insert(name.to_string()), "{name} twice");
        }
        let missing: Vec<_> = used.difference(&names).collect();
        assert!(missing.is_empty(), "not in the catalog: {missing:?}");
        names.remove("mpush_build_info");
        let unused: Vec<_> = names.difference(&used).collect();
        assert!(
            unused.is_empty(),
            "in the catalog, never recorded: {unused:?}"
        );
    }

    /// The Grafana dashboard asks only for metrics the server has.
    #[test]
    fn the_dashboard_uses_catalog_names() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../docs/ops/grafana-dashboard.json");
        let text = std::fs::read_to_string(&path).expect("the dashboard");
        let v: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        let mut seen = 0;
        for p in v["panels"].as_array().expect("panels") {
            for t in p["targets"].as_array().expect("targets") {
                let expr = t["expr"].as_str().expect("expr");
                for (i, _) in expr.match_indices("mpush_") {
                    let name: String = expr[i..]
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                        .collect();
                    let base = ["_bucket", "_count", "_sum"]
                        .iter()
                        .find_map(|s| name.strip_suffix(s))
                        .unwrap_or(&name);
                    assert!(
                        CATALOG.iter().any(|(n, ..)| *n == base),
                        "the dashboard asks for {name}"
                    );
                    seen += 1;
                }
            }
        }
        assert!(seen > 20, "the dashboard uses the metrics");
    }
}
