//! What the server sends on `/ws`, typed once: a [`ServerFrame`] is a [`Reply`] or a push whose
//! `data` is already the type its stream carries ([`PushData`]), read in one pass over the text.
//!
//! A push is `{"stream":"…","data":{…}}`; a reply holds an `id` (and, sent unasked, the
//! `stream` it is about). The stream names the type of `data`, so the reader
//! takes `stream` first and then reads `data` straight into that type; only a frame that puts
//! `data` before `stream` (which millrace never sends) has its `data` held as a JSON value until
//! the stream is known. A `data` that does not fit its stream is an error naming the stream,
//! never a panic, and nothing of the frame is passed on. The wire format is that of
//! [`Push`]`<T>` with each `T` below, unchanged: the seed's JavaScript client and ccxt read it.

use core::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use super::{
    DepthSnapshotEvent, DepthUpdateEvent, ErrorBody, Heartbeat, KlineEvent, Push, Reply, Stream,
    TradesEvent,
};

/// The `data` of a push, as its stream says.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum PushData {
    /// On `kline@{series}`.
    Kline(KlineEvent),
    /// On `depth@{instrument},{levels}`.
    Depth(DepthSnapshotEvent),
    /// On `depth_update@{instrument}`.
    DepthUpdate(DepthUpdateEvent),
    /// On `trade@{instrument}`.
    Trades(TradesEvent),
    /// On `heartbeat`.
    Heartbeat(Heartbeat),
}

impl PushData {
    /// What kind of data this is, for messages (`kline`, `depth`, `depth_update`, `heartbeat`).
    pub fn kind(&self) -> &'static str {
        match self {
            PushData::Kline(_) => "kline",
            PushData::Depth(_) => "depth",
            PushData::DepthUpdate(_) => "depth_update",
            PushData::Trades(_) => "trade",
            PushData::Heartbeat(_) => "heartbeat",
        }
    }

    /// Reads `data` as the type `stream` carries.
    fn read<'de, D: Deserializer<'de>>(stream: &Stream, data: D) -> Result<PushData, D::Error> {
        let named = |e: D::Error| de::Error::custom(format_args!("data of {stream}: {e}"));
        Ok(match stream {
            Stream::Kline(_) => PushData::Kline(KlineEvent::deserialize(data).map_err(named)?),
            Stream::Depth { .. } => {
                PushData::Depth(DepthSnapshotEvent::deserialize(data).map_err(named)?)
            }
            Stream::DepthUpdate(_) => {
                PushData::DepthUpdate(DepthUpdateEvent::deserialize(data).map_err(named)?)
            }
            Stream::Trade(_) => PushData::Trades(TradesEvent::deserialize(data).map_err(named)?),
            Stream::Heartbeat => PushData::Heartbeat(Heartbeat::deserialize(data).map_err(named)?),
        })
    }
}

/// Reads a push's `data` once its stream is known.
struct DataOf<'a>(&'a Stream);

impl<'de> DeserializeSeed<'de> for DataOf<'_> {
    type Value = PushData;
    fn deserialize<D: Deserializer<'de>>(self, data: D) -> Result<PushData, D::Error> {
        PushData::read(self.0, data)
    }
}

/// Anything the server sends on `/ws`: a reply to a request, or a typed push.
// Nearly every frame is a push: boxing it to make the rare reply's variant no smaller would cost
// an allocation per frame.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ServerFrame {
    Reply(Reply),
    Push(Push<PushData>),
}

impl<'de> Deserialize<'de> for ServerFrame {
    fn deserialize<D: Deserializer<'de>>(frame: D) -> Result<ServerFrame, D::Error> {
        frame.deserialize_map(FrameVisitor)
    }
}

struct FrameVisitor;

/// The keys a frame may hold; any other is skipped.
enum Key {
    Id,
    Result,
    Error,
    Stream,
    Data,
    Other,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key of a reply or a push")
            }
            fn visit_str<E: de::Error>(self, k: &str) -> Result<Key, E> {
                Ok(match k {
                    "id" => Key::Id,
                    "result" => Key::Result,
                    "error" => Key::Error,
                    "stream" => Key::Stream,
                    "data" => Key::Data,
                    _ => Key::Other,
                })
            }
        }
        d.deserialize_identifier(KeyVisitor)
    }
}

