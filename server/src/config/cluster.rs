//! `[bus]`, `[store]` and `[cluster]`: where messages and history go, and the cluster of
//! seeds/supervisor-worker-load-balancing.md. The defaults are the single process: the
//! in-process bus, SQLite under `server.data_dir`, no cluster.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use shared::cluster::assign::AssignConfig;
use shared::cluster::{TaskId, TaskKind};
use shared::protocol::InstrumentId;

/// `[bus] kind`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BusKind {
    /// In this process only (the default).
    Inprocess,
    /// NATS (core NATS for live data, JetStream for what must not be lost).
    Nats,
}

/// `[bus]`. With NATS, how this process proves who it is — at most one of `user` +
/// `password`, `token`, `nkey_seed` / `nkey_seed_file`, `credentials_file` — and TLS (`ca_file`,
/// `cert_file` + `key_file`, `require_tls`). The secrets (`password`, `token`, `nkey_seed`) are
/// never printed by `Debug` and never logged; they can come from the environment
/// (`MILLRACE_BUS__PASSWORD`) rather than a file. docs/nats/ holds a server configuration with
/// one user per role.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BusConfig {
    pub kind: BusKind,
    /// NATS server URL(s), comma-separated (`nats://127.0.0.1:4222`, `tls://…` to require
    /// TLS). Credentials in a URL (`nats://user:pass@host`, `nats://token@host`) are refused:
    /// the client would not send them, and a URL is printed where secrets must not be; use the
    /// keys below.
    pub url: String,
    /// First token of every subject, stream and bucket name, so several clusters (or test runs)
    /// share one NATS server: letters, digits, `_` and `-`.
    pub prefix: String,
    /// NATS user name (the server's `authorization { users }` or an account's `users`); with
    /// `password`.
    pub user: Option<String>,
    /// The user's password (secret).
    pub password: Option<String>,
    /// A token the server accepts (`authorization { token }`) (secret).
    pub token: Option<String>,
    /// An nkey user seed (`SU…`; the server lists the user's public key, `U…`) (secret).
    /// Prefer `nkey_seed_file`: a seed in the environment is readable in `/proc/<pid>/environ`
    /// by the user's other processes, and one in the configuration file is copied with it.
    pub nkey_seed: Option<String>,
    /// A file holding an nkey user seed (only its owner should read it, `chmod 600`).
    pub nkey_seed_file: Option<PathBuf>,
    /// A NATS credentials file (`.creds`: a user JWT and its nkey seed, made by `nsc`), for a
    /// server in operator mode.
    pub credentials_file: Option<PathBuf>,
    /// PEM file of the certificate authorities that sign the server's certificate; without it
    /// the system's roots are trusted. Setting it requires TLS.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate, for a server that verifies clients (`tls { verify: true }`);
    /// with `key_file`. Setting it requires TLS.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
    /// Refuse a server that does not speak TLS. Without it (and without `ca_file` /
    /// `cert_file`), TLS is used when the server asks for it or the URL is `tls://`.
    pub require_tls: bool,
}

impl Default for BusConfig {
    fn default() -> Self {
        BusConfig {
            kind: BusKind::Inprocess,
            url: "nats://127.0.0.1:4222".into(),
            prefix: "millrace".into(),
            user: None,
            password: None,
            token: None,
            nkey_seed: None,
            nkey_seed_file: None,
            credentials_file: None,
            ca_file: None,
            cert_file: None,
            key_file: None,
            require_tls: false,
        }
    }
}

/// Shows whether a secret is set, never the secret.
fn secret(s: &Option<String>) -> &'static str {
    if s.is_some() {
        "Some(<redacted>)"
    } else {
        "None"
    }
}

impl std::fmt::Debug for BusConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BusConfig")
            .field("kind", &self.kind)
            .field("url", &self.url)
            .field("prefix", &self.prefix)
            .field("user", &self.user)
            .field("password", &format_args!("{}", secret(&self.password)))
            .field("token", &format_args!("{}", secret(&self.token)))
            .field("nkey_seed", &format_args!("{}", secret(&self.nkey_seed)))
            .field("nkey_seed_file", &self.nkey_seed_file)
            .field("credentials_file", &self.credentials_file)
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("require_tls", &self.require_tls)
            .finish()
    }
}

/// How a process proves who it is to NATS, read from `[bus]` ([`BusConfig::auth`]). `Debug`
/// shows the method, never the secret.
#[derive(Clone, PartialEq, Eq)]
pub enum BusAuth {
    /// No credentials (a server without authentication).
    None,
    UserPassword {
        user: String,
        password: String,
    },
    Token(String),
    /// An nkey user seed, from `key` (`bus.nkey_seed` or `bus.nkey_seed_file`).
    NkeySeed {
        key: &'static str,
        seed: String,
    },
    /// The text of a credentials file (a user JWT and its seed).
    Credentials(String),
}

impl std::fmt::Debug for BusAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BusAuth::None => write!(f, "None"),
            BusAuth::UserPassword { user, .. } => write!(f, "UserPassword({user:?}, <redacted>)"),
            BusAuth::Token(_) => write!(f, "Token(<redacted>)"),
            BusAuth::NkeySeed { key, .. } => write!(f, "NkeySeed({key}, <redacted>)"),
            BusAuth::Credentials(_) => write!(f, "Credentials(<redacted>)"),
        }
    }
}

