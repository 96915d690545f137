//! Helpers of the integration tests of the service and the load tools: a real millrace server on
//! port 0 (in this
//! process, or the `millrace` binary as a child process), a real simulator, and small HTTP and
//! WebSocket clients.

pub mod nats;
pub mod tls;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use server::app::{App, Backends};
use server::config::{Config, SourceConfig, SourceKind};
use server::http::{serve_app, ServeConfig};
use shared::protocol::{Reply, ServerFrame};
use sim::{Sim, SimConfig, SimHandle};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::Message;

pub type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>;

/// Longest any single expected event may take.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// A fresh directory under the system temp dir.
pub fn temp_dir(tag: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("millrace-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A static directory with a stub index.html (these tests do not load the dashboard).
pub fn static_dir() -> PathBuf {
    let dir = temp_dir("static");
    std::fs::write(dir.join("index.html"), "<!doctype html><title>millrace test</title>").unwrap();
    dir
}

/// A configuration for tests: data under a fresh temp dir, no pinned (candle or depth) jobs, no
/// backfill, fast
/// reconnects, and the given source(s).
pub fn test_config(sources: Vec<SourceConfig>) -> Config {
    let mut c = Config::default();
    c.server.data_dir = temp_dir("data");
    c.server.static_dir = Some(static_dir());
    c.server.heartbeat_ms = 100;
    c.ingest.pinned = vec![];
    c.depth.pinned = vec![];
    c.ingest.reconnect_base_ms = 50;
    c.ingest.reconnect_cap_ms = 500;
    c.ingest.flush_ms = 100;
    c.ingest.stall_timeout_ms = 3000;
    c.backfill = vec![];
    c.sources = sources;
    c
}

/// A configuration in which every report has something in it: the embedded simulator at 60x, a
/// pinned candle job (`sim:spot:BTC/USDT`), a pinned depth job (`sim:spot:ETH/USDT`) and a
/// one-day backfill of `sim:spot:BTC/USDT:1m`.
pub fn busy_config() -> Config {
    let mut config = test_config(vec![embedded_sim_source(60.0)]);
    config.ingest.pinned = vec!["sim:spot:BTC/USDT".into()];
    config.depth.pinned = vec!["sim:spot:ETH/USDT".into()];
    config.backfill = vec![server::config::BackfillTaskConfig {
        series: "sim:spot:BTC/USDT:1m".into(),
        retention_days: 1,
        ..Default::default()
    }];
    config
}

/// A `sim` source pointing at a simulator running elsewhere (so it outlives server restarts).
pub fn external_sim_source(sim: &SimHandle) -> SourceConfig {
    SourceConfig {
        name: "sim".into(),
        kind: SourceKind::Sim,
        rest_base: Some(sim.rest_base()),
        ws_base: Some(sim.ws_base()),
        ..SourceConfig::default()
    }
}

/// A `sim` source with its own embedded simulator at `speed`.
pub fn embedded_sim_source(speed: f64) -> SourceConfig {
    SourceConfig { speed, ..SourceConfig::default() }
}

/// The control token of [`start_sim`]'s simulators: a server that asks them for a hot spot (its
/// admin token goes with the request) needs it as its `server.admin_token`.
pub const SIM_CONTROL_TOKEN: &str = "testkit-sim-control-token";

/// A simulator on port 0 in this process (control token [`SIM_CONTROL_TOKEN`]).
pub async fn start_sim(speed: f64, seed: u64) -> SimHandle {
    let config = SimConfig {
        speed,
        seed,
        control_token: Some(SIM_CONTROL_TOKEN.into()),
        ..SimConfig::default()
    };
    Sim::start(config, "127.0.0.1:0".parse().unwrap()).await.unwrap()
}

/// A millrace server in this process; stops (gracefully) when [`TestServer::stop`] is awaited or
/// it is dropped.
pub struct TestServer {
    pub addr: SocketAddr,
    pub config: Config,
    /// The running service (its bus, store, supervisor), for tests that look inside.
    pub app: std::sync::Arc<App>,
    stop: Option<oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<Result<(), server::http::ServeError>>>,
}

impl TestServer {
    /// The server `config` describes, as `millrace serve` starts it (one process, on the NATS
    /// bus, or a cluster's gateway).
    pub async fn start(config: Config) -> TestServer {
        Self::start_ready_when(config, None, false).await
    }

    /// Like [`TestServer::start`], ready once `/healthz` answers at all: for a test of a
    /// service that is degraded from the start.
    pub async fn start_degraded(config: Config) -> TestServer {
        Self::start_ready_when(config, None, true).await
    }

    /// A server on the given bus and store (a test's own implementations).
    pub async fn start_with(config: Config, backends: Backends) -> TestServer {
        Self::start_ready_when(config, Some(backends), false).await
    }

    /// A server listening on `listen` (port 0: any free port), e.g. `[::]:0` for a dual-stack
    /// listener or `127.0.0.3:0`. Its `addr` is where clients reach it (loopback when `listen`
    /// is unspecified).
    pub async fn start_on(config: Config, listen: SocketAddr) -> TestServer {
        Self::start_listening(config, None, false, listen).await
    }

    async fn start_ready_when(
        config: Config,
        backends: Option<Backends>,
        any_health: bool,
    ) -> TestServer {
        Self::start_listening(config, backends, any_health, "127.0.0.1:0".parse().unwrap()).await
    }

    async fn start_listening(
        config: Config,
        backends: Option<Backends>,
        any_health: bool,
        listen: SocketAddr,
    ) -> TestServer {
        // Logs of the server under test (RUST_LOG=info to see them with --nocapture).
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "warn".into()),
            )
            .with_test_writer()
            .try_init();
        let listener = TcpListener::bind(listen).await.unwrap();
        let mut addr = listener.local_addr().unwrap();
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        let serve_config = ServeConfig::new(config.clone()).unwrap();
        let app = match backends {
            Some(b) => App::start_with(config.clone(), b).await.unwrap(),
            None => server::cluster::gateway::start(config.clone()).await.unwrap(),
        };
        let app = std::sync::Arc::new(app);
        let (stop, stopped) = oneshot::channel::<()>();
        let done = tokio::spawn(serve_app(listener, serve_config, app.clone(), async move {
            let _ = stopped.await;
        }));
        let server = TestServer { addr, config, app, stop: Some(stop), done: Some(done) };
        server.wait_ready(any_health).await;
        server
    }

    async fn wait_ready(&self, any_health: bool) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            match http_get(self.addr, "/healthz").await {
                Ok((200, _)) => return,
                Ok((503, _)) if any_health => return,
                _ => {}
            }
            assert!(Instant::now() < deadline, "server did not come up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Graceful stop: waits until the server (and its ingest jobs' final flush) is done.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(d) = self.done.take() {
            d.await.unwrap().unwrap();
        }
    }

    pub fn db_path(&self) -> PathBuf {
        self.config.db_path()
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        http_get(self.addr, path).await.unwrap()
    }

    pub async fn get_json(&self, path: &str) -> serde_json::Value {
        let (status, body) = self.get(path).await;
        assert_eq!(status, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap()
    }

    pub async fn ws(&self) -> Ws {
        let (ws, _) =
            tokio_tungstenite::connect_async(format!("ws://{}/ws", self.addr)).await.unwrap();
        ws
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// A minimal HTTP/1.1 request with a body; returns (status, body).
pub async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = TcpStream::connect(addr).await?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    tcp.write_all(req.as_bytes()).await?;
    let mut raw = Vec::new();
    tokio::time::timeout(PATIENCE, tcp.read_to_end(&mut raw))
        .await
        .map_err(|_| std::io::Error::other("timeout"))??;
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) =
        raw.split_once("\r\n\r\n").ok_or_else(|| std::io::Error::other("no HTTP response"))?;
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((status, body))
}

