//! The cluster of seeds/supervisor-worker-load-balancing.md on NATS: the roles' shells around
//! `shared::cluster` (which decides), the subjects they talk on, and `[bus]` / `[store]` /
//! `[cluster]` configuration.
//!
//! Every message is one-way JSON on a subject under `[bus] prefix`:
//!
//! | subject | from → to | body |
//! |---|---|---|
//! | `{prefix}.cluster.status` | every worker, every `status_interval_ms` and on change → supervisors | `WorkerStatus` |
//! | `{prefix}.cluster.demand` | every gateway, likewise → supervisors | `Demand` |
//! | `{prefix}.cluster.instr.{worker}` | the leader → one worker | `Instructions` |
//! | `{prefix}.cluster.report` | request/reply: anyone → the leader | `ClusterReport` |
//! | `{prefix}.candles.{series}` | workers → JetStream `{prefix}_candles` → the persister | `ClosedCandles` |
//! | `{prefix}.bus.{topic}` | workers (forming), the persister (stored) → gateways | push frames |
//! | `{prefix}.diffs.{instrument}` | workers → JetStream `{prefix}_depth` → gateways | the exchange's diff frames |
//! | `{prefix}.booksnap.{instrument}` | request/reply: a gateway → the synced holders | `BookSnapshotReply` |
//!
//! The leader holds the key `leader` of the JetStream KV bucket `{prefix}_cluster`, whose
//! entries live `lease_s`: the leader renews it every tick with a revision-checked update; when
//! it stops (killed, partitioned) the entry ages out and a standby creates it. The revision it
//! was created with is the new leader's epoch, which every instruction set carries.
//!
//! Each process connects as its [`Role`] ([`connect`]): with `[bus]`'s credentials and TLS, its
//! replies (requests' inboxes, JetStream's answers, consumers' deliveries) under
//! `_INBOX.{prefix}.{role}.` ([`inbox_prefix`]). docs/nats/millrace.conf gives each role a user
//! of one account, allowed to publish only the subjects above that its role sends (and the
//! JetStream API and KV subjects it uses) and to read only its own; the bus is trusted as far as
//! those permissions go.

pub mod bounds;
pub mod candles;
pub mod depth;
pub mod gateway;
pub mod l3;
pub mod lease;
pub mod proof;
pub mod relay;
pub mod supervisor;
pub mod worker;

use std::time::Duration;

use crate::config::{BusAuth, BusConfig};

/// Subjects of one cluster.
#[derive(Debug, Clone)]
pub struct Subjects {
    pub prefix: String,
}

impl Subjects {
    pub fn new(prefix: &str) -> Self {
        Subjects { prefix: prefix.to_string() }
    }
    pub fn status(&self) -> String {
        format!("{}.cluster.status", self.prefix)
    }
    pub fn demand(&self) -> String {
        format!("{}.cluster.demand", self.prefix)
    }
    pub fn instructions(&self, worker: &str) -> String {
        format!("{}.cluster.instr.{worker}", self.prefix)
    }
    pub fn report(&self) -> String {
        format!("{}.cluster.report", self.prefix)
    }
    /// The JetStream stream of closed candles on their way to the store.
    pub fn candle_stream(&self) -> String {
        format!("{}_candles", self.prefix)
    }
    /// The subject of `series`' closed candles in [`Subjects::candle_stream`].
    pub fn candles(&self, series: &shared::protocol::SeriesId) -> String {
        format!("{}.candles.{}", self.prefix, crate::bus::nats::token(&series.to_string()))
    }
    /// The KV bucket of the leases (`leader`, `persister`).
    pub fn lease_bucket(&self) -> String {
        format!("{}_cluster", self.prefix)
    }
    /// The JetStream stream of depth diffs.
    pub fn depth_stream(&self) -> String {
        format!("{}_depth", self.prefix)
    }
    /// Every JetStream stream a cluster under this prefix makes (closed candles, diffs, the
    /// lease bucket's).
    pub fn streams(&self) -> [String; 3] {
        [self.candle_stream(), self.depth_stream(), format!("KV_{}", self.lease_bucket())]
    }
}

/// Deletes the JetStream streams of the cluster under `subjects`' prefix (a test run or a
/// load tool that is done): the diff stream holds a memory reservation in the NATS server for
/// as long as it exists.
pub async fn remove_streams(js: &async_nats::jetstream::Context, subjects: &Subjects) {
    for name in subjects.streams() {
        let _ = js.delete_stream(name).await;
    }
}