impl BusConfig {
    /// The credentials `[bus]` names, their files read and checked; the error names the key.
    pub fn auth(&self) -> Result<BusAuth, InvalidKey> {
        let set: Vec<&str> = [
            ("bus.user", self.user.is_some() || self.password.is_some()),
            ("bus.token", self.token.is_some()),
            ("bus.nkey_seed", self.nkey_seed.is_some()),
            ("bus.nkey_seed_file", self.nkey_seed_file.is_some()),
            ("bus.credentials_file", self.credentials_file.is_some()),
        ]
        .into_iter()
        .filter_map(|(key, on)| on.then_some(key))
        .collect();
        if let [first, second, ..] = set[..] {
            return Err(invalid(
                second,
                format!("only one way to authenticate to NATS may be set, and {first} is set too"),
            ));
        }
        let not_empty = |key: &str, v: &str| {
            if v.trim().is_empty() {
                Err(invalid(key, "must not be empty"))
            } else {
                Ok(())
            }
        };
        match (&self.user, &self.password) {
            (Some(_), None) => return Err(invalid("bus.password", "is required with bus.user")),
            (None, Some(_)) => return Err(invalid("bus.user", "is required with bus.password")),
            (Some(user), Some(password)) => {
                not_empty("bus.user", user)?;
                not_empty("bus.password", password)?;
                return Ok(BusAuth::UserPassword {
                    user: user.clone(),
                    password: password.clone(),
                });
            }
            (None, None) => {}
        }
        if let Some(token) = &self.token {
            not_empty("bus.token", token)?;
            return Ok(BusAuth::Token(token.clone()));
        }
        if let Some(seed) = &self.nkey_seed {
            return user_seed("bus.nkey_seed", seed.trim())
                .map(|seed| BusAuth::NkeySeed { key: "bus.nkey_seed", seed });
        }
        if let Some(path) = &self.nkey_seed_file {
            let text = read("bus.nkey_seed_file", path)?;
            return user_seed("bus.nkey_seed_file", text.trim())
                .map(|seed| BusAuth::NkeySeed { key: "bus.nkey_seed_file", seed });
        }
        if let Some(path) = &self.credentials_file {
            let text = read("bus.credentials_file", path)?;
            credentials(&text).map_err(|e| {
                invalid(
                    "bus.credentials_file",
                    format!(
                        "{} is not a NATS credentials file (a user JWT and its nkey seed): {e}",
                        path.display()
                    ),
                )
            })?;
            return Ok(BusAuth::Credentials(text));
        }
        Ok(BusAuth::None)
    }

    /// The key of the credentials in use, which a refusal by the server names.
    pub fn auth_key(&self) -> &'static str {
        if self.user.is_some() || self.password.is_some() {
            "bus.password"
        } else if self.token.is_some() {
            "bus.token"
        } else if self.nkey_seed.is_some() {
            "bus.nkey_seed"
        } else if self.nkey_seed_file.is_some() {
            "bus.nkey_seed_file"
        } else if self.credentials_file.is_some() {
            "bus.credentials_file"
        } else {
            "bus.user"
        }
    }

    /// Whether the connection must be TLS: asked for, or implied by a CA or client certificate
    /// (which would otherwise be silently unused on a plain connection).
    pub fn tls_required(&self) -> bool {
        self.require_tls || self.ca_file.is_some() || self.cert_file.is_some()
    }

    /// The key that makes TLS required (a server without TLS is reported under it).
    pub fn tls_key(&self) -> &'static str {
        if self.require_tls {
            "bus.require_tls"
        } else if self.ca_file.is_some() {
            "bus.ca_file"
        } else if self.cert_file.is_some() {
            "bus.cert_file"
        } else {
            "bus.url"
        }
    }

    /// Checks the TLS files: each readable, certificates and a private key in PEM.
    fn check_tls(&self) -> Result<(), InvalidKey> {
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certificates = |key: &str, path: &Path| {
            read(key, path)?;
            let n = CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| {
                    invalid(key, format!("{}: not PEM certificates: {e}", path.display()))
                })?
                .len();
            if n == 0 {
                return Err(invalid(key, format!("{} holds no PEM certificate", path.display())));
            }
            Ok(())
        };
        if let Some(ca) = &self.ca_file {
            certificates("bus.ca_file", ca)?;
        }
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) => {
                return Err(invalid("bus.key_file", "is required with bus.cert_file"))
            }
            (None, Some(_)) => {
                return Err(invalid("bus.cert_file", "is required with bus.key_file"))
            }
            (Some(cert), Some(key)) => {
                certificates("bus.cert_file", cert)?;
                read("bus.key_file", key)?;
                PrivateKeyDer::from_pem_file(key).map_err(|e| {
                    invalid("bus.key_file", format!("{}: no PEM private key: {e}", key.display()))
                })?;
            }
            (None, None) => {}
        }
        Ok(())
    }

    /// The keys that only NATS uses, set while `kind` is not NATS.
    fn nats_only_key_set(&self) -> Option<&'static str> {
        [
            ("bus.user", self.user.is_some()),
            ("bus.password", self.password.is_some()),
            ("bus.token", self.token.is_some()),
            ("bus.nkey_seed", self.nkey_seed.is_some()),
            ("bus.nkey_seed_file", self.nkey_seed_file.is_some()),
            ("bus.credentials_file", self.credentials_file.is_some()),
            ("bus.ca_file", self.ca_file.is_some()),
            ("bus.cert_file", self.cert_file.is_some()),
            ("bus.key_file", self.key_file.is_some()),
            ("bus.require_tls", self.require_tls),
        ]
        .into_iter()
        .find_map(|(key, on)| on.then_some(key))
    }
}

