//! The bus as a trust boundary: a cluster on a NATS server of the test's own that takes only
//! TLS with client certificates and one user per role, configured by the documented file
//! (docs/nats/millrace.conf, with the test's prefix, port, store and certificates put in);
//! what a role's credentials may not do there; every way to authenticate; and every refusal —
//! a wrong credential of each kind, a server without TLS, a certificate either side does not
//! trust — a start-up error of the real binary naming its key, for every role.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::StreamExt as _;
use server::cluster::{Role, Subjects};
use server::config::Config;
use server::config::{BusConfig, BusKind};
use shared::cluster::TaskKind;
use shared::protocol::BookHealth;
use testkit::nats::{DocumentedTls, NatsServer, Operator};
use testkit::tls::{CertFiles, TestCa};
use testkit::*;

use crate::cluster_workers::{
    cluster_config, fully_assigned, stored_grows, watch_closed, BTC, ETH,
};

const ROLES: [&str; 3] = ["supervisor", "worker", "gateway"];

/// A password of this run for `role` (the server reads it from its environment).
fn password(role: &str) -> String {
    format!("{role}-pw-{}-7f3a91", std::process::id())
}

/// A NATS server on the documented configuration: its CA, which signs the server's and the
/// roles' certificates.
struct DocumentedNats {
    nats: NatsServer,
    ca: TestCa,
    prefix: String,
    dir: PathBuf,
    /// Each role's client certificate.
    certs: BTreeMap<&'static str, CertFiles>,
}

impl DocumentedNats {
    fn start(tag: &str) -> DocumentedNats {
        let dir = temp_dir(tag);
        let ca = TestCa::new(&dir.join("tls"));
        let server = ca.server("nats-server", &["localhost", "127.0.0.1"]);
        let tls = DocumentedTls { cert: server.cert, key: server.key, ca: ca.ca_file() };
        let prefix = test_prefix(tag);
        let passwords: Vec<(&str, String)> = ROLES.iter().map(|r| (*r, password(r))).collect();
        let passwords: Vec<(&str, &str)> =
            passwords.iter().map(|(r, p)| (*r, p.as_str())).collect();
        let nats = NatsServer::start_documented(&dir.join("nats"), &prefix, &tls, &passwords);
        let certs = ROLES.iter().map(|r| (*r, ca.client(r))).collect();
        DocumentedNats { nats, ca, prefix, dir, certs }
    }

    /// `[bus]` of `role` (its user, password and client certificate), TLS required.
    fn bus(&self, role: &str) -> BusConfig {
        let cert = self.certs[role].clone();
        BusConfig {
            kind: BusKind::Nats,
            url: self.nats.url(),
            prefix: self.prefix.clone(),
            user: Some(role.into()),
            password: Some(password(role)),
            ca_file: Some(self.ca.ca_file()),
            cert_file: Some(cert.cert),
            key_file: Some(cert.key),
            require_tls: true,
            ..BusConfig::default()
        }
    }

    /// A connection as `role` through millrace's own `connect`.
    async fn connect(&self, role: Role) -> async_nats::Client {
        server::cluster::connect(&self.bus(role.name()), role, "test")
            .await
            .unwrap_or_else(|e| panic!("{role:?}: {}", server::error::report(&e)))
    }

    /// A connection with `role`'s credentials that reports the server's errors on `errors`.
    async fn watched(
        &self,
        role: &str,
    ) -> (async_nats::Client, tokio::sync::mpsc::UnboundedReceiver<String>) {
        let bus = self.bus(role);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let client = async_nats::ConnectOptions::new()
            .user_and_password(role.into(), password(role))
            .add_root_certificates(self.ca.ca_file())
            .add_client_certificate(bus.cert_file.unwrap(), bus.key_file.unwrap())
            .require_tls(true)
            .event_callback(move |event| {
                let tx = tx.clone();
                async move {
                    if let async_nats::Event::ServerError(e) = event {
                        let _ = tx.send(e.to_string());
                    }
                }
            })
            .connect(self.nats.url())
            .await
            .unwrap();
        (client, rx)
    }
}

