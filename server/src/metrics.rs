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
    pub ws_refused_per_ip: AtomicU64,
    pub ws_messages_sent: AtomicU64,
    pub ws_requests: AtomicU64,
    pub ws_request_errors: AtomicU64,
    pub ws_dropped_lagging: AtomicU64,
    pub ws_dropped_slow_send: AtomicU64,
    pub subscriptions: AtomicI64,
    pub subscriptions_refused_capacity: AtomicU64,
    /// Subscriptions refused because they would start a job too soon (job-start rates).
    pub subscriptions_refused_rate: AtomicU64,
    pub http_klines_requests: AtomicU64,
    pub http_bad_requests: AtomicU64,
    pub admin_unauthorized: AtomicU64,
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
            "millrace_ws_refused_per_ip_total",
            "counter",
            "WebSocket connections refused by the per-IP limit.",
            c(&self.ws_refused_per_ip),
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
            "Subscriptions refused: too many job starts (per address or in all).",
            c(&self.subscriptions_refused_rate),
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
            "millrace_admin_unauthorized_total",
            "counter",
            "Admin requests without a valid token.",
            c(&self.admin_unauthorized),
        );
    }
}