/// The part a process plays on the bus. Its reply subjects (requests' inboxes, JetStream's
/// acknowledgements and consumers' deliveries) live under [`inbox_prefix`], so a NATS server
/// can give each role's user the replies of that role only (docs/nats/).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Supervisor,
    Worker,
    /// `millrace serve` on NATS (a cluster's gateway, or a single server on the NATS bus).
    Gateway,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Supervisor => "supervisor",
            Role::Worker => "worker",
            Role::Gateway => "gateway",
        }
    }
}

/// The subjects `role`'s replies arrive on: `_INBOX.{prefix}.{role}.…`.
pub fn inbox_prefix(prefix: &str, role: Role) -> String {
    format!("_INBOX.{prefix}.{}", role.name())
}

/// Why a role could not reach NATS at start.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("configuration key `bus.url`: cannot connect to NATS at {url}")]
    Nats {
        url: String,
        #[source]
        source: async_nats::ConnectError,
    },
    /// The server refused what `key` configures: the credentials, the client certificate, a
    /// connection without TLS, or the server's certificate was not trusted.
    #[error("configuration key `{key}`: {problem}")]
    Refused {
        key: &'static str,
        problem: String,
        #[source]
        source: async_nats::ConnectError,
    },
    /// A credentials file that can no longer be read (it was checked at start).
    #[error(transparent)]
    Config(#[from] crate::config::cluster::InvalidKey),
}

