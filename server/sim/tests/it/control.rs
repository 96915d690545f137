//! The simulator's control requests (`POST /sim/faults`, `POST /tbt/control`) over real HTTP:
//! refused without the control token (401), with a wrong one (401), without any configured
//! (403), and as anything but JSON (415, the content type a web page can send cross-origin
//! without a preflight); each refusal counted and nothing applied. Reads stay open.

use std::time::Duration;

use serde_json::Value;
use sim::{Sim, SimConfig, SimHandle};

const TOKEN: &str = crate::CONTROL_TOKEN;

async fn start(token: Option<&str>) -> SimHandle {
    let config = SimConfig {
        seed: 11,
        symbols: SimConfig::symbols_named(&["BTCUSDT"]).unwrap(),
        control_token: token.map(String::from),
        ..SimConfig::default()
    };
    Sim::start(config, "127.0.0.1:0".parse().unwrap()).await.unwrap()
}

/// POSTs `body` to `path` with an optional bearer token and content type → (status, body).
async fn post(
    sim: &SimHandle,
    path: &str,
    token: Option<&str>,
    content_type: Option<&str>,
    body: &str,
) -> (u16, Value) {
    let mut req = reqwest::Client::new().post(format!("{}{path}", sim.rest_base()));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(c) = content_type {
        req = req.header("Content-Type", c);
    }
    let r = req.body(body.to_string()).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn refused(sim: &SimHandle) -> u64 {
    sim.faults().counters().control_refused
}

#[tokio::test]
async fn control_requests_need_the_token_and_json() {
    let sim = start(Some(TOKEN)).await;
    let skip = r#"{"action":"skip","kind":"kline","count":4}"#;
    let pause = r#"{"pause":true}"#;
    let json = Some("application/json");
    for (path, body) in [("/sim/faults", skip), ("/tbt/control", pause)] {
        let before = refused(&sim);
        // no token, a wrong one, a prefix of the right one
        for token in [None, Some("wrong-token-wrong"), Some(&TOKEN[..TOKEN.len() - 1])] {
            let (status, reply) = post(&sim, path, token, json, body).await;
            assert_eq!(status, 401, "{path} with {token:?}: {reply}");
            assert!(reply["msg"].as_str().unwrap().contains("Bearer"), "{reply}");
        }
        // the right token, but a body a web page could send without a preflight
        for ct in [Some("text/plain"), Some("application/x-www-form-urlencoded"), None] {
            let (status, reply) = post(&sim, path, Some(TOKEN), ct, body).await;
            assert_eq!(status, 415, "{path} as {ct:?}: {reply}");
        }
        assert_eq!(refused(&sim), before + 6, "{path}: every refusal counted");
    }
    // nothing was applied
    assert!(!sim.tbt().is_paused());
    assert!(sim.faults().plan().messages.is_empty(), "{:?}", sim.faults().plan());

    // with the token and JSON (parameters allowed) both apply
    let (status, reply) =
        post(&sim, "/sim/faults", Some(TOKEN), Some("application/json; charset=utf-8"), skip).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(sim.faults().plan().messages.len(), 1);
    let (status, reply) = post(&sim, "/tbt/control", Some(TOKEN), json, pause).await;
    assert_eq!(status, 200, "{reply}");
    assert!(sim.tbt().is_paused());

    // reads need no token
    for path in ["/sim/faults", "/sim/status", "/tbt/status", "/api/v3/time"] {
        let r = reqwest::get(format!("{}{path}", sim.rest_base())).await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
    let state: Value = reqwest::get(format!("{}/sim/faults", sim.rest_base()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(state["counters"]["control_refused"], 12);
    sim.shutdown();
}

#[tokio::test]
async fn without_a_token_control_is_disabled() {
    let sim = start(None).await;
    for (path, body) in
        [("/sim/faults", r#"{"action":"drop"}"#), ("/tbt/control", r#"{"pause":true}"#)]
    {
        for token in [None, Some(TOKEN)] {
            let (status, reply) = post(&sim, path, token, Some("application/json"), body).await;
            assert_eq!(status, 403, "{path}: {reply}");
            assert!(reply["msg"].as_str().unwrap().contains("control token"), "{reply}");
        }
    }
    assert!(!sim.tbt().is_paused());
    assert_eq!(refused(&sim), 4);
    // the handle still controls it (tests, the embedding server)
    sim.tbt().pause(true);
    assert!(sim.tbt().is_paused());
    tokio::time::sleep(Duration::from_millis(10)).await;
    sim.shutdown();
}