/// A file's text; an error naming `key` and the file (never its content).
fn read(key: &str, path: &Path) -> Result<String, InvalidKey> {
    std::fs::read_to_string(path)
        .map_err(|e| invalid(key, format!("cannot read {}: {e}", path.display())))
}

/// `seed` if it is an nkey user seed; the error never shows it.
/// A NATS credentials file's two parts (as `nsc` writes it): the user JWT, then the user's
/// nkey seed, each between a line of dashes that opens and one that closes it. Checked at
/// start, so a file that is not one is an error naming `bus.credentials_file`, not a refusal
/// from the server.
fn credentials(text: &str) -> Result<(), &'static str> {
    let mut blocks = Vec::new();
    let mut lines = text.lines().map(str::trim);
    while let Some(line) = lines.next() {
        if line.starts_with("---") {
            let Some(body) = lines.next() else { break };
            match lines.next() {
                Some(end) if end.starts_with("---") && !body.is_empty() => blocks.push(body),
                _ => {
                    return Err("a block opened by a line of dashes does not close after one line")
                }
            }
        }
    }
    let [jwt, seed, ..] = blocks[..] else {
        return Err("it holds fewer than two blocks (the JWT and the seed)");
    };
    if jwt.split('.').count() != 3 {
        return Err("its first block is not a JWT");
    }
    match nkeys::KeyPair::from_seed(seed) {
        Ok(kp) if kp.key_pair_type() == nkeys::KeyPairType::User => Ok(()),
        _ => Err("its second block is not a user's nkey seed"),
    }
}

/// One address of `bus.url`, as the NATS client reads it: `[scheme://][user[:pass]@]host[:port]`
/// with the scheme `nats`, `tls`, `ws` or `wss`.
struct NatsAddr {
    /// `user:password@` or `token@`: the client does not send them from the URL.
    has_credentials: bool,
}

impl NatsAddr {
    fn parse(url: &str) -> Result<NatsAddr, &'static str> {
        let url = url.trim();
        let rest = match url.split_once("://") {
            Some((scheme, rest)) => {
                if !matches!(scheme, "nats" | "tls" | "ws" | "wss") {
                    return Err("the scheme is not nats, tls, ws or wss");
                }
                rest
            }
            None => url,
        };
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        let (credentials, host_port) = match authority.rsplit_once('@') {
            Some((c, h)) => (Some(c), h),
            None => (None, authority),
        };
        let (host, port) = match host_port.strip_prefix('[') {
            Some(v6) => {
                let (host, after) = v6.split_once(']').ok_or("an IPv6 address is not closed")?;
                host.parse::<std::net::Ipv6Addr>().map_err(|_| "a bad IPv6 address")?;
                (host, after.strip_prefix(':'))
            }
            None => match host_port.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (host_port, None),
            },
        };
        if host.is_empty()
            || !host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | ':'))
        {
            return Err("no host, or a host of characters a host name does not hold");
        }
        if port.is_some_and(|p| p.parse::<u16>().is_err()) {
            return Err("the port is not a number up to 65535");
        }
        Ok(NatsAddr { has_credentials: credentials.is_some_and(|c| !c.is_empty()) })
    }
}

fn user_seed(key: &str, seed: &str) -> Result<String, InvalidKey> {
    match nkeys::KeyPair::from_seed(seed) {
        Ok(kp) if kp.key_pair_type() == nkeys::KeyPairType::User => Ok(seed.to_string()),
        Ok(_) => {
            Err(invalid(key, "is an nkey seed, but not a user's (a user seed starts with `SU`)"))
        }
        Err(_) => {
            Err(invalid(key, "is not an nkey user seed (`SU…`, as `nk -gen user` prints it)"))
        }
    }
}

/// `[store] kind`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    /// One SQLite file under `server.data_dir` (the default).
    Sqlite,
    /// PostgreSQL at `url` (the shared history of a cluster).
    Postgres,
}

/// `[store]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    pub kind: StoreKind,
    /// PostgreSQL URL (`postgres://user:password@host:5432/db`) or libpq `key=value` string;
    /// required with `kind = "postgres"`. TLS as libpq's parameters say: `sslmode` (`disable`,
    /// `prefer` [default], `require`, `verify-ca`, `verify-full`), `sslrootcert` (a PEM file, or
    /// `system`; without it `verify-*` trusts the system's certificates), `sslcert` / `sslkey`
    /// (a client certificate); see `store::pg_connect`.
    pub url: Option<String>,
    /// SQLite: check the file's integrity (`PRAGMA quick_check`) before starting, and refuse a
    /// corrupt one. `false` starts on a damaged file (reads and writes that touch the damage
    /// fail, and `/healthz` reports them; damage in a candle table shows at start, when the
    /// series catalogue is loaded).
    pub quick_check: bool,
    /// SQLite: page cache of the connection that writes candles, in KiB (64 to 1048576). It
    /// needs each series' newest pages (~8 KiB a series), not the file's history: 1024 suits
    /// ~120 series. Read connections keep their own.
    pub sqlite_writer_cache_kib: u32,
    /// SQLite: read connections at most (1 to 256), each opened when first needed and kept. A
    /// read that finds them all busy waits up to 10 s for one, then fails naming this key.
    pub sqlite_readers: u32,
    /// PostgreSQL: connections this process opens at most (4 to 100; default 8), each opened
    /// when first needed and kept. 3 of them are the writes' (the persister's two transactions
    /// at once, backfill, the health check), the rest the reads', so reads never starve writes.
    /// A read that finds the read connections all busy waits up to 10 s for one (the REST API's
    /// reads wait without taking a thread), a write up to 30 s, then fails naming this key.
    /// Size it against the server's `max_connections` (100 by default), shared by every
    /// gateway and worker.
    pub pg_pool_size: u32,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            kind: StoreKind::Sqlite,
            url: None,
            quick_check: true,
            sqlite_writer_cache_kib: SQLITE_WRITER_CACHE_KIB,
            sqlite_readers: SQLITE_READERS,
            pg_pool_size: PG_POOL_SIZE,
        }
    }
}