pub async fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    http(addr, "GET", path, &[], "").await
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// Sends a request frame.
pub async fn send(ws: &mut Ws, text: &str) {
    ws.send(Message::Text(text.into())).await.unwrap();
}

/// The next protocol frame (skipping pings).
pub async fn next_frame(ws: &mut Ws) -> ServerFrame {
    loop {
        let msg = tokio::time::timeout(PATIENCE, ws.next())
            .await
            .expect("a frame in time")
            .expect("socket open")
            .expect("no socket error");
        match msg {
            Message::Text(text) => return serde_json::from_str(&text).expect("a protocol frame"),
            Message::Ping(_) | Message::Pong(_) => continue,
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// The reply to request `id`, skipping pushes that arrive first.
pub async fn reply(ws: &mut Ws, id: u64) -> Reply {
    loop {
        if let ServerFrame::Reply(r) = next_frame(ws).await {
            assert_eq!(r.id, id, "reply to another request: {r:?}");
            return r;
        }
    }
}

/// SUBSCRIBE / UNSUBSCRIBE and wait for the reply.
pub async fn request(ws: &mut Ws, method: &str, streams: &[&str], id: u64) -> Reply {
    let text = serde_json::json!({"method": method, "params": streams, "id": id}).to_string();
    send(ws, &text).await;
    reply(ws, id).await
}

/// Polls `f` until it returns `Some`, at most [`PATIENCE`].
pub async fn eventually<T, F, Fut>(what: &str, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    eventually_explained(what, String::new, f).await
}

/// [`eventually`], whose failure also says what `explain` finds then (the state that tells why).
pub async fn eventually_explained<T, F, Fut>(
    what: &str,
    explain: impl Fn() -> String,
    mut f: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what} {}", explain());
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// What a test waiting on `sim`'s `symbol` should say when it times out: how far the
/// simulator's engine lags its clock (more than a few ticks: its driver is not running, and the
/// market stands still) and the faults still pending.
pub fn sim_state(sim: &SimHandle, symbol: &str) -> String {
    format!(
        "(the simulator's {symbol} engine lags its clock by {:?} ms; pending faults: {:?})",
        sim.engine_lag_ms(symbol),
        sim.faults().plan().messages
    )
}

/// The `millrace` binary of this build: beside the running test's own directory
/// (`target/<profile>/millrace`); cargo builds it for the server's integration tests.
pub fn millrace_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>");
    dir.join(format!("millrace{}", std::env::consts::EXE_SUFFIX))
}

/// A `millrace serve` child process with a configuration file.
pub struct ChildServer {
    pub child: Child,
    pub addr: SocketAddr,
}

impl ChildServer {
    /// Writes `config` as TOML next to its data dir and starts the binary on a free port
    /// (`RUST_LOG=warn`, its log on this process' stderr).
    pub async fn start(config: &Config) -> ChildServer {
        ChildServer::start_logging(config, "warn", Stdio::inherit()).await
    }

    /// Like [`ChildServer::start`], with `RUST_LOG=rust_log` and the log written to `log`.
    pub async fn start_logging(config: &Config, rust_log: &str, log: Stdio) -> ChildServer {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let mut config = config.clone();
        config.server.addr = addr;
        let path = config.server.data_dir.join("millrace.toml");
        std::fs::create_dir_all(&config.server.data_dir).unwrap();
        std::fs::write(&path, toml::to_string(&config).unwrap()).unwrap();
        let child = Command::new(millrace_bin())
            .args(["serve", "--config"])
            .arg(&path)
            .env("RUST_LOG", rust_log)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let server = ChildServer { child, addr };
        let deadline = Instant::now() + PATIENCE;
        while http_get(addr, "/healthz").await.ok().map(|r| r.0) != Some(200) {
            assert!(Instant::now() < deadline, "child server did not come up");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        server
    }

    /// `kill -9`.
    pub fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM and wait for a clean exit.
    pub fn terminate(mut self) {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "millrace exited with {status}");
    }

    pub async fn get_json(&self, path: &str) -> serde_json::Value {
        let (status, body) = http_get(self.addr, path).await.unwrap();
        assert_eq!(status, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap()
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A cluster role (`millrace supervisor|worker …`) as a child process, its configuration
/// written as TOML into `dir`, its log into `dir/<name>.log`.
pub struct ChildRole {
    pub child: Child,
    pub name: String,
    pub log: PathBuf,
}

impl ChildRole {
    /// Starts `millrace <args…> --config <dir>/<name>.toml` with `RUST_LOG=rust_log`.
    pub fn start(name: &str, args: &[&str], config: &Config, dir: &Path, rust_log: &str) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, toml::to_string(config).unwrap()).unwrap();
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(millrace_bin())
            .args(args)
            .arg("--config")
            .arg(&path)
            .env("RUST_LOG", rust_log)
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap();
        ChildRole { child, name: name.to_string(), log }
    }

    /// `kill -9`.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, without waiting.
    pub fn sigterm(&self) {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    }

    /// Waits for the exit (at most `timeout`); its status, or `None` if it is still running.
    pub async fn exited(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ChildRole {
    /// Kills the role; in a failing test, first shows the end of its log (CI keeps no files).
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            let log = self.log_text();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(80)..];
            eprintln!(
                "----- {} (its last {} log lines) -----\n{}",
                self.name,
                tail.len(),
                tail.join("\n")
            );
        }
    }
}

/// Reads every stored candle of `series` (all of them, oldest first).
pub fn stored(db: &Path, series: &str) -> Vec<shared::candle::Candle> {
    use server::store::CandleStore as _;
    let store = server::store::sqlite::SqliteStore::open(db).unwrap();
    store.candles(&series.parse().unwrap(), Some(i64::MIN / 2), None, 10_000_000).unwrap()
}

/// The PostgreSQL server the tests use: `MILLRACE_TEST_PG` (a URL of its `postgres` database),
/// by default the local one (`scripts/services` starts it; `scripts/setup` gives a fresh
/// install's user `postgres` this password; trust auth ignores it).
pub fn pg_admin_url() -> String {
    std::env::var("MILLRACE_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres:postgres@127.0.0.1:5432/postgres".to_string())
}

/// A database of its own for one test, created fresh and dropped (with its connections) when
/// this is dropped, so test runs never collide.
pub struct PgDb {
    name: String,
    url: String,
    admin: String,
}

impl PgDb {
    /// Creates `millrace_<tag>_<pid>_<n>` on the tests' server ([`pg_admin_url`]).
    pub fn fresh(tag: &str) -> PgDb {
        PgDb::fresh_on(&pg_admin_url(), tag)
    }

    /// Creates `millrace_<tag>_<pid>_<n>` on the server of `admin` (a URL of a database there).
    pub fn fresh_on(admin: &str, tag: &str) -> PgDb {
        PgDb::create(admin, tag).unwrap_or_else(|e| panic!("{e:#} (run scripts/services)"))
    }

    /// [`PgDb::fresh_on`], saying why not instead of panicking (for the load tools). Blocking.
    pub fn create(admin: &str, tag: &str) -> anyhow::Result<PgDb> {
        use anyhow::Context as _;
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("millrace_{tag}_{}_{n}", std::process::id());
        let url = match admin.rfind('/') {
            Some(i) if admin[..i].contains("://") => format!("{}/{name}", &admin[..i]),
            _ => anyhow::bail!(
                "{:?} is not a postgres:// URL ending in /DATABASE",
                server::redact::redact(admin)
            ),
        };
        let mut client = postgres::Client::connect(admin, postgres::NoTls).with_context(|| {
            format!("cannot connect to PostgreSQL at {}", server::redact::redact(admin))
        })?;
        client
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .and_then(|()| client.batch_execute(&format!("CREATE DATABASE {name}")))
            .with_context(|| format!("cannot create the database {name}"))?;
        Ok(PgDb { name, url, admin: admin.to_string() })
    }

    /// The URL of this database.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A direct connection (to inspect or break things).
    pub fn client(&self) -> postgres::Client {
        postgres::Client::connect(&self.url, postgres::NoTls).unwrap()
    }
}

impl Drop for PgDb {
    fn drop(&mut self) {
        let drop_db = || {
            if let Ok(mut c) = postgres::Client::connect(&self.admin, postgres::NoTls) {
                let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
                let _ = c.batch_execute(&sql);
            }
        };
        // The sync client runs its own runtime: off the test's runtime threads.
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(drop_db)
            }
            Ok(_) => std::thread::scope(|s| {
                s.spawn(drop_db);
            }),
            Err(_) => drop_db(),
        }
    }
}