/// The cluster of one test on a [`DocumentedNats`]: the simulator and the gateway in this
/// process, the supervisor and workers as child processes, each with its role's credentials.
struct AuthCluster {
    sim: sim::SimHandle,
    pg: PgDb,
    gateway: TestServer,
    config: Config,
    roles: BTreeMap<String, ChildRole>,
    dir: PathBuf,
}

impl AuthCluster {
    async fn start(nats: &DocumentedNats, configure: impl FnOnce(&mut Config)) -> AuthCluster {
        let sim = start_sim(60.0, 71).await;
        let pg = tokio::task::block_in_place(|| PgDb::fresh("clusterauth"));
        let mut config = cluster_config(&sim, &pg, &nats.prefix, 2);
        configure(&mut config);
        let mut gateway = config.clone();
        gateway.bus = nats.bus("gateway");
        let gateway = TestServer::start(gateway).await;
        AuthCluster { sim, pg, gateway, config, roles: BTreeMap::new(), dir: nats.dir.clone() }
    }

    /// `millrace <args>` as `role` (its `[bus]` credentials), named `name`.
    fn role(&mut self, nats: &DocumentedNats, role: &str, name: &str, args: &[&str]) {
        let mut config = self.config.clone();
        config.bus = nats.bus(role);
        let child = ChildRole::start(name, args, &config, &self.dir, "info");
        self.roles.insert(name.to_string(), child);
    }

    async fn stop(self) -> BTreeMap<String, String> {
        let logs = self.roles.iter().map(|(name, r)| (name.clone(), r.log_text())).collect();
        drop(self.roles);
        self.gateway.stop().await;
        self.sim.shutdown();
        tokio::task::block_in_place(|| drop(self.pg));
        logs
    }
}

/// A real cluster — a supervisor, two workers and a gateway, each with its own user, password
/// and client certificate — runs on the documented server: candles are stored and pushed to a
/// browser, a book syncs through the cluster, and the server logged no permission violation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_runs_on_the_documented_server_with_tls_and_a_user_per_role() {
    let nats = DocumentedNats::start("clusterauth");
    let mut c = AuthCluster::start(&nats, |config| {
        config.cluster.instruments = vec![BTC.parse().unwrap(), ETH.parse().unwrap()];
        config.cluster.kinds = vec![TaskKind::Kline, TaskKind::Depth];
        // the tick-by-tick books on w1, asked for by the gateway
        config.l3.host = "worker:w1".into();
    })
    .await;
    // a leader and a standby (which reads the lease's holder)
    for s in ["sup1", "sup2"] {
        c.role(&nats, "supervisor", s, &["supervisor", "--id", s]);
    }
    for w in ["w1", "w2"] {
        c.role(&nats, "worker", w, &["worker", "--id", w, "--max-load", "10"]);
    }
    let mut ws = c.gateway.ws().await;
    request(&mut ws, "SUBSCRIBE", &[format!("kline@{BTC}:1m").as_str()], 1).await;
    let (seen, watcher) = watch_closed(ws);
    fully_assigned(&c.gateway, 2, &[]).await;
    stored_grows(&c.pg, "sim:spot:BTC/USDT:1m", 0, 3).await;
    // a book, synced from the workers' diffs and snapshots
    let _lease = c.gateway.app.subscribe_depth(&BTC.parse().unwrap()).unwrap();
    let s =
        crate::depth_faults::matches_sim(&c.gateway, &c.sim, BTC, "BTCUSDT", BookHealth::Synced)
            .await;
    assert!(s.stream.contains("diffs"), "fed by the cluster: {}", s.stream);
    eventually("closed candles pushed to the browser", || async {
        (seen.lock().unwrap().len() >= 2).then_some(())
    })
    .await;
    // the tick-by-tick engine's report, asked of w1 over NATS
    eventually("w1's tick-by-tick books through the gateway", || async {
        let (status, body) = c.gateway.get("/api/v1/ops/shards").await;
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        (status == 200 && v["engine"]["symbols"].as_array()?.len() >= 40).then_some(())
    })
    .await;
    watcher.abort();
    let logs = c.stop().await;
    let violations = nats.nats.violations();
    assert!(violations.is_empty(), "permission violations:\n{}", violations.join("\n"));
    for (name, log) in logs {
        assert!(!log.contains("NATS server refused"), "{name}:\n{log}");
    }
}

