//! Forged messages on a running cluster's bus (the bus is a trust boundary: docs/hardening.md).
//!
//! A cluster runs on the machine's NATS and PostgreSQL (the simulator at speed 60 and the
//! gateway in this process; a supervisor and two workers as processes of the real binary, one
//! of them hosting the tick-by-tick books). Once candles are stored and a gateway book is in
//! sync, a client with no more than NATS access publishes every forged message of issue 28 —
//! the out-of-memory batch (minutes 0 and ~2^53 ms), a batch ten years ahead, a minute that has
//! not ended, series of no configured source or of a symbol no source lists, bytes that are no
//! message, an admin request to the tick-by-tick host without (or with a wrong) proof, demands
//! of a malformed gateway and of foreign instruments, statuses out of bounds, instruction sets
//! of epoch `u64::MAX` and for another worker, depth diffs with `Millrace-U` at `u64::MAX`
//! (headers that lie, and a body that says it), a closed kline push ten years ahead, a
//! closed candle pushed where workers publish, and relayed trades that are no push, of another
//! instrument, ten years ahead or with an id far past the last one kept — and then checks that:
//! - no process exited;
//! - no row was written: no candle of BTC outside the exchange's minutes, no foreign series;
//! - live charts and books keep moving: closed candles keep arriving on a browser's socket and
//!   keep being stored, the gateway's book still equals the exchange's at the same update id
//!   with no gap, no resync and an unbroken chain of published deltas, the workers still hold
//!   their tasks, and the gateway keeps real trades (none of the forged, no id gap);
//! - each was counted, by kind: the gateway's `millrace_bus_poison_total`, the leader's and the
//!   workers' refusals in its report (`GET /api/v1/ops/cluster`, `millrace_cluster_refused_total`);
//! - the refused JetStream messages were terminated: nothing is left pending for the persister.

use std::time::Duration;

use bytes::Bytes;
use shared::candle::{Candle, MINUTE_MS};
use shared::cluster::payload::ClosedCandles;
use shared::cluster::TaskKind;
use shared::fixed::{Price, Volume};
use shared::protocol::{InstrumentId, Push, PushData, SeriesId, ServerFrame};
use testkit::*;

use super::cluster_workers::{fully_assigned, nats_url, report, stored_pg, TestCluster};

const BTC: &str = "sim:spot:BTC/USDT";
const TOKEN: &str = SIM_CONTROL_TOKEN;

fn minute(t: i64) -> Candle {
    Candle::one_minute(t, Price(100), Price(105), Price(95), Price(101), Volume(7), 3)
}

/// Publishes `candles` of `series` on the candle stream, as a worker would (a unique id).
async fn forge_candles(
    js: &async_nats::jetstream::Context,
    subjects: &server::cluster::Subjects,
    series: &str,
    candles: Vec<Candle>,
    tag: &str,
) {
    let series: SeriesId = series.parse().unwrap();
    let msg = ClosedCandles { series: series.clone(), candles };
    let body = Bytes::from(serde_json::to_vec(&msg).unwrap());
    forge_js(js, subjects.candles(&series), body, &[("Nats-Msg-Id", &format!("forged|{tag}"))])
        .await;
}

/// Publishes on JetStream and waits for the stream to take it.
async fn forge_js(
    js: &async_nats::jetstream::Context,
    subject: String,
    body: Bytes,
    headers: &[(&str, &str)],
) {
    let mut h = async_nats::HeaderMap::new();
    for (k, v) in headers {
        h.insert(*k, *v);
    }
    js.publish_with_headers(subject, h, body).await.unwrap().await.unwrap();
}

/// A diff-depth frame of BTCUSDT as the simulator sends it (combined stream).
fn diff_frame(event_ms: i64, first: u64, last: u64) -> String {
    format!(
        r#"{{"stream":"btcusdt@depth@100ms","data":{{"e":"depthUpdate","E":{event_ms},"s":"BTCUSDT","U":{first},"u":{last},"b":[["1.00","1"]],"a":[]}}}}"#
    )
}