/// A PostgreSQL server of one test's own, to stop and start: `initdb` (trust auth) in `dir`, on a
/// free port of 127.0.0.1, its socket in `dir`. Run as the user `postgres` when the tests run as
/// root (PostgreSQL refuses root). The binaries come from Debian's `postgresql` package
/// (`scripts/setup` installs it).
pub struct OwnPostgres {
    pub port: u16,
    data: PathBuf,
    bin: PathBuf,
    root: bool,
}

impl OwnPostgres {
    pub fn start(dir: PathBuf) -> OwnPostgres {
        let pg = OwnPostgres::init(dir);
        pg.up();
        pg
    }

    /// [`OwnPostgres::start`] with TLS: `ssl = on` with a server certificate of `ca` for `names`
    /// (DNS names or IP addresses), `ca` trusted for client certificates (`cert` authentication),
    /// and `pg_hba.conf` of `hba`'s lines (e.g. `hostssl all all 127.0.0.1/32 trust`,
    /// `hostnossl all all 127.0.0.1/32 trust`) after one trusting the local socket
    /// ([`OwnPostgres::socket_client`]).
    pub fn start_tls(dir: PathBuf, ca: &tls::TestCa, names: &[&str], hba: &[&str]) -> OwnPostgres {
        let cert = ca.server("postgres-server", names);
        let pg = OwnPostgres::init(dir);
        let files = [
            (&cert.cert, pg.data.join("server.crt")),
            (&cert.key, pg.data.join("server.key")),
            (&ca.ca_file(), pg.data.join("root.crt")),
        ];
        for (from, to) in &files {
            std::fs::copy(from, to).unwrap();
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o600)).unwrap();
            if pg.root {
                pg.run_plain("chown", &["postgres", to.to_str().unwrap()]);
            }
        }
        let mut conf =
            std::fs::OpenOptions::new().append(true).open(pg.data.join("postgresql.conf")).unwrap();
        use std::io::Write as _;
        writeln!(
            conf,
            "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n\
             ssl_ca_file = 'root.crt'"
        )
        .unwrap();
        let mut lines = vec!["local all all trust"];
        lines.extend_from_slice(hba);
        std::fs::write(pg.data.join("pg_hba.conf"), lines.join("\n") + "\n").unwrap();
        pg.up();
        pg
    }

    /// A connection as `postgres` to its `postgres` database over its local socket (whatever
    /// `pg_hba.conf` says of TCP).
    pub fn socket_client(&self) -> postgres::Client {
        postgres::Client::connect(&self.socket_url("postgres"), postgres::NoTls).unwrap()
    }

    /// The `key=value` URL of database `db` as `postgres` over its local socket.
    pub fn socket_url(&self, db: &str) -> String {
        let dir = self.data.parent().unwrap().display();
        format!("host={dir} port={} user=postgres dbname={db}", self.port)
    }

    /// `initdb` in `dir`, not started.
    fn init(dir: PathBuf) -> OwnPostgres {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .ok()
            .and_then(|d| {
                let mut v: Vec<PathBuf> = d.flatten().map(|e| e.path().join("bin")).collect();
                v.sort();
                v.pop()
            })
            .filter(|b| b.join("initdb").exists())
            .expect("PostgreSQL's binaries in /usr/lib/postgresql/<version>/bin (scripts/setup)");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let root = running_as_root();
        std::fs::create_dir_all(&dir).unwrap();
        let data = dir.join("pgdata");
        let pg = OwnPostgres { port, data, bin, root };
        if root {
            pg.run_plain("chown", &["-R", "postgres", dir.to_str().unwrap()]);
        }
        pg.run("initdb", &["-A", "trust", "-U", "postgres", "-D", pg.data.to_str().unwrap()]);
        pg
    }

    /// The URL of its `postgres` database.
    pub fn admin_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts the server and waits until it accepts connections.
    pub fn up(&self) {
        let opts = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {}",
            self.port,
            self.data.parent().unwrap().display()
        );
        let log = self.data.parent().unwrap().join("postgres.log");
        self.run(
            "pg_ctl",
            &[
                "start",
                "-w",
                "-D",
                self.data.to_str().unwrap(),
                "-o",
                &opts,
                "-l",
                log.to_str().unwrap(),
            ],
        );
    }

    /// Stops it: `fast` (connections closed, a clean shutdown) or `immediate` (a crash; WAL
    /// recovery at the next start).
    pub fn down(&self, mode: &str) {
        self.run("pg_ctl", &["stop", "-w", "-m", mode, "-D", self.data.to_str().unwrap()]);
    }

    /// `tool` of PostgreSQL's binaries, as the user `postgres` when we are root.
    fn command(&self, tool: &str) -> Command {
        let exe = self.bin.join(tool);
        let mut c = if self.root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(exe);
            c
        } else {
            Command::new(exe)
        };
        c.stdout(Stdio::null());
        c
    }

    fn run(&self, tool: &str, args: &[&str]) {
        let status = self.command(tool).args(args).status();
        let status = status.unwrap_or_else(|e| panic!("{tool}: {e}"));
        assert!(status.success(), "{tool} {args:?}: {status}");
    }

    fn run_plain(&self, cmd: &str, args: &[&str]) {
        let status = Command::new(cmd).args(args).status().unwrap();
        assert!(status.success(), "{cmd} {args:?}: {status}");
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let data = self.data.to_str().unwrap_or_default().to_string();
        let _ =
            self.command("pg_ctl").args(["stop", "-w", "-m", "immediate", "-D", &data]).status();
    }
}