/// Waits for the next server error the client reported; it must be a permission violation
/// naming `subject`.
async fn refused_to(
    errors: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    what: &str,
    subject: &str,
) {
    let e = tokio::time::timeout(Duration::from_secs(5), errors.recv())
        .await
        .unwrap_or_else(|_| panic!("no permission violation for {what} {subject}"))
        .unwrap();
    let e = e.to_lowercase();
    assert!(
        e.contains(&format!("permissions violation for {what}"))
            && e.contains(&subject.to_lowercase()),
        "{subject}: {e}"
    );
}

/// Nothing arrives on `sub` for a moment.
async fn silent(sub: &mut async_nats::Subscriber, what: &str) {
    let got = tokio::time::timeout(Duration::from_millis(300), sub.next()).await;
    assert!(got.is_err(), "{what}: {:?}", got.map(|m| m.map(|m| m.payload)));
}

/// A worker's credentials — a worker taken over — cannot send what the gateways and the
/// supervisors send (demand, report and tick-by-tick requests, instruction sets), cannot touch
/// the leader lease or the JetStream streams' configuration, and cannot read what is not for
/// workers: the server refuses each (the client is told, the server logs it under the user
/// `worker`) and the listeners see only what the rightful senders sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_credentials_cannot_send_what_the_other_roles_send() {
    let nats = DocumentedNats::start("clusterrogue");
    let s = Subjects::new(&nats.prefix);
    let supervisor = nats.connect(Role::Supervisor).await;
    let gateway = nats.connect(Role::Gateway).await;
    let worker = nats.connect(Role::Worker).await;
    let (rogue, mut errors) = nats.watched("worker").await;

    // Subjects of the gateways and the supervisors: (subject, its sender, its listener).
    let l3 = server::cluster::l3::request_subject(&nats.prefix);
    let cases = [
        (s.demand(), &gateway, &supervisor),
        (s.report(), &gateway, &supervisor),
        (l3, &gateway, &worker),
        (s.instructions("w1"), &supervisor, &worker),
    ];
    for (subject, sender, listener) in cases {
        let mut sub = listener.subscribe(subject.clone()).await.unwrap();
        listener.flush().await.unwrap();
        rogue.publish(subject.clone(), "from a rogue worker".into()).await.unwrap();
        rogue.flush().await.unwrap();
        refused_to(&mut errors, "publish to", &subject).await;
        sender.publish(subject.clone(), "rightful".into()).await.unwrap();
        sender.flush().await.unwrap();
        let m = tokio::time::timeout(Duration::from_secs(5), sub.next()).await.unwrap().unwrap();
        assert_eq!(&m.payload[..], b"rightful", "{subject}");
        silent(&mut sub, &subject).await;
    }

    // The leader lease: a supervisor holds it; the rogue cannot write it, purge or delete its
    // bucket, nor delete the candle stream.
    let js = async_nats::jetstream::new(supervisor.clone());
    let bucket = s.lease_bucket();
    let kv = server::cluster::kv_bucket(&js, &bucket, Duration::from_secs(600)).await.unwrap();
    let revision = kv.create("leader", "sup1".into()).await.unwrap();
    for subject in [
        format!("$KV.{bucket}.leader"),
        format!("$JS.API.STREAM.PURGE.KV_{bucket}"),
        format!("$JS.API.STREAM.DELETE.KV_{bucket}"),
        format!("$JS.API.STREAM.DELETE.{}", s.candle_stream()),
        format!("$JS.API.STREAM.UPDATE.{}", s.depth_stream()),
    ] {
        rogue.publish(subject.clone(), "{}".into()).await.unwrap();
        rogue.flush().await.unwrap();
        refused_to(&mut errors, "publish to", &subject).await;
    }
    let entry = kv.entry("leader").await.unwrap().expect("the lease is still there");
    assert_eq!((&entry.value[..], entry.revision), (&b"sup1"[..], revision));

    // Reading what is not for workers: the gateways' demand, the workers' statuses, and the
    // replies to the others' requests (a supervisor answers a gateway's report request).
    let mut reports = supervisor.subscribe(s.report()).await.unwrap();
    supervisor.flush().await.unwrap();
    let answering = {
        let supervisor = supervisor.clone();
        tokio::spawn(async move {
            while let Some(m) = reports.next().await {
                if let Some(reply) = m.reply {
                    supervisor.publish(reply, "report".into()).await.unwrap();
                    supervisor.flush().await.unwrap();
                }
            }
        })
    };
    for subject in [s.demand(), s.status(), "_INBOX.>".to_string()] {
        let mut sub = rogue.subscribe(subject.clone()).await.unwrap();
        rogue.flush().await.unwrap();
        refused_to(&mut errors, "subscription to", &subject).await;
        gateway.publish(s.demand(), "demand".into()).await.unwrap();
        worker.publish(s.status(), "status".into()).await.unwrap();
        let reply = gateway.request(s.report(), "{}".into()).await.unwrap();
        assert_eq!(&reply.payload[..], b"report");
        silent(&mut sub, &subject).await;
    }
    answering.abort();

    // The server logged each refusal, all of them the worker's.
    let violations = nats.nats.violations();
    assert!(violations.len() >= 12, "{}", violations.join("\n"));
    assert!(violations.iter().all(|v| v.contains("User \"worker\"")), "{}", violations.join("\n"));
}

