//! A NATS server of a test's own: `nats-server` with the configuration the test writes
//! (authentication, TLS, accounts, permissions), on a free port, its JetStream store and its log
//! in the test's directory; killed and its store deleted when dropped. And the keys and JWTs of
//! a server in operator mode ([`Operator`]).
//!
//! ```no_run
//! let dir = testkit::temp_dir("nats");
//! let nats = testkit::nats::NatsServer::start(&dir, |port| {
//!     format!("port: {port}\nauthorization {{ token: \"s3cret-token\" }}\n")
//! });
//! // nats.url(); nats.violations(): the permission violations the server logged
//! ```

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use nkeys::KeyPair;

/// A `nats-server` child process (see the module docs).
pub struct NatsServer {
    pub port: u16,
    /// Its JetStream store (`{dir}/jetstream`), deleted on drop.
    pub store_dir: PathBuf,
    log: PathBuf,
    child: Child,
}

/// A free TCP port on 127.0.0.1 (free when asked).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl NatsServer {
    /// Writes `config(port)` to `{dir}/nats.conf` and starts `nats-server -c` on it (its log
    /// into `{dir}/nats.log`); returns once the server is ready. The
    /// configuration should put JetStream's `store_dir` in [`NatsServer::store_dir_in`]`(dir)`.
    pub fn start(dir: &Path, config: impl FnOnce(u16) -> String) -> NatsServer {
        let port = free_port();
        NatsServer::spawn(dir, port, &config(port), &[])
    }

    /// Starts `nats-server` on the configuration `text` in `dir`, with `env` added to its
    /// environment, and waits until it is ready (a configuration it refuses fails the test with
    /// its log).
    fn spawn(dir: &Path, port: u16, text: &str, env: &[(String, String)]) -> NatsServer {
        std::fs::create_dir_all(dir).unwrap();
        let conf = dir.join("nats.conf");
        std::fs::write(&conf, text).unwrap();
        let log = dir.join("nats.log");
        let child = Command::new("nats-server")
            .arg("-c")
            .arg(&conf)
            .envs(env.iter().cloned())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("nats-server (scripts/setup installs it)");
        let mut server = NatsServer { port, store_dir: Self::store_dir_in(dir), log, child };
        let deadline = Instant::now() + Duration::from_secs(15);
        while !server.log_text().contains("Server is ready") {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("nats-server exited ({status}):\n{}", server.log_text());
            }
            assert!(Instant::now() < deadline, "nats-server not ready:\n{}", server.log_text());
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    /// Where a server started in `dir` keeps its JetStream store.
    pub fn store_dir_in(dir: &Path) -> PathBuf {
        dir.join("jetstream")
    }

    /// `nats://127.0.0.1:{port}` (TLS is negotiated when the server asks for it).
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The server's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The permission violations the server logged (`Publish Violation`, `Subscription
    /// Violation`, …), one line each.
    pub fn violations(&self) -> Vec<String> {
        self.log_text().lines().filter(|l| l.contains("Violation")).map(str::to_string).collect()
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.store_dir);
    }
}

/// The server configuration of docs/nats/millrace.conf, made for a test: `prefix` for
/// `millrace`, the port, the JetStream store and the TLS files replaced in its text (the
/// passwords come from the environment of the server: [`NatsServer::start_documented`]).
pub fn documented_config(prefix: &str, port: u16, store_dir: &Path, tls: &DocumentedTls) -> String {
    let text = std::fs::read_to_string(documented_config_path()).expect("docs/nats/millrace.conf");
    let replace = [
        ("port: 4222", format!("port: {port}")),
        ("host: 0.0.0.0", "host: 127.0.0.1".to_string()),
        ("/var/lib/nats/jetstream", store_dir.display().to_string()),
        ("/etc/nats/tls/server.pem", tls.cert.display().to_string()),
        ("/etc/nats/tls/server.key", tls.key.display().to_string()),
        ("/etc/nats/tls/ca.pem", tls.ca.display().to_string()),
        ("millrace.", format!("{prefix}.")),
        ("millrace_", format!("{prefix}_")),
    ];
    let mut out = text;
    for (from, to) in replace {
        assert!(out.contains(from), "docs/nats/millrace.conf no longer has {from:?}");
        out = out.replace(from, &to);
    }
    out
}