/// Connects to `[bus] url` as `role` (`name` is the connection's name in the server's
/// monitoring), with `[bus]`'s credentials and TLS. One attempt per server URL: an unreachable
/// server, refused credentials or a failed TLS handshake is an error naming the key at once;
/// once connected, the client reconnects by itself (with back-off) for as long as the process
/// runs. What the server reports later (a permission the role lacks, credentials refused on a
/// reconnect) is logged.
pub async fn connect(
    bus: &BusConfig,
    role: Role,
    name: &str,
) -> Result<async_nats::Client, ConnectError> {
    // (the addresses reach async-nats without userinfo: validation refuses credentials in the
    // URL, and its debug log prints each address it tries in full)
    let addrs: Vec<async_nats::ServerAddr> = bus
        .url
        .split(',')
        .filter_map(|u| u.trim().parse::<async_nats::ServerAddr>().ok())
        .filter_map(|a| {
            let mut url = a.into_inner();
            let _ = url.set_password(None);
            let _ = url.set_username("");
            async_nats::ServerAddr::from_url(url).ok()
        })
        .collect();
    let options = async_nats::ConnectOptions::new()
        .name(name)
        .custom_inbox_prefix(inbox_prefix(&bus.prefix, role))
        .connection_timeout(Duration::from_secs(5))
        .max_reconnects(None)
        .event_callback(move |event| async move { log_event(role, event) });
    let options = match bus.auth()? {
        BusAuth::None => options,
        BusAuth::UserPassword { user, password } => options.user_and_password(user, password),
        BusAuth::Token(token) => options.token(token),
        BusAuth::NkeySeed { seed, .. } => options.nkey(seed),
        BusAuth::Credentials(text) => {
            options.credentials(&text).map_err(|e| crate::config::cluster::InvalidKey {
                key: "bus.credentials_file".into(),
                problem: format!("not a NATS credentials file: {e}"),
            })?
        }
    };
    let mut options = options.require_tls(bus.tls_required());
    if let Some(ca) = &bus.ca_file {
        options = options.add_root_certificates(ca.clone());
    }
    if let (Some(cert), Some(key)) = (&bus.cert_file, &bus.key_file) {
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    options.connect(addrs).await.map_err(|source| match refusal(bus, &source) {
        Some((key, problem)) => ConnectError::Refused { key, problem, source },
        None => ConnectError::Nats { url: crate::redact::redact(&bus.url), source },
    })
}

/// What the NATS client reports after connecting, at the level it deserves (the client logs
/// every event at `info` itself): a server error is mostly a permission this role's user lacks
/// (`Permissions Violation for Publish to …`), which would otherwise fail quietly.
fn log_event(role: Role, event: async_nats::Event) {
    use async_nats::Event;
    let role = role.name();
    match event {
        Event::ServerError(e) => {
            tracing::error!(role, error = %e, "NATS server refused a request of this process")
        }
        Event::ClientError(e) => tracing::warn!(role, error = %e, "NATS client error"),
        Event::SlowConsumer(sid) => tracing::warn!(role, sid, "NATS: a subscription falls behind"),
        Event::Disconnected => tracing::warn!(role, "NATS connection lost, reconnecting"),
        Event::LameDuckMode => tracing::warn!(role, "NATS server entering lame duck mode"),
        Event::Connected | Event::Draining | Event::Closed => {}
    }
}

/// The key to blame when the server refused the connection (credentials, TLS), with what to
/// do; `None` when it was not reached at all (then `bus.url` is named).
fn refusal(bus: &BusConfig, e: &async_nats::ConnectError) -> Option<(&'static str, String)> {
    use async_nats::rustls::{AlertDescription as Alert, Error as Tls};
    use async_nats::ConnectErrorKind as Kind;
    match e.kind() {
        Kind::AuthorizationViolation | Kind::Authentication => {
            let problem = match bus.auth().unwrap_or(BusAuth::None) {
                BusAuth::None if bus.auth_key() != "bus.user" => {
                    "NATS refused the credentials".to_string()
                }
                BusAuth::None => "the NATS server requires authentication: set bus.user and \
                                  bus.password, bus.token, bus.nkey_seed_file or \
                                  bus.credentials_file"
                    .to_string(),
                BusAuth::UserPassword { user, .. } => format!(
                    "NATS refused user {user:?} with this password (an unknown user, a wrong \
                     password, or a certificate the server maps to another user)"
                ),
                BusAuth::Token(_) => "NATS refused this token".to_string(),
                BusAuth::NkeySeed { .. } => "NATS refused this nkey (its public key is not one \
                                             of the server's users)"
                    .to_string(),
                BusAuth::Credentials(_) => "NATS refused these credentials (a user JWT not \
                                            signed by an account the server trusts, expired or \
                                            revoked)"
                    .to_string(),
            };
            return Some((bus.auth_key(), problem));
        }
        Kind::Tls => {
            let key = if bus.cert_file.is_some() { "bus.cert_file" } else { "bus.ca_file" };
            return Some((key, "cannot set up TLS with these files".into()));
        }
        _ => {}
    }
    let tls = rustls_error(e)?;
    Some(match tls {
        Tls::InvalidCertificate(_) => (
            "bus.ca_file",
            "the NATS server's certificate is not trusted: bus.ca_file must name the authority \
             that signed it, and the URL's host must be one of its names"
                .to_string(),
        ),
        Tls::AlertReceived(
            Alert::BadCertificate
            | Alert::UnknownCA
            | Alert::CertificateRequired
            | Alert::CertificateUnknown
            | Alert::CertificateExpired
            | Alert::CertificateRevoked
            | Alert::UnsupportedCertificate
            | Alert::AccessDenied,
        ) => match &bus.cert_file {
            Some(_) => (
                "bus.cert_file",
                "the NATS server refused this client certificate (not signed by an authority it \
                 trusts, or expired)"
                    .to_string(),
            ),
            None => (
                "bus.cert_file",
                "the NATS server asks for a client certificate: set bus.cert_file and \
                 bus.key_file"
                    .to_string(),
            ),
        },
        Tls::InvalidMessage(_) | Tls::InappropriateMessage { .. } => {
            (bus.tls_key(), "the NATS server does not answer in TLS, which is required".to_string())
        }
        _ => (bus.tls_key(), "TLS with the NATS server failed".to_string()),
    })
}

/// The TLS error at the root of a failed connection, if it was one.
fn rustls_error(e: &async_nats::ConnectError) -> Option<&async_nats::rustls::Error> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(err) = next {
        if let Some(tls) = err.downcast_ref::<async_nats::rustls::Error>() {
            return Some(tls);
        }
        // io::Error's `source` skips the error it wraps
        if let Some(inner) = err.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
            if let Some(tls) = inner.downcast_ref::<async_nats::rustls::Error>() {
                return Some(tls);
            }
        }
        next = err.source();
    }
    None
}

/// The KV bucket `bucket` whose entries live `max_age`, created if missing. The bucket's stream
/// is made here with the KV conventions (`KV_{bucket}` on `$KV.{bucket}.>`, one message per key,
/// roll-ups, direct gets) rather than by the client's `create_key_value`, whose account query
/// does not parse the answer of the NATS 2.9 server these machines run.
pub async fn kv_bucket(
    js: &async_nats::jetstream::Context,
    bucket: &str,
    max_age: Duration,
) -> Result<async_nats::jetstream::kv::Store, async_nats::Error> {
    use async_nats::jetstream::stream;
    js.get_or_create_stream(stream::Config {
        name: format!("KV_{bucket}"),
        subjects: vec![format!("$KV.{bucket}.>")],
        max_messages_per_subject: 1,
        max_age,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        discard: stream::DiscardPolicy::New,
        ..Default::default()
    })
    .await?;
    Ok(js.get_key_value(bucket).await?)
}
