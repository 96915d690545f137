//! Process-wide counters for `GET /metrics` (Prometheus text format 0.0.4).
//!
//! Counters live in one [`Metrics`] value shared by the HTTP layer, the pipelines and backfill;
//! per-job and per-task figures are read from their snapshots when `/metrics` is rendered, so
//! nothing is counted twice.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

/// Counters of the browser API.
#[derive(Debug, Default)]
pub struct Metrics {
    pub ws_connections: AtomicI64,
    pub ws_connections_total: AtomicU64,
    /// WebSocket upgrades refused because of their `Origin` header.
    pub ws_refused_origin: AtomicU64,
    /// WebSockets closed with 1002, 1007 or 1009 for a client's protocol violation.
    pub ws_protocol_violations: AtomicU64,
    /// Open TCP connections (HTTP, and WebSockets after their upgrade).
    pub connections: AtomicI64,
    pub connections_total: AtomicU64,
    /// Connections closed at accept: over `limits.max_connections_per_ip` ...
    pub connections_refused_per_ip: AtomicU64,
    /// ... or over `limits.max_connections`.
    pub connections_refused_global: AtomicU64,
    /// Connections closed because a request head took longer than
    /// `limits.header_read_timeout_ms` ...
    pub connections_header_timeouts: AtomicU64,
    /// ... or because they sat idle between requests longer than `limits.idle_timeout_ms`.
    pub connections_idle_timeouts: AtomicU64,
    /// `accept` failures (e.g. the open-file limit).
    pub accept_errors: AtomicU64,
    pub ws_messages_sent: AtomicU64,
    pub ws_requests: AtomicU64,
    pub ws_request_errors: AtomicU64,
    pub ws_dropped_lagging: AtomicU64,
    pub ws_dropped_slow_send: AtomicU64,
    /// WebSockets closed for not answering a ping within `limits.ws_pong_timeout_ms` ...
    pub ws_closed_pong_timeout: AtomicU64,
    /// ... or for holding no subscription for `limits.ws_idle_timeout_ms`.
    pub ws_closed_idle: AtomicU64,
    pub subscriptions: AtomicI64,
    pub subscriptions_refused_capacity: AtomicU64,
    /// Subscriptions refused because they would start a job too soon (the server-wide job-start rate).
    pub subscriptions_refused_rate: AtomicU64,
    /// Subscribe requests refused: they would start more jobs than the connection or its IP
    /// may start now.
    pub subscriptions_refused_job_starts: AtomicU64,
    pub http_klines_requests: AtomicU64,
    pub http_bad_requests: AtomicU64,
    /// HTTP requests refused (421) because their `Host` is not in `server.allowed_hosts`.
    pub http_refused_host: AtomicU64,
    pub admin_unauthorized: AtomicU64,
    /// Admin requests refused (429) because their address used up its failed attempts.
    pub admin_throttled: AtomicU64,
    /// Request bodies refused: over their size limit (413) ...
    pub http_body_too_large: AtomicU64,
    /// ... or not whole within `limits.body_timeout_ms` (408).
    pub http_body_timeouts: AtomicU64,
}

/// Builds the text exposition.
pub struct Exposition {
    out: String,
}

impl Default for Exposition {
    fn default() -> Self {
        Self::new()
    }
}