/// A role started with another role's credentials (a supervisor as the user `worker`) stops
/// at start, and its log says which permission the server refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_with_another_roles_credentials_logs_what_the_server_refused() {
    let nats = DocumentedNats::start("clusterwrongrole");
    let mut config = test_config(vec![]);
    config.bus = nats.bus("worker");
    let mut sup =
        ChildRole::start("sup", &["supervisor", "--id", "sup"], &config, &nats.dir, "info");
    let status = sup.exited(Duration::from_secs(30)).await.expect("the supervisor stops");
    assert!(!status.success());
    let log = sup.log_text();
    // (a worker may read the lease bucket, so what is refused first is the supervisor's own
    // inbox, or the lease's creation)
    let bucket = format!("KV_{}", Subjects::new(&nats.prefix).lease_bucket());
    let inbox =
        format!("Permissions Violation for Subscription to \"_INBOX.{}.supervisor.", nats.prefix);
    let create = format!("Permissions Violation for Publish to \"$JS.API.STREAM.CREATE.{bucket}\"");
    assert!(
        log.contains("NATS server refused a request of this process")
            && (log.contains(&inbox) || log.contains(&create)),
        "{log}"
    );
}

/// A connection through millrace's `connect` with `bus` works: a message goes round.
async fn round_trip(bus: &BusConfig) {
    let client = server::cluster::connect(bus, Role::Worker, "test")
        .await
        .unwrap_or_else(|e| panic!("{bus:?}: {}", server::error::report(&e)));
    let mut sub = client.subscribe("roundtrip").await.unwrap();
    client.flush().await.unwrap();
    client.publish("roundtrip", "hello".into()).await.unwrap();
    let m = tokio::time::timeout(Duration::from_secs(5), sub.next()).await.unwrap().unwrap();
    assert_eq!(&m.payload[..], b"hello");
}