/// docs/nats/millrace.conf in this repository.
pub fn documented_config_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/nats/millrace.conf")
}

/// The server's TLS files for [`documented_config`].
pub struct DocumentedTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The authority that signs the clients' certificates (the server verifies them).
    pub ca: PathBuf,
}

impl NatsServer {
    /// The documented configuration ([`documented_config`]) under `prefix`, the roles' passwords
    /// (`MILLRACE_SUPERVISOR_PASSWORD`, `…_WORKER_…`, `…_GATEWAY_…`, which the file reads from the
    /// environment) given as `(role, password)`.
    pub fn start_documented(
        dir: &Path,
        prefix: &str,
        tls: &DocumentedTls,
        passwords: &[(&str, &str)],
    ) -> NatsServer {
        let port = free_port();
        let text = documented_config(prefix, port, &Self::store_dir_in(dir), tls);
        let env: Vec<(String, String)> = passwords
            .iter()
            .map(|(role, pw)| {
                (format!("MILLRACE_{}_PASSWORD", role.to_uppercase()), pw.to_string())
            })
            .collect();
        NatsServer::spawn(dir, port, &text, &env)
    }
}

/// A NATS operator of a test: its key, and one account it signs, for a server in operator mode
/// (`operator`, `resolver: MEMORY`, `resolver_preload`), whose users connect with a credentials
/// file (a user JWT signed by the account, and the user's seed). The JWTs are made here as
/// `nsc` makes them: `base64url(header).base64url(claims).base64url(ed25519 signature)`.
pub struct Operator {
    operator: KeyPair,
    account: KeyPair,
}

impl Default for Operator {
    fn default() -> Self {
        Self::new()
    }
}

impl Operator {
    pub fn new() -> Operator {
        Operator { operator: KeyPair::new_operator(), account: KeyPair::new_account() }
    }

    /// The server's configuration on `port` (no JetStream): this operator trusted, its account
    /// preloaded.
    pub fn server_config(&self, port: u16) -> String {
        let operator = sign(
            &self.operator,
            &self.operator.public_key(),
            "test operator",
            serde_json::json!({ "type": "operator", "version": 2 }),
        );
        let account = sign(
            &self.operator,
            &self.account.public_key(),
            "MILLRACE",
            serde_json::json!({
                "type": "account",
                "version": 2,
                "limits": {
                    "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
                    "wildcards": true, "conn": -1, "leaf": -1,
                },
                "default_permissions": { "pub": {}, "sub": {} },
            }),
        );
        format!(
            "host: 127.0.0.1\nport: {port}\noperator: \"{operator}\"\nresolver: MEMORY\n\
             resolver_preload: {{\n  {}: \"{account}\"\n}}\n",
            self.account.public_key()
        )
    }

    /// The text of a credentials file of a new user `name` of this operator's account.
    pub fn user_creds(&self, name: &str) -> String {
        creds(&self.account, name)
    }

    /// The text of a credentials file of a user signed by an account this operator never
    /// signed (the server refuses it).
    pub fn stranger_creds(name: &str) -> String {
        creds(&KeyPair::new_account(), name)
    }
}

/// A credentials file of a new user `name` issued by `account`.
fn creds(account: &KeyPair, name: &str) -> String {
    let user = KeyPair::new_user();
    let jwt = sign(
        account,
        &user.public_key(),
        name,
        serde_json::json!({
            "type": "user", "version": 2, "pub": {}, "sub": {},
            "subs": -1, "data": -1, "payload": -1,
        }),
    );
    let seed = user.seed().unwrap();
    format!(
        "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
    )
}

/// A JWT of `subject` named `name` with `nats` claims, signed by `issuer`.
fn sign(issuer: &KeyPair, subject: &str, name: &str, nats: serde_json::Value) -> String {
    let header = serde_json::json!({ "typ": "JWT", "alg": "ed25519-nkey" });
    let iat = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let claims = serde_json::json!({
        "jti": format!("{subject}-{iat}"),
        "iat": iat,
        "iss": issuer.public_key(),
        "sub": subject,
        "name": name,
        "nats": nats,
    });
    let signed = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let signature = issuer.sign(signed.as_bytes()).unwrap();
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature))
}