/// A metric family over rows of `T`: name, kind, help and the value of a row.
pub type Column<T> = (&'static str, &'static str, &'static str, fn(&T) -> u64);

impl Exposition {
    pub fn new() -> Self {
        Self { out: String::with_capacity(8 * 1024) }
    }

    /// One metric family with one unlabelled sample.
    pub fn single(&mut self, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
    }

    /// Family header for labelled samples that follow.
    pub fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// A labelled sample; label values are escaped.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let v = v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
                let _ = write!(self.out, "{k}=\"{v}\"");
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }

    /// One family per column definition `(name, kind, help, value)`, each with one sample per
    /// row, labelled by `labels(row)`.
    pub fn table<T>(
        &mut self,
        columns: &[Column<T>],
        rows: &[T],
        labels: impl Fn(&T) -> Vec<(&'static str, String)>,
    ) {
        let labels: Vec<Vec<(&'static str, String)>> = rows.iter().map(labels).collect();
        for (name, kind, help, value) in columns {
            self.family(name, kind, help);
            for (row, l) in rows.iter().zip(&labels) {
                let l: Vec<(&str, &str)> = l.iter().map(|(k, v)| (*k, v.as_str())).collect();
                self.sample(name, &l, value(row));
            }
        }
    }

    pub fn finish(self) -> String {
        self.out
    }
}

impl Metrics {
    /// Renders the API counters.
    pub fn render(&self, e: &mut Exposition) {
        let c = |a: &AtomicU64| a.load(Relaxed);
        e.single(
            "millrace_ws_connections",
            "gauge",
            "Open WebSocket connections.",
            self.ws_connections.load(Relaxed),
        );
        e.single(
            "millrace_ws_connections_total",
            "counter",
            "WebSocket connections accepted.",
            c(&self.ws_connections_total),
        );
        e.single(
            "millrace_ws_refused_origin_total",
            "counter",
            "WebSocket upgrades refused (403) because their Origin is not allowed.",
            c(&self.ws_refused_origin),
        );
        e.single(
            "millrace_ws_protocol_violations_total",
            "counter",
            "WebSockets closed with 1002, 1007 or 1009 for a client's protocol violation.",
            c(&self.ws_protocol_violations),
        );
        e.single(
            "millrace_connections",
            "gauge",
            "Open TCP connections (HTTP, and WebSockets after their upgrade).",
            self.connections.load(Relaxed),
        );
        e.single(
            "millrace_connections_total",
            "counter",
            "TCP connections accepted and served.",
            c(&self.connections_total),
        );
        e.family(
            "millrace_connections_refused_total",
            "counter",
            "TCP connections closed at accept: over the per-IP or the global connection cap.",
        );
        e.sample(
            "millrace_connections_refused_total",
            &[("reason", "per_ip")],
            c(&self.connections_refused_per_ip),
        );
        e.sample(
            "millrace_connections_refused_total",
            &[("reason", "global")],
            c(&self.connections_refused_global),
        );
        e.family(
            "millrace_connections_timed_out_total",
            "counter",
            "Connections closed while waiting for a request: its head too slow, or idle too long.",
        );
        e.sample(
            "millrace_connections_timed_out_total",
            &[("phase", "header")],
            c(&self.connections_header_timeouts),
        );
        e.sample(
            "millrace_connections_timed_out_total",
            &[("phase", "idle")],
            c(&self.connections_idle_timeouts),
        );
        e.single(
            "millrace_accept_errors_total",
            "counter",
            "Failed accepts (e.g. the open-file limit reached).",
            c(&self.accept_errors),
        );
        e.single(
            "millrace_ws_messages_sent_total",
            "counter",
            "Push frames sent to WebSocket clients.",
            c(&self.ws_messages_sent),
        );
        e.single(
            "millrace_ws_requests_total",
            "counter",
            "Requests received on WebSockets.",
            c(&self.ws_requests),
        );
        e.single(
            "millrace_ws_request_errors_total",
            "counter",
            "Requests answered with an error.",
            c(&self.ws_request_errors),
        );
        e.single(
            "millrace_ws_dropped_lagging_total",
            "counter",
            "Clients dropped because they fell behind the bus.",
            c(&self.ws_dropped_lagging),
        );
        e.single(
            "millrace_ws_dropped_slow_send_total",
            "counter",
            "Clients dropped because a send timed out.",
            c(&self.ws_dropped_slow_send),
        );
        e.family(
            "millrace_ws_closed_total",
            "counter",
            "WebSockets the server closed: no pong in time (pong_timeout), or no subscription for too long (idle).",
        );
        e.sample(
            "millrace_ws_closed_total",
            &[("reason", "pong_timeout")],
            c(&self.ws_closed_pong_timeout),
        );
        e.sample("millrace_ws_closed_total", &[("reason", "idle")], c(&self.ws_closed_idle));
        e.single(
            "millrace_subscriptions",
            "gauge",
            "Live stream subscriptions.",
            self.subscriptions.load(Relaxed),
        );
        e.single(
            "millrace_subscriptions_refused_capacity_total",
            "counter",
            "Subscriptions refused: no ingest capacity (or the address's share of it).",
            c(&self.subscriptions_refused_capacity),
        );
        e.single(
            "millrace_subscriptions_refused_rate_total",
            "counter",
            "Subscriptions refused: the server-wide job-start rate (ingest.max_job_starts_per_min).",
            c(&self.subscriptions_refused_rate),
        );
        e.single(
            "millrace_subscriptions_refused_job_starts_total",
            "counter",
            "Subscribe requests refused: more job starts than the connection or its IP may make now.",
            c(&self.subscriptions_refused_job_starts),
        );
        e.single(
            "millrace_http_klines_requests_total",
            "counter",
            "GET /api/v1/klines requests.",
            c(&self.http_klines_requests),
        );
        e.single(
            "millrace_http_bad_requests_total",
            "counter",
            "HTTP requests rejected as malformed.",
            c(&self.http_bad_requests),
        );
        e.single(
            "millrace_http_refused_host_total",
            "counter",
            "HTTP requests refused (421): their Host is not in server.allowed_hosts.",
            c(&self.http_refused_host),
        );
        e.single(
            "millrace_admin_unauthorized_total",
            "counter",
            "Admin requests without a valid token.",
            c(&self.admin_unauthorized),
        );
        e.single(
            "millrace_admin_throttled_total",
            "counter",
            "Admin requests refused (429): their address used up its failed attempts.",
            c(&self.admin_throttled),
        );
        e.family(
            "millrace_http_bodies_refused_total",
            "counter",
            "Request bodies refused: over their size limit (413) or too slow (408).",
        );
        e.sample(
            "millrace_http_bodies_refused_total",
            &[("reason", "too_large")],
            c(&self.http_body_too_large),
        );
        e.sample(
            "millrace_http_bodies_refused_total",
            &[("reason", "timeout")],
            c(&self.http_body_timeouts),
        );
    }
}