/// Each role of the real binary — `supervisor`, `worker`, and `serve` as a gateway (its store
/// on `pg`) — started with `bus`, stops at once with an error naming `key`, and shows none of
/// `secrets`.
async fn every_role_refused(bus: &BusConfig, pg: &PgDb, dir: &Path, key: &str, secrets: &[&str]) {
    let mut config = test_config(vec![]);
    config.bus = bus.clone();
    config.store = server::config::StoreConfig {
        kind: server::config::StoreKind::Postgres,
        url: Some(pg.url().into()),
        ..Default::default()
    };
    config.cluster.enabled = true;
    let port = testkit::nats::free_port().to_string();
    let roles: [(&str, Vec<&str>); 3] = [
        ("supervisor", vec!["supervisor", "--id", "s1"]),
        ("worker", vec!["worker", "--id", "w1"]),
        ("gateway", vec!["serve", "--addr"]),
    ];
    for (name, mut args) in roles {
        let addr = format!("127.0.0.1:{port}");
        if name == "gateway" {
            args.push(&addr);
        }
        let mut role = ChildRole::start(name, &args, &config, dir, "warn");
        let status = role.exited(Duration::from_secs(15)).await;
        let log = role.log_text();
        assert!(status.is_some_and(|s| !s.success()), "{name} ({key}): {status:?}\n{log}");
        let error = log.lines().find(|l| l.starts_with("millrace: error:")).unwrap_or_default();
        eprintln!("{name}: {error}");
        assert!(error.contains(&format!("configuration key `{key}`")), "{name} ({key}):\n{log}");
        for secret in secrets {
            assert!(!log.contains(secret), "{name} ({key}) shows a secret:\n{log}");
        }
    }
}

/// Each way to authenticate connects — user and password, token, nkey seed (in the
/// configuration or a file), a credentials file (a JWT of an operator-mode server) — and a wrong
/// credential of each kind, or none where one is needed, stops every role at start with an
/// error naming its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_way_to_authenticate_connects_and_a_wrong_credential_names_its_key() {
    let dir = temp_dir("natsauth");
    let pg = tokio::task::block_in_place(|| PgDb::fresh("natsauth"));
    let nats_bus = |url: String| BusConfig {
        kind: BusKind::Nats,
        url,
        prefix: test_prefix("natsauth"),
        ..BusConfig::default()
    };

    // user and password
    let password = "pw-4f1c-right";
    let nats = NatsServer::start(&dir.join("users"), |port| {
        format!(
            "host: 127.0.0.1\nport: {port}\n\
             authorization {{ users: [ {{ user: alice, password: \"{password}\" }} ] }}\n"
        )
    });
    let user = |name: &str, pw: &str| BusConfig {
        user: Some(name.into()),
        password: Some(pw.into()),
        ..nats_bus(nats.url())
    };
    round_trip(&user("alice", password)).await;
    let wrong = "pw-4f1c-WRONG";
    every_role_refused(&user("alice", wrong), &pg, &dir, "bus.password", &[wrong]).await;
    every_role_refused(&user("mallory", password), &pg, &dir, "bus.password", &[password]).await;
    every_role_refused(&nats_bus(nats.url()), &pg, &dir, "bus.user", &[]).await;
    drop(nats);

    // token
    let token = "tok-88d2-right";
    let nats = NatsServer::start(&dir.join("token"), |port| {
        format!("host: 127.0.0.1\nport: {port}\nauthorization {{ token: \"{token}\" }}\n")
    });
    let with_token = |t: &str| BusConfig { token: Some(t.into()), ..nats_bus(nats.url()) };
    round_trip(&with_token(token)).await;
    let wrong = "tok-88d2-WRONG";
    every_role_refused(&with_token(wrong), &pg, &dir, "bus.token", &[wrong]).await;
    drop(nats);

    // nkey: the seed in the configuration, or in a file
    let alice = nkeys::KeyPair::new_user();
    let nats = NatsServer::start(&dir.join("nkey"), |port| {
        format!(
            "host: 127.0.0.1\nport: {port}\nauthorization {{ users: [ {{ nkey: {} }} ] }}\n",
            alice.public_key()
        )
    });
    let seed = alice.seed().unwrap();
    round_trip(&BusConfig { nkey_seed: Some(seed.clone()), ..nats_bus(nats.url()) }).await;
    let seed_file = dir.join("alice.nk");
    std::fs::write(&seed_file, format!("{seed}\n")).unwrap();
    round_trip(&BusConfig { nkey_seed_file: Some(seed_file), ..nats_bus(nats.url()) }).await;
    let mallory = nkeys::KeyPair::new_user().seed().unwrap();
    let bus = BusConfig { nkey_seed: Some(mallory.clone()), ..nats_bus(nats.url()) };
    every_role_refused(&bus, &pg, &dir, "bus.nkey_seed", &[&mallory]).await;
    let mallory_file = dir.join("mallory.nk");
    std::fs::write(&mallory_file, &mallory).unwrap();
    let bus = BusConfig { nkey_seed_file: Some(mallory_file), ..nats_bus(nats.url()) };
    every_role_refused(&bus, &pg, &dir, "bus.nkey_seed_file", &[&mallory]).await;
    drop(nats);

    // a credentials file: a user JWT signed by the account of the server's operator
    let operator = Operator::new();
    let nats = NatsServer::start(&dir.join("operator"), |port| operator.server_config(port));
    let creds = dir.join("alice.creds");
    std::fs::write(&creds, operator.user_creds("alice")).unwrap();
    round_trip(&BusConfig { credentials_file: Some(creds), ..nats_bus(nats.url()) }).await;
    let stranger = dir.join("stranger.creds");
    std::fs::write(&stranger, Operator::stranger_creds("mallory")).unwrap();
    let bus = BusConfig { credentials_file: Some(stranger), ..nats_bus(nats.url()) };
    every_role_refused(&bus, &pg, &dir, "bus.credentials_file", &[]).await;
    drop(nats);
    tokio::task::block_in_place(|| drop(pg));
}

