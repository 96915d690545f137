//! Secrets never leak: a distinct password planted in every secret-bearing key — `store.url` as a
//! URL and as a libpq `key=value` string, `bus.url` with `user:password@` and with `token@`,
//! `server.admin_token` — and every output of the real `millrace` binary searched for each:
//! `serve --print-config`, the log at `RUST_LOG=debug` and the error of a start against a store
//! and a bus that fail, and `/healthz` and `/metrics` of a running gateway whose NATS goes away
//! and whose PostgreSQL stops (a test's own servers; the PostgreSQL role logs in with its
//! password). `/healthz`, which anyone may read, names the failing key and never its value.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use server::config::Config;
use server::config::{BusConfig, BusKind, ClusterConfig, StoreConfig, StoreKind};
use shared::cluster::TaskKind;
use testkit::*;

/// The PostgreSQL role's password (its real one: the gateway logs in with it).
const PG_URL_PASSWORD: &str = "PgUrlPw-7e1f0c";
/// A wrong password in the `key=value` form (PostgreSQL refuses it).
const PG_KV_PASSWORD: &str = "PgKvPw-41ac9d";
const NATS_PASSWORD: &str = "NatsPw-93bd2e";
const NATS_TOKEN: &str = "NatsTok-5c20a7";
const ADMIN_TOKEN: &str = "AdminTok-d8e6f3";
/// `bus.password` and `bus.token` (the keys, not the URL).
const BUS_PASSWORD: &str = "BusPw-0d57aa";
const BUS_TOKEN: &str = "BusTok-6b1e42";
const SECRETS: [&str; 7] = [
    PG_URL_PASSWORD,
    PG_KV_PASSWORD,
    NATS_PASSWORD,
    NATS_TOKEN,
    ADMIN_TOKEN,
    BUS_PASSWORD,
    BUS_TOKEN,
];

/// The role of the test's own PostgreSQL that needs a password (its database has its name).
const ROLE: &str = "millrace_secrets";

/// Fails naming the output and showing where a planted secret appears in it.
fn assert_no_secret(what: &str, text: &str) {
    for secret in SECRETS {
        if let Some(at) = text.find(secret) {
            let from = text[..at].char_indices().rev().nth(200).map_or(0, |(i, _)| i);
            let to = (at + secret.len() + 200).min(text.len());
            let to = (to..=text.len()).find(|i| text.is_char_boundary(*i)).unwrap_or(text.len());
            panic!("{what} shows the secret {secret:?}: …{}…", &text[from..to]);
        }
    }
}

/// A free port of 127.0.0.1 that nothing listens on.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A PostgreSQL server of the test's own where [`ROLE`] logs in over TCP with its password
/// ([`PG_URL_PASSWORD`], SCRAM) and owns a database of its name; the admin keeps trust.
fn postgres_with_a_password(tag: &str) -> OwnPostgres {
    let dir = temp_dir(tag);
    let pg = OwnPostgres::start(dir.clone());
    let hba = dir.join("pgdata").join("pg_hba.conf");
    let rules = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(&hba, format!("host all {ROLE} 127.0.0.1/32 scram-sha-256\n{rules}")).unwrap();
    pg.down("fast");
    pg.up();
    let mut admin = postgres::Client::connect(&pg.admin_url(), postgres::NoTls).unwrap();
    admin.batch_execute(&format!("CREATE ROLE {ROLE} LOGIN PASSWORD '{PG_URL_PASSWORD}'")).unwrap();
    admin.batch_execute(&format!("CREATE DATABASE {ROLE} OWNER {ROLE}")).unwrap();
    pg
}

fn pg_url(port: u16) -> String {
    format!("postgres://{ROLE}:{PG_URL_PASSWORD}@127.0.0.1:{port}/{ROLE}")
}

/// A configuration on PostgreSQL at `store_url` and NATS at `bus_url` (no cluster), with the
/// admin token.
fn config(store_url: &str, bus_url: &str) -> Config {
    let mut c = test_config(vec![embedded_sim_source(1.0)]);
    c.server.addr = format!("127.0.0.1:{}", closed_port()).parse().unwrap();
    c.server.admin_token = Some(ADMIN_TOKEN.into());
    c.store = StoreConfig {
        kind: StoreKind::Postgres,
        url: Some(store_url.into()),
        ..Default::default()
    };
    c.bus = BusConfig {
        kind: BusKind::Nats,
        url: bus_url.into(),
        prefix: test_prefix("secrets"),
        ..BusConfig::default()
    };
    c
}