/// `store.sqlite_writer_cache_kib` unless configured (why this much: `store::sqlite`).
pub const SQLITE_WRITER_CACHE_KIB: u32 = 1024;
/// `store.sqlite_readers` unless configured.
pub const SQLITE_READERS: u32 = 4;
/// `store.pg_pool_size` unless configured: 3 for writes and 5 for reads (`store::pg_pool`).
pub const PG_POOL_SIZE: u32 = 8;
/// The PostgreSQL store's connections kept for writes.
pub const PG_WRITE_LANE: u32 = 3;
/// The least `store.pg_pool_size`: the write lane and one read connection.
pub const PG_MIN_POOL_SIZE: u32 = PG_WRITE_LANE + 1;

/// `[cluster]`: the seed's timings (its defaults), the redundancy and the task list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// `millrace serve` runs as a gateway of the cluster.
    pub enabled: bool,
    /// This gateway's id in demands and leases [default: gateway-<host>-<pid>].
    pub id: Option<String>,
    pub warmup_s: u64,
    /// The one low-precision timer's period.
    pub tick_ms: u64,
    /// How often workers and gateways publish their status / demand.
    pub status_interval_ms: u64,
    pub worker_timeout_s: u64,
    pub task_timeout_s: u64,
    pub task_query_interval_s: u64,
    /// Distinct workers per task (the seed's 2–3).
    pub redundancy: u32,
    /// Pinned instruments; each becomes one task per kind of `kinds`.
    pub instruments: Vec<InstrumentId>,
    /// The kinds of task of every pinned instrument and pattern match.
    pub kinds: Vec<TaskKind>,
    /// Symbols to add from each source's exchangeInfo at every task query: a glob over
    /// `BASE/QUOTE` (`*` matches any run of characters), e.g. `"*/USDT"`.
    pub symbol_pattern: Option<String>,
    /// Lifetime of the leader lease (JetStream KV entry); a standby takes over after it.
    pub lease_s: u64,
    /// JetStream's duplicate window of the closed-candle stream: a candle sent again within it
    /// (by another replica) is dropped before the persister.
    pub dedup_window_s: u64,
    /// How long closed candles wait in JetStream for a persister before they expire.
    pub queue_max_age_s: u64,
    /// The size of the depth diff stream (memory storage, diffs kept 60 s), in MiB. JetStream
    /// reserves it in the NATS server's memory when the stream is made, for as long as the
    /// stream exists.
    pub depth_stream_mb: u64,
    /// How old a closed candle read from the bus may be, by the exchange's clock: older ones
    /// are refused (and a worker's gap fill after a long outage starts no earlier; history
    /// beyond it is backfill's, which writes the store directly).
    pub bus_retention_s: u64,
    /// How far past the exchange's clock (as last read, extrapolated) a time read from the bus
    /// may be: a closed candle's end, a live push's event time. Beyond it a message is refused
    /// as forged or broken (a closed candle only once a fresh reading of the clock still puts
    /// it beyond).
    pub bus_tolerance_s: u64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            enabled: false,
            id: None,
            warmup_s: 30,
            tick_ms: 1000,
            status_interval_ms: 1000,
            worker_timeout_s: 30,
            task_timeout_s: 30,
            task_query_interval_s: 1800,
            redundancy: 2,
            instruments: Vec::new(),
            kinds: TaskKind::ALL.to_vec(),
            symbol_pattern: None,
            lease_s: 10,
            dedup_window_s: 600,
            queue_max_age_s: 7 * 86_400,
            depth_stream_mb: 512,
            bus_retention_s: 30 * 86_400,
            bus_tolerance_s: 30,
        }
    }
}

impl ClusterConfig {
    /// The supervisor state machine's settings.
    pub fn assign_config(&self) -> AssignConfig {
        AssignConfig {
            tick_ms: self.tick_ms,
            warmup_ms: self.warmup_s * 1000,
            worker_timeout_ms: self.worker_timeout_s * 1000,
            task_timeout_ms: self.task_timeout_s * 1000,
            task_query_interval_ms: self.task_query_interval_s * 1000,
            redundancy: self.redundancy,
        }
    }

    /// How many short statuses (data ages only) a worker sends between two full ones: as many
    /// as keep a full status at least three times in every warm-up — a supervisor that starts
    /// late learns a worker's task list only from a full status — and at most 9.
    pub fn short_statuses(&self) -> u32 {
        let per_warmup = self.warmup_s * 1000 / self.status_interval_ms.max(1);
        u32::try_from((per_warmup / 3).saturating_sub(1)).unwrap_or(u32::MAX).min(9)
    }

