//! The dashboard's decode of a `/ws` frame, per frame, before and after typed pushes:
//! - `value_then_typed`: what the client did before — the frame read as a reply or a push with
//!   `data` as a `serde_json::Value`, then `from_value::<T>(data.clone())` by the handler;
//! - `typed`: [`ServerFrame`] as it is now — `data` read straight into its stream's type.
//!
//! Frames as the server sends them: a `depth_update` of 20 changed levels a side, a `depth`
//! snapshot of 20 levels a side, a forming kline, a heartbeat.
//!
//! Run: `cargo bench -p shared --bench protocol -- --warm-up-time 1 --measurement-time 3`

#[cfg(not(target_arch = "wasm32"))]
mod native {
    use criterion::{black_box, criterion_group, Criterion, Throughput};
    use serde::de::DeserializeOwned;
    use serde::Deserialize;
    use shared::book::Level;
    use shared::candle::Timeframe;
    use shared::protocol::{
        DepthSnapshotEvent, DepthUpdateEvent, Heartbeat, InstrumentId, KlineEvent, KlinePayload,
        Push, Reply, ServerFrame, Stream,
    };
    use shared::{Price, Qty, Volume};

    /// The frame type the client read before: `data` left as a JSON value.
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum UntypedFrame {
        #[allow(dead_code)]
        Reply(Reply),
        Push(Push<serde_json::Value>),
    }

    /// The old path: the frame, then the handler's typed copy of `data`.
    fn value_then_typed<T: DeserializeOwned>(text: &str) -> T {
        match serde_json::from_str::<UntypedFrame>(text).unwrap() {
            UntypedFrame::Push(p) => serde_json::from_value::<T>(p.data.clone()).unwrap(),
            UntypedFrame::Reply(_) => unreachable!("a push"),
        }
    }

    fn levels(from: i64, step: i64) -> Vec<Level> {
        (0..20)
            .map(|i| {
                Level::new(
                    Price::from_raw(from + step * i * 1_000_000),
                    Qty::from_raw(12_345_678 + i * 1_000),
                )
            })
            .collect()
    }

    fn json<T: serde::Serialize + Clone>(stream: Stream, data: &T) -> String {
        serde_json::to_string(&Push { stream, data: data.clone() }).unwrap()
    }

    fn decode(c: &mut Criterion) {
        let instrument: InstrumentId = "binance:spot:BTC/USDT".parse().unwrap();
        let series = "binance:spot:BTC/USDT:1m".parse().unwrap();
        let update = DepthUpdateEvent {
            e: "depthUpdate".into(),
            event_time: 1_764_000_000_123,
            s: instrument.clone(),
            first_id: 71_234_567_890,
            u: 71_234_567_912,
            pu: 71_234_567_889,
            b: levels(9_712_300_000_000, -1),
            a: levels(9_712_310_000_000, 1),
            cs: 3_141_592_653,
        };
        let snapshot = DepthSnapshotEvent {
            event_time: 1_764_000_000_123,
            s: instrument.clone(),
            u: 71_234_567_912,
            bids: levels(9_712_300_000_000, -1),
            asks: levels(9_712_310_000_000, 1),
        };
        let kline = KlineEvent {
            e: "kline".into(),
            event_time: 1_764_000_000_123,
            s: "binance:spot:BTC/USDT:1m".parse().unwrap(),
            k: KlinePayload {
                t: 1_764_000_000_000 - 60_000,
                close_time: 1_763_999_999_999,
                i: Timeframe::M1,
                o: Price::from_raw(9_712_300_000_000),
                h: Price::from_raw(9_713_300_000_000),
                l: Price::from_raw(9_711_300_000_000),
                c: Price::from_raw(9_712_800_000_000),
                v: Volume::from_raw(1_234_567_890),
                n: 1_234,
                x: false,
            },
        };
        let heartbeat =
            Heartbeat { seq: 12_345, server_time_ms: 1_764_000_000_123, version: "0.1.0".into() };
        let frames = [
            ("depth_update", json(Stream::DepthUpdate(instrument.clone()), &update)),
            ("depth_snapshot", json(Stream::Depth { instrument, levels: 20 }, &snapshot)),
            ("kline", json(Stream::Kline(series), &kline)),
            ("heartbeat", json(Stream::Heartbeat, &heartbeat)),
        ];
        let mut group = c.benchmark_group("ws_frame");
        group.throughput(Throughput::Elements(1));
        for (name, text) in &frames {
            group.bench_function(format!("{name}/value_then_typed"), |b| {
                b.iter(|| match *name {
                    "depth_update" => drop(black_box(value_then_typed::<DepthUpdateEvent>(text))),
                    "depth_snapshot" => {
                        drop(black_box(value_then_typed::<DepthSnapshotEvent>(text)))
                    }
                    "kline" => drop(black_box(value_then_typed::<KlineEvent>(text))),
                    _ => drop(black_box(value_then_typed::<Heartbeat>(text))),
                })
            });
            group.bench_function(format!("{name}/typed"), |b| {
                b.iter(|| black_box(serde_json::from_str::<ServerFrame>(black_box(text)).unwrap()))
            });
        }
        group.finish();
    }

    criterion_group!(benches, decode);
}

#[cfg(not(target_arch = "wasm32"))]
criterion::criterion_main!(native::benches);

#[cfg(target_arch = "wasm32")]
fn main() {}