impl<'de> Visitor<'de> for FrameVisitor {
    type Value = ServerFrame;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(r#"a reply {"id":…} or a push {"stream":…,"data":…}"#)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ServerFrame, A::Error> {
        let (mut id, mut error, mut stream) = (None::<u64>, None::<ErrorBody>, None::<Stream>);
        let mut data: Option<PushData> = None;
        // `data` seen before `stream` (never sent by millrace): held until the stream is known
        let mut early: Option<serde_json::Value> = None;
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Id => id = Some(map.next_value()?),
                Key::Error => error = map.next_value()?,
                Key::Stream => {
                    if stream.is_some() {
                        return Err(de::Error::duplicate_field("stream"));
                    }
                    stream = Some(map.next_value()?);
                }
                Key::Data => {
                    if data.is_some() || early.is_some() {
                        return Err(de::Error::duplicate_field("data"));
                    }
                    match &stream {
                        Some(s) => data = Some(map.next_value_seed(DataOf(s))?),
                        None => early = Some(map.next_value()?),
                    }
                }
                Key::Result | Key::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        match (id, stream) {
            // a reply; one the server sends unasked names the stream it is about
            (Some(id), stream) => Ok(ServerFrame::Reply(Reply { id, error, stream })),
            (None, Some(stream)) => {
                let data = match (data, early) {
                    (Some(d), _) => d,
                    (None, Some(v)) => PushData::read(&stream, v).map_err(de::Error::custom)?,
                    (None, None) => return Err(de::Error::missing_field("data")),
                };
                Ok(ServerFrame::Push(Push { stream, data }))
            }
            (None, None) => Err(de::Error::custom("neither a reply (`id`) nor a push (`stream`)")),
        }
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;
    use crate::book::Level;
    use crate::candle::Timeframe;
    use crate::fixed::{Price, Qty, Volume};
    use crate::protocol::{ErrorCode, KlinePayload};

    fn level(p: &str, q: &str) -> Level {
        Level::new(Price::parse(p).unwrap(), Qty::parse(q).unwrap())
    }

    /// One push of each kind, as the server serializes it (`Push<T>`), with its typed form.
    fn pushes() -> Vec<(String, Push<PushData>)> {
        let series = "sim:spot:BTC/USDT:1m".parse().unwrap();
        let instrument: crate::protocol::InstrumentId = "sim:spot:BTC/USDT".parse().unwrap();
        let kline = KlineEvent {
            e: "kline".into(),
            event_time: 1_700_000_000_123,
            s: "sim:spot:BTC/USDT:1m".parse().unwrap(),
            k: KlinePayload {
                t: 1_700_000_000_000 - 20_000,
                close_time: 1_700_000_039_999,
                i: Timeframe::M1,
                o: Price::parse("100.5").unwrap(),
                h: Price::parse("101").unwrap(),
                l: Price::parse("99.25").unwrap(),
                c: Price::parse("100").unwrap(),
                v: Volume::parse("12.5").unwrap(),
                n: 7,
                x: false,
            },
        };
        let update = DepthUpdateEvent {
            e: "depthUpdate".into(),
            event_time: 5,
            s: instrument.clone(),
            first_id: 10,
            u: 12,
            pu: 9,
            b: vec![level("100.5", "1"), level("100", "0")],
            a: vec![level("101", "2.5")],
            cs: 42,
        };
        let snapshot = DepthSnapshotEvent {
            event_time: 6,
            s: instrument.clone(),
            u: 12,
            bids: vec![level("100.5", "1")],
            asks: vec![level("101", "2.5"), level("102", "3")],
        };
        let heartbeat = Heartbeat { seq: 3, server_time_ms: 7, version: "0.1.0".into() };
        let trades = TradesEvent {
            s: instrument.clone(),
            trades: vec![crate::trade::Trade {
                id: crate::trade::TradeId::Seq(77),
                time_ms: 8,
                price: Price::parse("100.5").unwrap(),
                qty: crate::Qty::parse("0.25").unwrap(),
                taker: Some(crate::trade::TakerSide::Sell),
            }],
        };
        let wire = |stream: &Stream, data: &dyn erased::Json| data.push_json(stream);
        let depth = Stream::Depth { instrument: instrument.clone(), levels: 20 };
        let cases: Vec<(Stream, PushData, &dyn erased::Json)> = vec![
            (Stream::Kline(series), PushData::Kline(kline.clone()), &kline),
            (
                Stream::DepthUpdate(instrument.clone()),
                PushData::DepthUpdate(update.clone()),
                &update,
            ),
            (depth, PushData::Depth(snapshot.clone()), &snapshot),
            (Stream::Heartbeat, PushData::Heartbeat(heartbeat.clone()), &heartbeat),
            (Stream::Trade(instrument), PushData::Trades(trades.clone()), &trades),
        ];
        cases
            .into_iter()
            .map(|(stream, data, raw)| (wire(&stream, raw), Push { stream, data }))
            .collect()
    }

    /// `Push<T>` of each event type, serialized as the server does.
    mod erased {
        use super::*;
        pub trait Json {
            fn push_json(&self, stream: &Stream) -> String;
        }
        impl<T: Serialize + Clone> Json for T {
            fn push_json(&self, stream: &Stream) -> String {
                serde_json::to_string(&Push { stream: stream.clone(), data: self.clone() }).unwrap()
            }
        }
    }

    #[test]
    fn each_push_is_read_typed_and_written_back_byte_for_byte() {
        for (wire, typed) in pushes() {
            let frame: ServerFrame = serde_json::from_str(&wire).unwrap();
            assert_eq!(frame, ServerFrame::Push(typed.clone()), "{wire}");
            assert_eq!(serde_json::to_string(&frame).unwrap(), wire, "the wire is unchanged");
            assert_eq!(serde_json::to_string(&typed).unwrap(), wire);
        }
    }

    #[test]
    fn data_before_stream_is_read_the_same() {
        for (wire, typed) in pushes() {
            let v: serde_json::Value = serde_json::from_str(&wire).unwrap();
            let swapped = format!(r#"{{"data":{},"stream":{}}}"#, v["data"], v["stream"]);
            let frame: ServerFrame = serde_json::from_str(&swapped).unwrap();
            assert_eq!(frame, ServerFrame::Push(typed), "{swapped}");
        }
    }

    #[test]
    fn data_that_does_not_fit_its_stream_is_an_error_naming_it() {
        let all = pushes();
        let (update_wire, _) = &all[1];
        let v: serde_json::Value = serde_json::from_str(update_wire).unwrap();
        // a depth update's data on a kline stream, in both orders
        for text in [
            format!(r#"{{"stream":"kline@sim:spot:BTC/USDT:1m","data":{}}}"#, v["data"]),
            format!(r#"{{"data":{},"stream":"kline@sim:spot:BTC/USDT:1m"}}"#, v["data"]),
        ] {
            let e = serde_json::from_str::<ServerFrame>(&text).unwrap_err().to_string();
            assert!(e.contains("data of kline@sim:spot:BTC/USDT:1m"), "{e}");
        }
        for (text, says) in [
            (r#"{"stream":"book@x","data":{}}"#, "book@x"),
            (r#"{"stream":"heartbeat"}"#, "missing field `data`"),
            (r#"{"result":null}"#, "neither a reply"),
            (r#"{"stream":"heartbeat","stream":"heartbeat","data":{}}"#, "duplicate field"),
            (r#"[1,2]"#, "a reply"),
        ] {
            let e = serde_json::from_str::<ServerFrame>(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn replies_are_read_as_before() {
        let frame: ServerFrame = serde_json::from_str(r#"{"id":1,"result":null}"#).unwrap();
        assert_eq!(frame, ServerFrame::Reply(Reply::ok(1)));
        let frame: ServerFrame =
            serde_json::from_str(r#"{"id":3,"error":{"code":"malformed","msg":"x"}}"#).unwrap();
        assert_eq!(frame, ServerFrame::Reply(Reply::error(3, ErrorCode::Malformed, "x")));
        assert_eq!(
            serde_json::to_string(&frame).unwrap(),
            r#"{"id":3,"error":{"code":"malformed","msg":"x"}}"#
        );
        // unasked: the subscription the server ended, named
        let text = r#"{"id":0,"stream":"kline@sim:spot:BTC/USDT:1m","error":{"code":"preempted","msg":"y"}}"#;
        let ServerFrame::Reply(reply) = serde_json::from_str(text).unwrap() else {
            panic!("a reply: {text}")
        };
        assert_eq!(reply.stream, Some("kline@sim:spot:BTC/USDT:1m".parse().unwrap()));
        assert_eq!(reply.error.map(|e| e.code), Some(ErrorCode::Preempted));
    }
}
