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

pub mod candles;
pub mod config;
pub mod depth;
pub mod gateway;
pub mod lease;
pub mod supervisor;
pub mod worker;

use std::time::Duration;

use crate::cluster::config::BusConfig;

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

/// Why a role could not reach NATS at start.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("configuration key `bus.url`: cannot connect to NATS at {url}")]
    Nats {
        url: String,
        #[source]
        source: async_nats::ConnectError,
    },
}

/// Connects to `[bus] url`. At start an unreachable server is an error naming the key (and the
/// URL, redacted); once connected, the client reconnects by itself (with back-off) for as long
/// as the process runs. The addresses reach async-nats without their userinfo: it does not use
/// one, and its debug log prints each address it tries in full.
pub async fn connect(bus: &BusConfig, name: &str) -> Result<async_nats::Client, ConnectError> {
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
    async_nats::ConnectOptions::new()
        .name(name)
        .connection_timeout(Duration::from_secs(5))
        .max_reconnects(None)
        .connect(addrs)
        .await
        .map_err(|source| ConnectError::Nats { url: crate::redact::redact(&bus.url), source })
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
