//! `GET /metrics`: the service's counters and the state of its jobs, books and tick-by-tick
//! engine as Prometheus text, then the families a layer around the service adds
//! ([`crate::app::Extension::metrics`]).

use crate::app::App;
use crate::metrics::{Column, Exposition};

/// Depth jobs, published books and the tick-by-tick engine, for `/metrics`.
fn book_metrics(app: &App, e: &mut Exposition) {
    let depth = app.depth_jobs_snapshot();
    e.single(
        "millrace_depth_ondemand_jobs",
        "gauge",
        "On-demand depth jobs running.",
        depth.capacity.ondemand_jobs,
    );
    e.single(
        "millrace_depth_refusals_total",
        "counter",
        "Depth subscriptions refused for capacity.",
        depth.capacity.refusals,
    );
    e.single(
        "millrace_depth_preemptions_total",
        "counter",
        "Subscribed depth jobs stopped at full capacity to give a client address its fair share.",
        depth.capacity.preemptions,
    );
    let per_job: [Column<shared::protocol::ops::JobReport>; 4] = [
        (
            "millrace_depth_job_connected",
            "gauge",
            "1 while the depth job's stream is connected.",
            |j| j.connected as u64,
        ),
        ("millrace_depth_job_crashes_total", "counter", "Upstream failures per depth job.", |j| {
            j.crashes
        }),
        ("millrace_depth_job_messages_total", "counter", "Upstream messages per depth job.", |j| {
            j.messages
        }),
        ("millrace_depth_job_subscribers", "gauge", "Live subscriptions per depth job.", |j| {
            j.subscribers as u64
        }),
    ];
    let rows: Vec<_> = depth.jobs.iter().map(|d| d.job.clone()).collect();
    e.table(&per_job, &rows, |j| vec![("instrument", j.instrument.to_string())]);
    let books = app.books().list();
    let per_book: [Column<shared::protocol::ops::BookInfo>; 7] = [
        (
            "millrace_book_publishing",
            "gauge",
            "1 while the book is published (synced or snapshot mode).",
            |b| b.status.health.is_publishable() as u64,
        ),
        (
            "millrace_book_gaps_total",
            "counter",
            "Upstream sequence / update-id gaps per book.",
            |b| b.status.gaps,
        ),
        ("millrace_book_resyncs_total", "counter", "Rebuilds from a snapshot per book.", |b| {
            b.status.resyncs
        }),
        (
            "millrace_book_drift_total",
            "counter",
            "Verifications that found the book different from a snapshot.",
            |b| b.status.drift,
        ),
        ("millrace_book_deltas_total", "counter", "depth_update deltas published per book.", |b| {
            b.deltas
        }),
        (
            "millrace_book_crossed_skipped_total",
            "counter",
            "Publishes skipped because the book was crossed.",
            |b| b.crossed_skipped,
        ),
        ("millrace_book_update_id", "gauge", "Last published update id per book.", |b| b.id),
    ];
    e.table(&per_book, &books, |b| {
        vec![("instrument", b.instrument.to_string()), ("source", b.source.clone())]
    });
    // A remote host's as last reported (none before it first answers).
    let Some(l3) = app.l3().engine() else { return };
    e.single(
        "millrace_l3_auto_balance",
        "gauge",
        "1 while automatic shard balancing is on.",
        l3.auto_balance as u64,
    );
    e.single(
        "millrace_l3_migrations_completed_total",
        "counter",
        "Symbol migrations completed.",
        l3.migrations.completed,
    );
    e.single(
        "millrace_l3_migrations_rejected_total",
        "counter",
        "Symbol migrations refused.",
        l3.migrations.rejected,
    );
    e.single(
        "millrace_l3_balancer_decisions_total",
        "counter",
        "Migrations asked for by the automatic policy.",
        l3.balancer_decisions,
    );
    let per_shard: [Column<shared::protocol::ops::ShardStats>; 5] = [
        ("millrace_l3_shard_pending", "gauge", "Events queued or held per shard.", |s| s.pending),
        ("millrace_l3_shard_processed_total", "counter", "Events processed per shard.", |s| {
            s.processed
        }),
        (
            "millrace_l3_shard_processed_per_second",
            "gauge",
            "Events processed per second per shard.",
            |s| s.processed_per_s,
        ),
        ("millrace_l3_shard_lag_ms", "gauge", "Age of the batch a shard is processing.", |s| {
            s.lag_ms
        }),
        ("millrace_l3_shard_symbols", "gauge", "Symbols per shard.", |s| s.symbols as u64),
    ];
    e.table(&per_shard, &l3.shards, |s| vec![("shard", s.id.to_string())]);
    let per_symbol: [Column<shared::protocol::ops::SymbolStats>; 4] = [
        ("millrace_l3_symbol_pending", "gauge", "Events pending per tick-by-tick book.", |s| {
            s.pending
        }),
        ("millrace_l3_symbol_shard", "gauge", "The shard a tick-by-tick book lives on.", |s| {
            s.shard as u64
        }),
        ("millrace_l3_symbol_gaps_total", "counter", "Sequence gaps per tick-by-tick book.", |s| {
            s.gaps
        }),
        (
            "millrace_l3_symbol_lag_ms",
            "gauge",
            "Dispatch-to-done time of the book's last batch.",
            |s| s.lag_ms,
        ),
    ];
    e.table(&per_symbol, &l3.symbols, |s| vec![("instrument", s.instrument.to_string())]);
}