    /// The pinned tasks: every instrument × every kind.
    pub fn pinned_tasks(&self) -> Vec<TaskId> {
        self.instruments
            .iter()
            .flat_map(|i| self.kinds.iter().map(|k| TaskId::new(*k, i.clone())))
            .collect()
    }
}

/// Whether `symbol` (`BASE/QUOTE`) matches `pattern`, where `*` matches any run of characters.
pub fn glob_match(pattern: &str, symbol: &str) -> bool {
    let (p, s) = (pattern.as_bytes(), symbol.as_bytes());
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, si));
            pi += 1;
        } else if pi < p.len() && p[pi] == s[si] {
            pi += 1;
            si += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// A key of `[bus]`, `[store]` or `[cluster]` with a bad value (the service's configuration
/// error names it the same way).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("configuration key `{key}`: {problem}")]
pub struct InvalidKey {
    pub key: String,
    pub problem: String,
}

fn invalid(key: &str, problem: impl Into<String>) -> InvalidKey {
    InvalidKey { key: key.into(), problem: problem.into() }
}

/// A subject token / bucket name: letters, digits, `_`, `-`.
pub fn valid_prefix(prefix: &str) -> bool {
    !prefix.is_empty()
        && prefix.len() <= 64
        && prefix.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Checks `[bus]`, `[store]` and `[cluster]`; the error names the key.
pub fn validate(
    bus: &BusConfig,
    store: &StoreConfig,
    cluster: &ClusterConfig,
) -> Result<(), InvalidKey> {
    if !valid_prefix(&bus.prefix) {
        return Err(invalid(
            "bus.prefix",
            format!("{:?} must be 1 to 64 letters, digits, `_` or `-`", bus.prefix),
        ));
    }
    if bus.kind == BusKind::Nats {
        for url in bus.url.split(',') {
            let addr = NatsAddr::parse(url).map_err(|e| {
                let url = crate::redact::redact(url);
                invalid("bus.url", format!("{url:?} is not a NATS server URL: {e}"))
            })?;
            if addr.has_credentials {
                // (the URL is not shown: it holds a secret)
                return Err(invalid(
                    "bus.url",
                    "holds credentials (`user:password@` or `token@`), which the NATS client \
                     does not send: set bus.user and bus.password, or bus.token, and take them \
                     out of the URL",
                ));
            }
        }
        bus.auth()?;
        bus.check_tls()?;
    } else if let Some(key) = bus.nats_only_key_set() {
        return Err(invalid(key, "is only for bus.kind = \"nats\""));
    }
    match (store.kind, &store.url) {
        (StoreKind::Postgres, None) => {
            return Err(invalid("store.url", "is required with store.kind = \"postgres\""));
        }
        (StoreKind::Postgres, Some(url)) => {
            // its text is not shown: it may hold a password
            super::pg_url::PgUrl::parse(url)
                .map_err(|e| invalid("store.url", crate::error::report(&e)))?;
        }
        (StoreKind::Sqlite, Some(_)) => {
            return Err(invalid("store.url", "is only for store.kind = \"postgres\""));
        }
        (StoreKind::Sqlite, None) => {}
    }
    let c = cluster;
    let range = |key: &str, v: u64, lo: u64, hi: u64| {
        if v < lo || v > hi {
            Err(invalid(key, format!("must be between {lo} and {hi}, got {v}")))
        } else {
            Ok(())
        }
    };
    range("store.sqlite_writer_cache_kib", u64::from(store.sqlite_writer_cache_kib), 64, 1 << 20)?;
    range("store.sqlite_readers", u64::from(store.sqlite_readers), 1, 256)?;
    let least = u64::from(PG_MIN_POOL_SIZE);
    range("store.pg_pool_size", u64::from(store.pg_pool_size), least, 100)?;
    range("cluster.warmup_s", c.warmup_s, 0, 3600)?;
    range("cluster.tick_ms", c.tick_ms, 10, 60_000)?;
    range("cluster.status_interval_ms", c.status_interval_ms, 10, 60_000)?;
    range("cluster.worker_timeout_s", c.worker_timeout_s, 1, 3600)?;
    range("cluster.task_timeout_s", c.task_timeout_s, 1, 3600)?;
    range("cluster.task_query_interval_s", c.task_query_interval_s, 1, 7 * 86_400)?;
    range("cluster.redundancy", u64::from(c.redundancy), 1, 5)?;
    range("cluster.lease_s", c.lease_s, 1, 3600)?;
    range("cluster.dedup_window_s", c.dedup_window_s, 1, 86_400)?;
    range("cluster.queue_max_age_s", c.queue_max_age_s, 60, 365 * 86_400)?;
    range("cluster.depth_stream_mb", c.depth_stream_mb, 1, 1 << 20)?;
    range("cluster.bus_retention_s", c.bus_retention_s, 3_600, 3_650 * 86_400)?;
    range("cluster.bus_tolerance_s", c.bus_tolerance_s, 1, 86_400)?;
    if c.dedup_window_s > c.queue_max_age_s {
        return Err(invalid("cluster.dedup_window_s", "must not exceed cluster.queue_max_age_s"));
    }
    if c.status_interval_ms >= c.worker_timeout_s * 1000 {
        return Err(invalid(
            "cluster.status_interval_ms",
            "must be shorter than cluster.worker_timeout_s, or every worker times out",
        ));
    }
    if let Some(id) = &c.id {
        if !valid_prefix(id) {
            return Err(invalid(
                "cluster.id",
                format!("{id:?} must be 1 to 64 letters, digits, `_` or `-`"),
            ));
        }
    }
    if c.kinds.is_empty() {
        return Err(invalid("cluster.kinds", "must name at least one of kline, depth"));
    }
    if c.enabled && bus.kind != BusKind::Nats {
        return Err(invalid("bus.kind", "must be \"nats\" with cluster.enabled = true"));
    }
    if c.enabled && store.kind != StoreKind::Postgres {
        return Err(invalid("store.kind", "must be \"postgres\" with cluster.enabled = true"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nats_addresses_are_read_as_the_client_reads_them() {
        for ok in
            ["nats://127.0.0.1:4222", "tls://h.example", "127.0.0.1:4222", "h", "wss://[::1]:443/x"]
        {
            assert!(NatsAddr::parse(ok).is_ok_and(|a| !a.has_credentials), "{ok}");
        }
        for secret in ["nats://u:p@h:4222", "nats://token@h", "u:p@h"] {
            assert!(NatsAddr::parse(secret).is_ok_and(|a| a.has_credentials), "{secret}");
        }
        for bad in ["http://h:4222", "nats://h:99999", "nats://", "nats://h h", "nats://[::1"] {
            assert!(NatsAddr::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_credentials_file_holds_a_jwt_and_a_user_seed() {
        let user = nkeys::KeyPair::new_user().seed().unwrap();
        let account = nkeys::KeyPair::new_account().seed().unwrap();
        let file = |jwt: &str, seed: &str| {
            format!(
                "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
                 ************************* IMPORTANT *************************\n\n\
                 -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
            )
        };
        assert_eq!(credentials(&file("a.b.c", &user)), Ok(()));
        assert!(credentials(&file("a.b.c", &account)).is_err(), "an account's seed");
        assert!(credentials(&file("not-a-jwt", &user)).is_err());
        assert!(credentials(&user).is_err(), "a bare seed");
        assert!(credentials("-----BEGIN X-----\nabc\n").is_err(), "unclosed");
    }

    #[test]
    fn globs() {
        assert!(glob_match("*/USDT", "BTC/USDT"));
        assert!(!glob_match("*/USDT", "BTC/USDC"));
        assert!(glob_match("B*/*", "BTC/USDT"));
        assert!(glob_match("*", ""));
        assert!(glob_match("BTC/USDT", "BTC/USDT"));
        assert!(!glob_match("BTC/USD", "BTC/USDT"));
        assert!(glob_match("*T*T", "BTC/USDT"));
    }

    #[test]
    fn a_full_status_comes_three_times_a_warm_up() {
        let c = ClusterConfig::default(); // 30 s warm-up, a status a second
        assert_eq!(c.short_statuses(), 9);
        let c = ClusterConfig { warmup_s: 1, status_interval_ms: 200, ..ClusterConfig::default() };
        assert_eq!(c.short_statuses(), 0, "5 statuses a warm-up: all full");
        let c = ClusterConfig { warmup_s: 12, ..ClusterConfig::default() };
        assert_eq!(c.short_statuses(), 3);
    }

    #[test]
    fn keys_are_named_in_errors() {
        let bus = BusConfig {
            kind: BusKind::Nats,
            url: "nats://[bad".into(),
            prefix: "t".into(),
            ..BusConfig::default()
        };
        let e = validate(&bus, &StoreConfig::default(), &ClusterConfig::default()).unwrap_err();
        assert!(e.to_string().contains("bus.url"), "{e}");
        let bus = BusConfig { prefix: "a.b".into(), ..BusConfig::default() };
        let e = validate(&bus, &StoreConfig::default(), &ClusterConfig::default()).unwrap_err();
        assert!(e.to_string().contains("bus.prefix"), "{e}");
        let store = StoreConfig { kind: StoreKind::Postgres, url: None, ..Default::default() };
        let e = validate(&BusConfig::default(), &store, &ClusterConfig::default()).unwrap_err();
        assert!(e.to_string().contains("store.url"), "{e}");
        for kib in [0, 63, (1 << 20) + 1] {
            let store = StoreConfig { sqlite_writer_cache_kib: kib, ..Default::default() };
            let e = validate(&BusConfig::default(), &store, &ClusterConfig::default()).unwrap_err();
            assert!(e.to_string().contains("store.sqlite_writer_cache_kib"), "{e}");
        }
        for readers in [0, 257] {
            let store = StoreConfig { sqlite_readers: readers, ..Default::default() };
            let e = validate(&BusConfig::default(), &store, &ClusterConfig::default()).unwrap_err();
            assert!(e.to_string().contains("store.sqlite_readers"), "{e}");
        }
        for size in [0, 3, 101] {
            let store = StoreConfig { pg_pool_size: size, ..Default::default() };
            let e = validate(&BusConfig::default(), &store, &ClusterConfig::default()).unwrap_err();
            assert!(e.to_string().starts_with("configuration key `store.pg_pool_size`"), "{e}");
        }
        for size in [4, 8, 100] {
            let store = StoreConfig { pg_pool_size: size, ..Default::default() };
            assert!(validate(&BusConfig::default(), &store, &ClusterConfig::default()).is_ok());
        }
        let pg = |url: &str| StoreConfig {
            kind: StoreKind::Postgres,
            url: Some(url.into()),
            ..Default::default()
        };
        let ok = "postgres://u:pw@h/db?sslmode=verify-full&sslrootcert=/ca.pem&sslcert=c&sslkey=k";
        assert!(validate(&BusConfig::default(), &pg(ok), &ClusterConfig::default()).is_ok());
        let ok = "host=h password=pw sslmode=verify-ca sslrootcert=system";
        assert!(validate(&BusConfig::default(), &pg(ok), &ClusterConfig::default()).is_ok());
        for bad in ["postgres://u:pw@h/db?sslmode=verify", "host=h password=pw sslcert=c"] {
            let e = validate(&BusConfig::default(), &pg(bad), &ClusterConfig::default());
            let e = e.unwrap_err().to_string();
            assert!(e.starts_with("configuration key `store.url`: "), "{e}");
            assert!(!e.contains("pw"), "the URL's text is not shown: {e}");
        }
        let cluster = ClusterConfig { enabled: true, ..ClusterConfig::default() };
        let e = validate(&BusConfig::default(), &StoreConfig::default(), &cluster).unwrap_err();
        assert!(e.to_string().contains("bus.kind"), "{e}");
        let cluster = ClusterConfig { redundancy: 0, ..ClusterConfig::default() };
        let e = validate(&BusConfig::default(), &StoreConfig::default(), &cluster).unwrap_err();
        assert!(e.to_string().contains("cluster.redundancy"), "{e}");
        assert!(validate(
            &BusConfig::default(),
            &StoreConfig::default(),
            &ClusterConfig::default()
        )
        .is_ok());
    }

    fn nats() -> BusConfig {
        BusConfig { kind: BusKind::Nats, ..BusConfig::default() }
    }

    fn key_of(bus: &BusConfig) -> String {
        let e = validate(bus, &StoreConfig::default(), &ClusterConfig::default()).unwrap_err();
        e.key
    }

    fn dir(tag: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("millrace-busconfig-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn bus_credentials_are_one_method_and_name_their_key() {
        let some = |s: &str| Some(s.to_string());
        let user_only = BusConfig { user: some("worker"), ..nats() };
        assert_eq!(key_of(&user_only), "bus.password");
        let password_only = BusConfig { password: some("pw-1"), ..nats() };
        assert_eq!(key_of(&password_only), "bus.user");
        let empty = BusConfig { user: some("worker"), password: some(" "), ..nats() };
        assert_eq!(key_of(&empty), "bus.password");
        let empty = BusConfig { token: some(""), ..nats() };
        assert_eq!(key_of(&empty), "bus.token");
        // two methods: the second is named, and the first in the message
        let two = BusConfig { user: some("w"), password: some("p"), token: some("t"), ..nats() };
        let e = validate(&two, &StoreConfig::default(), &ClusterConfig::default()).unwrap_err();
        assert_eq!(e.key, "bus.token");
        assert!(e.problem.contains("bus.user"), "{e}");
        let two =
            BusConfig { nkey_seed: some("x"), credentials_file: Some("c.creds".into()), ..nats() };
        assert_eq!(key_of(&two), "bus.credentials_file");
        let ok = BusConfig { user: some("w"), password: some("p"), ..nats() };
        assert_eq!(
            ok.auth().unwrap(),
            BusAuth::UserPassword { user: "w".into(), password: "p".into() }
        );
        assert_eq!(ok.auth_key(), "bus.password");
        assert_eq!(nats().auth().unwrap(), BusAuth::None);
        assert_eq!(nats().auth_key(), "bus.user");
    }

    #[test]
    fn nkey_seeds_are_checked_and_never_shown() {
        let user = nkeys::KeyPair::new_user();
        let seed = user.seed().unwrap();
        let ok = BusConfig { nkey_seed: Some(seed.clone()), ..nats() };
        assert_eq!(
            ok.auth().unwrap(),
            BusAuth::NkeySeed { key: "bus.nkey_seed", seed: seed.clone() }
        );
        // a seed with a character changed fails its checksum; the error does not repeat it
        let mut bad = seed.clone().into_bytes();
        bad[10] = if bad[10] == b'A' { b'B' } else { b'A' };
        let bad = String::from_utf8(bad).unwrap();
        let e = BusConfig { nkey_seed: Some(bad.clone()), ..nats() }.auth().unwrap_err();
        assert_eq!(e.key, "bus.nkey_seed");
        assert!(!e.to_string().contains(&bad[2..]), "{e}");
        let account = nkeys::KeyPair::new_account().seed().unwrap();
        let e = BusConfig { nkey_seed: Some(account), ..nats() }.auth().unwrap_err();
        assert!(e.problem.contains("not a user's"), "{e}");
        // from a file (trailing newline and all)
        let d = dir("seed");
        let file = d.join("worker.nk");
        std::fs::write(&file, format!("{seed}\n")).unwrap();
        let ok = BusConfig { nkey_seed_file: Some(file.clone()), ..nats() };
        assert_eq!(ok.auth().unwrap(), BusAuth::NkeySeed { key: "bus.nkey_seed_file", seed });
        let missing = BusConfig { nkey_seed_file: Some(d.join("nope.nk")), ..nats() };
        let e = validate(&missing, &StoreConfig::default(), &ClusterConfig::default()).unwrap_err();
        assert_eq!(e.key, "bus.nkey_seed_file");
        assert!(e.problem.contains("nope.nk"), "{e}");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn credentials_and_tls_files_are_read_at_start() {
        let d = dir("files");
        let junk = d.join("junk.txt");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        let creds = BusConfig { credentials_file: Some(junk.clone()), ..nats() };
        assert_eq!(key_of(&creds), "bus.credentials_file");
        let creds = BusConfig { credentials_file: Some(d.join("none.creds")), ..nats() };
        assert_eq!(key_of(&creds), "bus.credentials_file");
        let ca = BusConfig { ca_file: Some(junk.clone()), ..nats() };
        assert_eq!(key_of(&ca), "bus.ca_file");
        let ca = BusConfig { ca_file: Some(d.join("none.pem")), ..nats() };
        assert_eq!(key_of(&ca), "bus.ca_file");
        let cert_alone = BusConfig { cert_file: Some(junk.clone()), ..nats() };
        assert_eq!(key_of(&cert_alone), "bus.key_file");
        let key_alone = BusConfig { key_file: Some(junk.clone()), ..nats() };
        assert_eq!(key_of(&key_alone), "bus.cert_file");
        let both = BusConfig { cert_file: Some(junk.clone()), key_file: Some(junk), ..nats() };
        assert_eq!(key_of(&both), "bus.cert_file");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn credentials_in_the_url_are_refused_without_showing_them() {
        for url in [
            "nats://worker:hunter2-secret@127.0.0.1:4222",
            "nats://hunter2-secret@127.0.0.1:4222",
            "nats://127.0.0.1:4222, tls://worker:hunter2-secret@h:4222",
        ] {
            let bus = BusConfig { url: url.into(), ..nats() };
            let e = validate(&bus, &StoreConfig::default(), &ClusterConfig::default()).unwrap_err();
            assert_eq!(e.key, "bus.url", "{url}");
            assert!(!e.to_string().contains("hunter2"), "{e}");
            assert!(e.problem.contains("bus.password"), "{e}");
        }
    }

    #[test]
    fn nats_keys_need_the_nats_bus() {
        let bus = BusConfig { password: Some("pw".into()), ..BusConfig::default() };
        assert_eq!(key_of(&bus), "bus.password");
        let bus = BusConfig { require_tls: true, ..BusConfig::default() };
        assert_eq!(key_of(&bus), "bus.require_tls");
    }

    #[test]
    fn tls_is_required_by_a_ca_or_a_client_certificate() {
        assert!(!nats().tls_required());
        let ca = BusConfig { ca_file: Some("ca.pem".into()), ..nats() };
        assert!(ca.tls_required());
        assert_eq!(ca.tls_key(), "bus.ca_file");
        let both = BusConfig { require_tls: true, ..ca };
        assert_eq!(both.tls_key(), "bus.require_tls");
    }

    #[test]
    fn debug_never_shows_a_secret() {
        let bus = BusConfig {
            user: Some("worker".into()),
            password: Some("pw-SECRET-1".into()),
            token: Some("tok-SECRET-2".into()),
            nkey_seed: Some("SU-SECRET-3".into()),
            ..nats()
        };
        let shown = format!(
            "{bus:?} {:?}",
            crate::config::Config { bus: bus.clone(), ..Default::default() }
        );
        assert!(shown.contains("worker") && shown.contains("<redacted>"), "{shown}");
        assert!(!shown.contains("SECRET"), "{shown}");
        for auth in [
            BusAuth::UserPassword { user: "w".into(), password: "pw-SECRET".into() },
            BusAuth::Token("tok-SECRET".into()),
            BusAuth::NkeySeed { key: "bus.nkey_seed", seed: "SU-SECRET".into() },
            BusAuth::Credentials("jwt-SECRET".into()),
        ] {
            assert!(!format!("{auth:?}").contains("SECRET"));
        }
    }

    #[test]
    fn every_bus_key_comes_from_the_environment() {
        let seed = nkeys::KeyPair::new_user().seed().unwrap();
        let env = |pairs: &[(&str, &str)]| {
            let mut v: Vec<(String, String)> = vec![("MILLRACE_BUS__KIND".into(), "nats".into())];
            v.extend(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
            crate::config::Config::load(None, v, &crate::config::Overrides::default())
        };
        let c = env(&[("MILLRACE_BUS__USER", "worker"), ("MILLRACE_BUS__PASSWORD", "12345678")])
            .unwrap();
        assert_eq!(
            (c.bus.user.as_deref(), c.bus.password.as_deref()),
            (Some("worker"), Some("12345678"))
        );
        let c = env(&[("MILLRACE_BUS__TOKEN", "true")]).unwrap();
        assert_eq!(c.bus.token.as_deref(), Some("true"), "a string key takes the raw value");
        let c = env(&[("MILLRACE_BUS__NKEY_SEED", &seed)]).unwrap();
        assert_eq!(c.bus.nkey_seed.as_deref(), Some(seed.as_str()));
        let c = env(&[("MILLRACE_BUS__REQUIRE_TLS", "true")]).unwrap();
        assert!(c.bus.require_tls);
        for (name, key) in [
            ("MILLRACE_BUS__NKEY_SEED_FILE", "bus.nkey_seed_file"),
            ("MILLRACE_BUS__CREDENTIALS_FILE", "bus.credentials_file"),
            ("MILLRACE_BUS__CA_FILE", "bus.ca_file"),
        ] {
            let e = env(&[(name, "/nonexistent/file")]).unwrap_err().to_string();
            assert!(e.contains(key), "{name}: {e}");
        }
        let e = env(&[
            ("MILLRACE_BUS__CERT_FILE", "/nonexistent/c.pem"),
            ("MILLRACE_BUS__KEY_FILE", "/nonexistent/c.key"),
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("bus.cert_file"), "{e}");
    }
}