/// A NATS server of one test's own (JetStream on, file store in `dir`, no authentication) on a
/// free port of 127.0.0.1, to stop and start. `nats-server` comes from `scripts/setup`.
pub struct OwnNats {
    pub port: u16,
    dir: std::path::PathBuf,
    child: Option<std::process::Child>,
}

impl OwnNats {
    pub fn start(dir: std::path::PathBuf) -> OwnNats {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut n = OwnNats { port, dir, child: None };
        n.restart();
        n
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts it again (after [`OwnNats::kill9`]), on the same port and store.
    pub fn restart(&mut self) {
        let child = std::process::Command::new("nats-server")
            .args(["-js", "-a", "127.0.0.1", "-p", &self.port.to_string(), "-sd"])
            .arg(&self.dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("nats-server (scripts/setup installs it)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "nats-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `kill -9`.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for OwnNats {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Whether this process runs as root.
fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// A subject prefix of this test process's own for `tag` (`t{pid}_{tag}`), so runs never
/// collide on a shared NATS server and [`ClusterStreams`] can tell a dead run's streams.
pub fn test_prefix(tag: &str) -> String {
    format!("t{}_{tag}", std::process::id())
}

/// The JetStream streams of a test cluster's prefix, deleted when this is dropped, however the
/// test ends: the diff stream holds a memory reservation in the NATS server for as long as it
/// exists, and a shared server's reservations add up over runs until workers cannot start
/// ("insufficient memory resources"). Made, it first deletes what runs that are gone left
/// behind (streams of a test or bench prefix whose process no longer exists).
pub struct ClusterStreams {
    url: String,
    prefix: String,
}

impl ClusterStreams {
    pub fn new(url: &str, prefix: &str) -> Self {
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(|| on_own_runtime(sweep_dead_runs(url.to_string())));
        ClusterStreams { url: url.to_string(), prefix: prefix.to_string() }
    }
}

impl Drop for ClusterStreams {
    fn drop(&mut self) {
        let (url, prefix) = (self.url.clone(), self.prefix.clone());
        on_own_runtime(async move { remove_cluster_streams(&url, &prefix).await });
    }
}

/// Deletes the JetStream streams a cluster under `prefix` makes on the NATS server at `url`
/// (closed candles, diffs, the lease bucket), so a run leaves nothing on a shared server.
pub async fn remove_cluster_streams(url: &str, prefix: &str) {
    let Ok(client) = async_nats::connect(url).await else { return };
    let js = async_nats::jetstream::new(client);
    server::cluster::remove_streams(&js, &server::cluster::Subjects::new(prefix)).await;
}

/// Runs `work` to its end on a runtime of its own, on a thread of its own (callable from sync
/// code inside or outside a runtime, e.g. a `Drop`).
fn on_own_runtime(work: impl std::future::Future<Output = ()> + Send + 'static) {
    let _ = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build();
        if let Ok(rt) = rt {
            rt.block_on(work);
        }
    })
    .join();
}

/// Deletes the streams of test and bench prefixes whose process is gone: `t{pid}_…` (this
/// harness), `bench{pid}_…`, `e2e{pid}_…`, `fanout{pid}_…`, `load{pid}_…` (the persister bench
/// and the load tools, should one have been killed), and `t{tag}{pid}_…` of the cluster tests'
/// tags before they used [`test_prefix`] — each with its `KV_` bucket. Nothing else: a shared
/// NATS server may carry other clusters' streams.
async fn sweep_dead_runs(url: String) {
    const OLD_TAGS: [&str; 6] =
        ["clusterrestart", "clusterthree", "clusterbook", "clusterlead", "clusterfill", "cluster"];
    let Ok(client) = async_nats::connect(&url).await else { return };
    let js = async_nats::jetstream::new(client);
    let mut names = js.stream_names();
    let mut dead = Vec::new();
    while let Some(Ok(name)) = names.next().await {
        let bare = name.strip_prefix("KV_").unwrap_or(&name);
        let tool = ["bench", "e2e", "fanout", "load"].iter().find_map(|p| bare.strip_prefix(p));
        let rest = if let Some(r) = tool {
            r
        } else if let Some(r) = bare.strip_prefix('t') {
            OLD_TAGS.iter().find_map(|tag| r.strip_prefix(tag)).unwrap_or(r)
        } else {
            continue;
        };
        let pid: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if pid.is_empty() || !rest[pid.len()..].starts_with('_') {
            continue;
        }
        if !Path::new(&format!("/proc/{pid}")).exists() {
            dead.push(name);
        }
    }
    for name in dead {
        let _ = js.delete_stream(&name).await;
    }
}