/// `GET /metrics`: the service's families, then what a layer around it adds.
pub async fn render(app: &App) -> String {
    let mut e = Exposition::new();
    app.metrics().render(&mut e);
    e.single(
        "millrace_store_reads_refused_total",
        "counter",
        "REST reads refused (503) after waiting too long for a store read connection.",
        app.store().admission().map_or(0, |a| a.refused()),
    );
    let rec = app.recording().report();
    for (name, help, v) in [
        (
            "millrace_recording_recorded_total",
            "Upstream frames written to the recording.",
            rec.recorded,
        ),
        (
            "millrace_recording_dropped_queue_full_total",
            "Frames left out of the recording because its queue was full (the live path has them).",
            rec.dropped_queue_full,
        ),
        (
            "millrace_recording_dropped_write_failed_total",
            "Frames left out of the recording because their write failed (disk full or gone).",
            rec.dropped_write_failed,
        ),
        (
            "millrace_recording_write_errors_total",
            "Failed writes of the recorder.",
            rec.write_errors,
        ),
        ("millrace_recording_bytes_written_total", "Bytes the recorder wrote.", rec.bytes_written),
        (
            "millrace_recording_files_deleted_total",
            "Recording files deleted for the budget or the retention.",
            rec.files_deleted,
        ),
    ] {
        e.single(name, "counter", help, v);
    }
    let snap = app.supervisor().snapshot();
    e.single(
        "millrace_ingest_ondemand_jobs",
        "gauge",
        "On-demand ingest jobs running.",
        snap.capacity.ondemand_jobs,
    );
    e.single(
        "millrace_ingest_pinned_jobs",
        "gauge",
        "Pinned ingest jobs running.",
        snap.capacity.pinned_jobs,
    );
    e.single(
        "millrace_ingest_ondemand_max_jobs",
        "gauge",
        "Capacity for on-demand jobs (0 = unlimited).",
        snap.capacity.ondemand_max_jobs,
    );
    e.single(
        "millrace_ingest_evictions_total",
        "counter",
        "Idle on-demand jobs evicted for capacity.",
        snap.capacity.evictions,
    );
    e.single(
        "millrace_ingest_refusals_total",
        "counter",
        "Subscriptions refused for capacity.",
        snap.capacity.refusals,
    );
    e.single(
        "millrace_ingest_preemptions_total",
        "counter",
        "Subscribed on-demand jobs stopped at full capacity to give a client address its fair share.",
        snap.capacity.preemptions,
    );
    e.single(
        "millrace_ingest_reaped_total",
        "counter",
        "Idle on-demand jobs stopped by the reaper.",
        snap.capacity.reaped,
    );
    let per_job: [Column<shared::protocol::ops::JobReport>; 10] = [
        ("millrace_job_crashes_total", "counter", "Upstream failures per job.", |j| j.crashes),
        (
            "millrace_job_connected",
            "gauge",
            "1 while the job's upstream stream is connected.",
            |j| j.connected as u64,
        ),
        ("millrace_job_messages_total", "counter", "Upstream messages per job.", |j| j.messages),
        (
            "millrace_job_malformed_total",
            "counter",
            "Malformed or unexpected upstream messages per job.",
            |j| j.malformed,
        ),
        (
            "millrace_job_closed_candles_total",
            "counter",
            "Closed 1m candles accepted per job.",
            |j| j.closed_candles,
        ),
        (
            "millrace_job_gap_filled_candles_total",
            "counter",
            "Closed 1m candles fetched over REST to fill gaps.",
            |j| j.gap_filled_candles,
        ),
        (
            "millrace_job_persist_failures_total",
            "counter",
            "Failed persists (retried) per job.",
            |j| j.persist_failures,
        ),
        ("millrace_job_subscribers", "gauge", "Live subscriptions per job.", |j| {
            j.subscribers as u64
        }),
        ("millrace_job_pinned", "gauge", "1 for pinned jobs.", |j| j.pinned as u64),
        (
            "millrace_job_exchange_behind_ms",
            "gauge",
            "How far the exchange's clock is behind the newest stored candle (0: not behind).",
            |j| j.exchange_behind_ms.map_or(0, |ms| ms.max(0) as u64),
        ),
    ];
    e.table(&per_job, &snap.jobs, |j| vec![("instrument", j.instrument.to_string())]);
    let tasks = app.backfill().snapshot();
    e.family("millrace_backfill_progress", "gauge", "Share of the retention window covered (0-1).");
    for t in &tasks {
        e.sample("millrace_backfill_progress", &[("series", &t.series.to_string())], t.progress);
    }
    e.family(
        "millrace_backfill_candles_written",
        "gauge",
        "Candles written by the current or last run.",
    );
    for t in &tasks {
        e.sample(
            "millrace_backfill_candles_written",
            &[("series", &t.series.to_string())],
            t.candles_written,
        );
    }
    e.family("millrace_backfill_running", "gauge", "1 while a run is active.");
    for t in &tasks {
        e.sample(
            "millrace_backfill_running",
            &[("series", &t.series.to_string())],
            u64::from(t.running),
        );
    }
    book_metrics(app, &mut e);
    e.family("millrace_source_ready", "gauge", "1 when the source's symbols are loaded.");
    for s in app.sources().snapshot(false) {
        e.sample("millrace_source_ready", &[("source", &s.name)], u64::from(s.ready));
    }
    let mut text = e.finish();
    if let Some(x) = app.extension() {
        text.push_str(&x.metrics().await);
    }
    text
}