/// A `kline@` push frame of a closed candle.
fn closed_push(series: &SeriesId, c: &Candle) -> Bytes {
    server::candles::writer::kline_frame(series, c, true, c.open_time + MINUTE_MS)
}

/// The open times of the next `n` closed candles pushed on `ws`.
async fn closed_seen(ws: &mut Ws, n: usize) -> Vec<i64> {
    let mut opens = Vec::new();
    while opens.len() < n {
        if let ServerFrame::Push(Push { data: PushData::Kline(ev), .. }) = next_frame(ws).await {
            if ev.k.x {
                opens.push(ev.k.t);
            }
        }
    }
    opens
}

/// The value of `millrace_bus_poison_total{kind}` in a `/metrics` text.
fn poison(metrics: &str, kind: &str) -> u64 {
    let prefix = format!("millrace_bus_poison_total{{kind=\"{kind}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_messages_crash_nothing_write_nothing_stop_nothing_and_are_counted() {
    use crate::depth_faults::{matches_sim, watch_bus};
    use shared::protocol::BookHealth;
    let mut c = TestCluster::start("forged", 60.0, 71, |config| {
        config.l3.host = "worker:w1".into();
        config.server.admin_token = Some(TOKEN.into());
        config.cluster.instruments = vec![BTC.parse().unwrap()];
        config.cluster.kinds = vec![TaskKind::Kline, TaskKind::Depth];
        config.depth.verify_interval_ms = 0; // no periodic re-snapshot: a resync would show
    })
    .await;
    c.supervisor("sup1");
    c.worker("w1", &[]);
    c.worker("w2", &[]);
    let before_report = fully_assigned(&c.gateway, 2, &[]).await;
    let held_before: Vec<(String, Vec<String>)> =
        before_report.tasks.iter().map(|t| (t.id.clone(), t.workers.clone())).collect();

    // Live: a browser's chart of BTC, the gateway's book of BTC synced through the cluster.
    let mut ws = c.gateway.ws().await;
    assert!(request(&mut ws, "SUBSCRIBE", &[&format!("kline@{BTC}:1m")], 1).await.is_ok());
    let _lease = c.gateway.app.subscribe_depth(&BTC.parse().unwrap()).unwrap();
    let watch = watch_bus(&c.gateway, BTC);
    let s0 = matches_sim(&c.gateway, &c.sim, BTC, "BTCUSDT", BookHealth::Synced).await;
    let seen_before = closed_seen(&mut ws, 2).await;
    let stored_before = stored_pg(&c.pg, &format!("{BTC}:1m")).len();
    assert!(stored_before > 0);

    // The forger: NATS access and nothing else.
    let prefix = c.gateway.config.bus.prefix.clone();
    let subjects = server::cluster::Subjects::new(&prefix);
    let nats = async_nats::connect(nats_url()).await.unwrap();
    let js = async_nats::jetstream::new(nats.clone());
    let now = c.sim.now_ms();
    let minute_now = now / MINUTE_MS * MINUTE_MS;
    let ten_years = 10 * 365 * 86_400_000_i64;
    let end_of_time = (1_i64 << 53) / MINUTE_MS * MINUTE_MS;
    let btc_1m = format!("{BTC}:1m");

    // 1. Closed candles (JetStream, the persister's).
    forge_candles(&js, &subjects, &btc_1m, vec![minute(0), minute(end_of_time)], "oom").await;
    forge_candles(&js, &subjects, &btc_1m, vec![minute(0)], "zero").await;
    forge_candles(&js, &subjects, &btc_1m, vec![minute(minute_now + ten_years)], "ten-years").await;
    // an hour ahead (at speed 60, an hour of the exchange is a minute here: it stays ahead
    // through the persister's waits for a fresh clock)
    let ahead = minute(minute_now + 60 * MINUTE_MS);
    forge_candles(&js, &subjects, &btc_1m, vec![ahead], "ahead").await;
    let recent = minute_now - 5 * MINUTE_MS;
    forge_candles(&js, &subjects, "evil:spot:BTC/USDT:1m", vec![minute(recent)], "no-source").await;
    forge_candles(&js, &subjects, "sim:spot:NOPE/USDT:1m", vec![minute(recent)], "no-symbol").await;
    forge_candles(&js, &subjects, &format!("{BTC}:5m"), vec![minute(recent)], "five").await;
    let mut crooked = minute(recent);
    crooked.high = Price(1);
    forge_candles(&js, &subjects, &btc_1m, vec![crooked], "crooked").await;
    let not_json = Bytes::from_static(b"\x00\x01 not a message");
    let btc_subject = subjects.candles(&btc_1m.parse().unwrap());
    forge_js(&js, btc_subject, not_json.clone(), &[("Nats-Msg-Id", "forged|bytes")]).await;

    // 2. An admin request to the tick-by-tick host (w1), without a proof and with a wrong one.
    let l3 = format!("{prefix}.l3.request");
    let unsigned = r#"{"request":{"op":"migrate","body":{"symbol":"600000","target":-1}}}"#;
    let wrong = r#"{"request":{"op":"hotspot","body":{"symbol":"600000","hot":true}},"proof":{"issued_ms":0,"nonce":1,"mac":"00"}}"#;
    for body in [unsigned, wrong] {
        let answer = tokio::time::timeout(
            Duration::from_secs(5),
            nats.request(l3.clone(), Bytes::from(body)),
        )
        .await
        .expect("the host answers")
        .expect("the host answers");
        let text = String::from_utf8_lossy(&answer.payload);
        assert!(text.contains("\"Err\"") && text.contains("403"), "refused: {text}");
    }

    // 3. Demands, statuses and instruction sets (core NATS, the control plane).
    let publish = |subject: String, body: String| {
        let nats = nats.clone();
        async move { nats.publish(subject, body.into()).await.unwrap() }
    };
    let demand = format!("{prefix}.cluster.demand");
    publish(demand.clone(), r#"{"gateway":"evil gateway","tasks":[]}"#.into()).await;
    publish(
        demand.clone(),
        r#"{"gateway":"evil","tasks":["kline:evil:spot:X/Y","depth:sim:spot:NOPE/USDT"]}"#.into(),
    )
    .await;
    publish(demand.clone(), "{not json".into()).await;
    let status = format!("{prefix}.cluster.status");
    publish(status.clone(), r#"{"worker":"evil","instance":1,"max_load":1000000000,"epoch":0,"applied_seq":0,"leaving":false,"tasks":[]}"#.into()).await;
    publish(status.clone(), r#"{"worker":"a.b","instance":1,"max_load":1,"epoch":0,"applied_seq":0,"leaving":false,"tasks":[]}"#.into()).await;
    let max = u64::MAX;
    publish(
        format!("{prefix}.cluster.instr.w2"),
        format!(r#"{{"worker":"w2","epoch":{max},"seq":1,"reset":true,"end":[],"add":[]}}"#),
    )
    .await;
    publish(
        format!("{prefix}.cluster.instr.w2"),
        r#"{"worker":"w1","epoch":1,"seq":1,"reset":true,"end":[],"add":[]}"#.into(),
    )
    .await;
    publish(format!("{prefix}.cluster.instr.w2"), "[]".into()).await;

    // 4. Depth diffs (JetStream, the gateway's book): Millrace-U at u64::MAX with a body that
    // says otherwise, and a body that says it too.
    let btc: InstrumentId = BTC.parse().unwrap();
    let diffs = server::cluster::depth::diff_subject(&subjects, &btc);
    let last = s0.last_update_id;
    let (max_s, prev_s) = (max.to_string(), last.to_string());
    let lying = Bytes::from(diff_frame(now, last + 1, last + 2));
    forge_js(
        &js,
        diffs.clone(),
        lying,
        &[("Nats-Msg-Id", "forged|diff-lying"), ("Millrace-Prev", &prev_s), ("Millrace-U", &max_s)],
    )
    .await;
    let saying = Bytes::from(diff_frame(now, last + 1, max));
    forge_js(
        &js,
        diffs.clone(),
        saying,
        &[("Nats-Msg-Id", "forged|diff-max"), ("Millrace-Prev", &prev_s), ("Millrace-U", &max_s)],
    )
    .await;

    // 5. A closed kline push ten years ahead on the gateways' bus.
    let series: SeriesId = btc_1m.parse().unwrap();
    let push = closed_push(&series, &minute(minute_now + ten_years));
    use server::bus::nats::{subject_of, Publisher};
    let kline_topic = format!("kline@{btc_1m}");
    let topic = subject_of(&prefix, Publisher::Gateway, &kline_topic);
    nats.publish(topic.clone(), push).await.unwrap();
    nats.publish(topic, Bytes::from_static(b"\x00\x00\x00\x00\x09{")).await.unwrap();
    // and a closed candle of the minute that is forming, where workers publish: only the
    // persister pushes closed candles (it stored them first)
    let forming = closed_push(&series, &minute(minute_now));
    nats.publish(subject_of(&prefix, Publisher::Worker, &kline_topic), forming).await.unwrap();

    // 6. Relayed trades (the workers relay every market's trades): bytes that are no push,
    // another instrument's trades on BTC's subject, a trade ten years ahead, and one whose id is
    // far past the last one kept (it would make every real trade after it a "duplicate").
    let trades_before = eventually("BTC trades on the gateway", || async {
        let r = c.gateway.get_json(&format!("/api/v1/trades?instrument={BTC}&limit=1")).await;
        (r["received"].as_u64()? > 0).then_some(r)
    })
    .await;
    let trade_subject =
        format!("{prefix}.relay.{}.evil", server::bus::nats::token(&format!("trade@{BTC}")));
    let trade_push = |instrument: &str, id: u64, time_ms: i64| {
        let body = serde_json::json!({
            "stream": format!("trade@{instrument}"),
            "data": {"s": instrument, "trades": [
                {"id": id.to_string(), "time_ms": time_ms, "price": "1.00000000", "qty": "1.00000000"}
            ]}
        });
        Bytes::from(body.to_string())
    };
    nats.publish(trade_subject.clone(), Bytes::from_static(b"\x00{")).await.unwrap();
    let eth = "sim:spot:ETH/USDT";
    nats.publish(trade_subject.clone(), trade_push(eth, 1, now)).await.unwrap();
    nats.publish(trade_subject.clone(), trade_push(BTC, 1, now + ten_years)).await.unwrap();
    nats.publish(trade_subject.clone(), trade_push(BTC, u64::MAX, now)).await.unwrap();
    nats.flush().await.unwrap();

    // Live data goes on: closed candles keep arriving and being stored, the book stays right.
    let seen_after = closed_seen(&mut ws, 3).await;
    assert!(seen_after[0] > seen_before[1], "{seen_before:?} then {seen_after:?}");
    let s1 = matches_sim(&c.gateway, &c.sim, BTC, "BTCUSDT", BookHealth::Synced).await;
    assert!(s1.last_update_id > s0.last_update_id);
    assert_eq!(s1.sync.gaps, s0.sync.gaps, "no gap: {:?}", s1.sync);
    assert_eq!(s1.sync.resyncs, s0.sync.resyncs, "no resync: {:?}", s1.sync);
    watch.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    watch.assert_clean("BTC under forged messages");
    // Real trades are still kept, none of the forged ones is, and no id gap was made.
    let received = trades_before["received"].as_u64().unwrap();
    let trades = eventually("BTC trades after the forged ones", || async {
        let r = c.gateway.get_json(&format!("/api/v1/trades?instrument={BTC}&limit=1000")).await;
        (r["received"].as_u64()? > received + 10).then_some(r)
    })
    .await;
    let forged_price =
        trades["trades"].as_array().unwrap().iter().any(|t| {
            t["price"] == "1.00000000" || t["id"].as_str() == Some("18446744073709551615")
        });
    assert!(!forged_price, "a forged trade was kept: {trades}");
    assert_eq!(trades["id_gaps"], 0, "{trades}");

    // Every forged message counted, by kind, where it was read.
    let metrics = eventually("the gateway's refusals counted", || async {
        let (_, m) = c.gateway.get("/metrics").await;
        let kinds = [
            "not_one_block",
            "too_old",
            "too_new",
            "foreign_series",
            "not_one_minute",
            "not_closed_minute",
            "unparsable",
            "diff_headers",
            "diff_ids",
            "sender",
        ];
        kinds.iter().all(|k| poison(&m, k) > 0).then_some(m)
    })
    .await;
    let r = eventually("the leader's and the workers' refusals counted", || async {
        let r = report(&c.gateway).await?;
        let sup = &r.supervisor.refused;
        let w = |id: &str| r.workers.iter().find(|w| w.id == id).map(|w| w.refused.clone());
        let (w1, w2) = (w("w1")?, w("w2")?);
        let ok = ["demand", "foreign_series", "status", "unparsable"]
            .iter()
            .all(|k| sup.get(*k).is_some_and(|n| *n > 0))
            && w1.get("unsigned").is_some_and(|n| *n >= 2)
            && w2.get("instructions").is_some_and(|n| *n >= 2)
            && w2.get("unparsable").is_some_and(|n| *n >= 1);
        ok.then_some(r)
    })
    .await;
    let (_, metrics_now) = c.gateway.get("/metrics").await;
    assert!(
        metrics_now.contains(
            r#"millrace_cluster_refused_total{process="w2",role="worker",kind="instructions"}"#
        ),
        "{metrics_now}"
    );
    eprintln!(
        "gateway refusals: {}",
        metrics
            .lines()
            .filter(|l| l.starts_with("millrace_bus_poison_total"))
            .collect::<Vec<_>>()
            .join("; ")
    );

    // No process exited; the workers hold what they held.
    for id in ["sup1", "w1", "w2"] {
        assert!(c.role(id).exited(Duration::ZERO).await.is_none(), "{id} exited");
    }
    let held_after: Vec<(String, Vec<String>)> =
        r.tasks.iter().map(|t| (t.id.clone(), t.workers.clone())).collect();
    assert_eq!(held_after, held_before, "the forged instruction sets moved no task");
    assert!(r.workers.iter().all(|w| w.id == "w1" || w.id == "w2"), "no forged worker joined");

    // No row was written: BTC's stored minutes are the exchange's, none outside its clock, and
    // no forged series exists.
    let stored = eventually("more BTC minutes stored, all the exchange's", || async {
        let stored = stored_pg(&c.pg, &btc_1m);
        let (first, last) = (stored.first()?.open_time, stored.last()?.open_time);
        (stored.len() > stored_before + 2 && stored == c.sim.closed_klines("BTCUSDT", first, last))
            .then_some(stored)
    })
    .await;
    assert!(stored.iter().all(|k| k.open_time > 0 && k.open_time < minute_now + ten_years));
    let names: Vec<String> = tokio::task::block_in_place(|| {
        c.pg.client()
            .query("SELECT name FROM series", &[])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    });
    assert!(
        names.iter().all(|n| n.starts_with("sim:spot:BTC/USDT:")),
        "only BTC's series exist: {names:?}"
    );

    // The refused messages were terminated, not left to be redelivered.
    eventually("nothing pending for the persister", || {
        let (js, stream) = (js.clone(), subjects.candle_stream());
        async move {
            use async_nats::jetstream::consumer::pull;
            let stream = js.get_stream(stream).await.ok()?;
            let mut consumer = stream.get_consumer::<pull::Config>("persister").await.ok()?;
            let info = consumer.info().await.ok()?;
            (info.num_ack_pending == 0 && info.num_pending == 0).then_some(())
        }
    })
    .await;
    c.stop().await;
}