/// What a run of `millrace serve --config <config> <args…>` (at most 60 s) said.
struct Run {
    success: bool,
    stdout: String,
    stderr: String,
}

impl Run {
    fn serve(name: &str, config: &Config, args: &[&str], env: &[(&str, &str)]) -> Run {
        let dir = temp_dir(name);
        let path = dir.join("millrace.toml");
        std::fs::write(&path, toml::to_string(config).unwrap()).unwrap();
        let (out, err) = (dir.join("stdout"), dir.join("stderr"));
        let mut child = Command::new(millrace_bin())
            .args(["serve", "--config"])
            .arg(&path)
            .args(args)
            .env("RUST_LOG", "debug")
            .envs(env.iter().copied())
            .stdout(Stdio::from(std::fs::File::create(&out).unwrap()))
            .stderr(Stdio::from(std::fs::File::create(&err).unwrap()))
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{name}: millrace serve did not end within 60 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let read = |p: &Path| std::fs::read_to_string(p).unwrap();
        let run = Run { success: status.success(), stdout: read(&out), stderr: read(&err) };
        assert_no_secret(&format!("{name}: stdout"), &run.stdout);
        assert_no_secret(&format!("{name}: stderr (RUST_LOG=debug)"), &run.stderr);
        run
    }
}

/// `--print-config` shows every key, with secrets as `<redacted>` and URLs without their
/// credentials, from the file and from the environment; the configuration itself keeps the
/// real values (child processes of the tests are given it as a file).
#[test]
fn print_config_shows_no_secret() {
    let nats = "nats://127.0.0.1:4222";
    let with_url = config(&pg_url(5432), nats);
    assert!(toml::to_string(&with_url).unwrap().contains(PG_URL_PASSWORD));
    let run = Run::serve("printurl", &with_url, &["--print-config"], &[]);
    assert!(run.success, "{}", run.stderr);
    assert!(run.stdout.contains(r#"admin_token = "<redacted>""#), "{}", run.stdout);
    let shown = format!("postgres://{ROLE}:***@127.0.0.1:5432/{ROLE}");
    assert!(run.stdout.contains(&shown), "{}", run.stdout);

    let key_value = format!("host=127.0.0.1 user={ROLE} password='{PG_KV_PASSWORD} x' dbname=m");
    let mut from_env = config(&key_value, nats);
    from_env.server.admin_token = None;
    let run = Run::serve(
        "printkv",
        &from_env,
        &["--print-config"],
        &[("MILLRACE_ADMIN_TOKEN", ADMIN_TOKEN)],
    );
    assert!(run.success, "{}", run.stderr);
    assert!(run.stdout.contains(r#"admin_token = "<redacted>""#), "{}", run.stdout);
    assert!(run.stdout.contains(&format!("user={ROLE} password=*** dbname=m")), "{}", run.stdout);

    // Credentials in bus.url: printed redacted, or refused with an error that does not quote
    // them (either way, nothing shows them).
    let bus =
        format!("nats://gateway:{NATS_PASSWORD}@127.0.0.1:4222,nats://{NATS_TOKEN}@127.0.0.1:4223");
    let run = Run::serve("printbus", &config(&pg_url(5432), &bus), &["--print-config"], &[]);
    if run.success {
        let shown = "nats://gateway:***@127.0.0.1:4222,nats://***@127.0.0.1:4223";
        assert!(run.stdout.contains(shown), "{}", run.stdout);
    } else {
        assert!(run.stderr.contains("bus.url"), "{}", run.stderr);
    }

    // The bus's own secret keys: bus.password (with bus.user), bus.token, bus.nkey_seed.
    let seed = nkeys::KeyPair::new_user().seed().unwrap();
    let mut with_password = config(&pg_url(5432), nats);
    (with_password.bus.user, with_password.bus.password) =
        (Some("gateway".into()), Some(BUS_PASSWORD.into()));
    let mut with_token = config(&pg_url(5432), nats);
    with_token.bus.token = Some(BUS_TOKEN.into());
    let mut with_seed = config(&pg_url(5432), nats);
    with_seed.bus.nkey_seed = Some(seed.clone());
    for (name, c) in
        [("printpw", with_password), ("printtok", with_token), ("printseed", with_seed)]
    {
        let run = Run::serve(name, &c, &["--print-config"], &[]);
        assert!(run.success, "{name}: {}", run.stderr);
        assert_no_secret(name, &run.stdout);
        assert_no_secret(name, &run.stderr);
        assert!(!format!("{}{}", run.stdout, run.stderr).contains(&seed), "{name}: the seed");
        assert!(run.stdout.contains("\"<redacted>\""), "{name}: {}", run.stdout);
    }
}

/// A start against a store or a bus that fails ends with an error naming the key, and neither
/// the error nor the debug log shows a secret: PostgreSQL away (URL form), PostgreSQL refusing
/// a wrong password (`key=value` form), NATS away (`user:password@` and `token@` in bus.url).
#[test]
fn failed_starts_show_no_secret() {
    let pg = postgres_with_a_password("secretspg");
    let nats_away = format!("nats://127.0.0.1:{}", closed_port());

    let away = config(&pg_url(closed_port()), &nats_away);
    let run = Run::serve("pgaway", &away, &[], &[]);
    assert!(!run.success && run.stderr.contains("store.url"), "{}", run.stderr);

    let wrong = format!(
        "host=127.0.0.1 port={} user={ROLE} password='{PG_KV_PASSWORD}' dbname={ROLE}",
        pg.port
    );
    let run = Run::serve("pgrefuses", &config(&wrong, &nats_away), &[], &[]);
    assert!(!run.success && run.stderr.contains("store.url"), "{}", run.stderr);
    assert!(run.stderr.contains("password authentication failed"), "{}", run.stderr);

    // (the store opens with the right password; then NATS is not there)
    let port = closed_port();
    for bus in [
        format!("nats://gateway:{NATS_PASSWORD}@127.0.0.1:{port}"),
        format!("nats://{NATS_TOKEN}@127.0.0.1:{port}"),
    ] {
        let run = Run::serve("natsaway", &config(&pg_url(pg.port), &bus), &[], &[]);
        assert!(!run.success && run.stderr.contains("bus.url"), "{}", run.stderr);
    }
}

/// A gateway (the real binary, logging at debug) on the test's own NATS and PostgreSQL, with
/// the store's password in store.url and an admin token in use: when NATS goes away and then
/// PostgreSQL stops, `/healthz` names `bus.url` and `store.url` and shows neither value, and
/// neither it, `/metrics` nor the log shows a secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_whose_bus_and_store_fail_shows_no_secret() {
    let pg = tokio::task::block_in_place(|| postgres_with_a_password("secretsgw"));
    let mut nats = OwnNats::start(temp_dir("secretsnats"));
    let sim = start_sim(1.0, 41).await;
    let mut c = config(&pg_url(pg.port), &nats.url());
    c.sources = vec![external_sim_source(&sim)];
    c.cluster = ClusterConfig {
        enabled: true,
        warmup_s: 1,
        tick_ms: 200,
        status_interval_ms: 200,
        lease_s: 2,
        depth_stream_mb: 16,
        kinds: vec![TaskKind::Kline],
        ..ClusterConfig::default()
    };
    let log = temp_dir("secretsgwlog").join("gateway.log");
    let file = std::fs::File::create(&log).unwrap();
    let gateway = ChildServer::start_logging(&c, "debug", Stdio::from(file)).await;
    let (status, body) = http(
        gateway.addr,
        "GET",
        "/api/v1/ops/sources",
        &[("Authorization", &format!("Bearer {ADMIN_TOKEN}"))],
        "",
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{body}");

    let values =
        [format!("127.0.0.1:{}", nats.port), format!("127.0.0.1:{}", pg.port), ROLE.to_string()];
    let check = |what: &str, body: &str| {
        assert_no_secret(what, body);
        for value in &values {
            assert!(!body.contains(value.as_str()), "{what} shows {value}: {body}");
        }
    };
    nats.kill9();
    let body = eventually("/healthz to name bus.url", || async {
        let (status, body) = http_get(gateway.addr, "/healthz").await.ok()?;
        (status == 503 && body.contains("bus.url")).then_some(body)
    })
    .await;
    check("/healthz with NATS away", &body);
    let (_, metrics) = http_get(gateway.addr, "/metrics").await.unwrap();
    check("/metrics with NATS away", &metrics);

    tokio::task::block_in_place(|| pg.down("immediate"));
    let body = eventually("/healthz to name store.url", || async {
        let (status, body) = http_get(gateway.addr, "/healthz").await.ok()?;
        (status == 503 && body.contains("store.url")).then_some(body)
    })
    .await;
    check("/healthz with the store away", &body);
    let (_, metrics) = http_get(gateway.addr, "/metrics").await.unwrap();
    check("/metrics with the store away", &metrics);

    gateway.kill9();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("DEBUG"), "the gateway logged at debug");
    assert!(text.contains("store.url") && text.contains("bus on NATS"), "its log: {text}");
    assert_no_secret("the gateway's log (RUST_LOG=debug)", &text);
    tokio::task::block_in_place(|| drop(pg));
}