/// TLS: a server that does not speak it while `require_tls` (or a CA file) demands it; a
/// client certificate from an authority the server does not trust, or none where the server
/// asks for one; a server certificate not signed by `ca_file` — each stops every role at start
/// with an error naming its key. With the right files it connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_refusals_name_their_key() {
    let dir = temp_dir("natstls");
    let pg = tokio::task::block_in_place(|| PgDb::fresh("natstls"));
    let bus = |url: String| BusConfig {
        kind: BusKind::Nats,
        url,
        prefix: test_prefix("natstls"),
        ..BusConfig::default()
    };

    let plain =
        NatsServer::start(&dir.join("plain"), |port| format!("host: 127.0.0.1\nport: {port}\n"));
    round_trip(&bus(plain.url())).await;
    let required = BusConfig { require_tls: true, ..bus(plain.url()) };
    every_role_refused(&required, &pg, &dir, "bus.require_tls", &[]).await;
    let ca = TestCa::new(&dir.join("ca"));
    let with_ca = BusConfig { ca_file: Some(ca.ca_file()), ..bus(plain.url()) };
    every_role_refused(&with_ca, &pg, &dir, "bus.ca_file", &[]).await;
    drop(plain);

    // mutual TLS: the server's certificate and the clients' from `ca`
    let server_cert = ca.server("nats-server", &["localhost", "127.0.0.1"]);
    let nats = NatsServer::start(&dir.join("mtls"), |port| {
        format!(
            "host: 127.0.0.1\nport: {port}\ntls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  \
             ca_file: \"{}\"\n  verify: true\n}}\n",
            server_cert.cert.display(),
            server_cert.key.display(),
            ca.ca_file().display()
        )
    });
    let client = ca.client("worker");
    let mtls = |ca_file: PathBuf, cert: Option<&CertFiles>| BusConfig {
        ca_file: Some(ca_file),
        cert_file: cert.map(|c| c.cert.clone()),
        key_file: cert.map(|c| c.key.clone()),
        ..bus(nats.url())
    };
    round_trip(&mtls(ca.ca_file(), Some(&client))).await;
    let other = TestCa::new(&dir.join("other-ca"));
    let stranger = other.client("worker");
    every_role_refused(&mtls(ca.ca_file(), Some(&stranger)), &pg, &dir, "bus.cert_file", &[]).await;
    every_role_refused(&mtls(ca.ca_file(), None), &pg, &dir, "bus.cert_file", &[]).await;
    every_role_refused(&mtls(other.ca_file(), Some(&client)), &pg, &dir, "bus.ca_file", &[]).await;
    drop(nats);
    tokio::task::block_in_place(|| drop(pg));
}
