//! What more than one of millrace's load tools needs.

use anyhow::{bail, Context as _};

/// A database of one run's own on a PostgreSQL server, created by [`FreshDb::create`] and
/// dropped (with its connections) when this is dropped. Blocking: create and drop it outside
/// the async runtime's worker threads (the sync client runs a runtime of its own).
pub struct FreshDb {
    admin: String,
    name: String,
    /// The URL of the new database.
    pub url: String,
}

impl FreshDb {
    /// Creates `millrace_<tag>_<pid>` on the server of `admin` (a `postgres://` URL of a
    /// database there, whose user may create databases).
    pub fn create(admin: &str, tag: &str) -> anyhow::Result<FreshDb> {
        let name = format!("millrace_{tag}_{}", std::process::id());
        let url = match admin.rfind('/') {
            Some(i) if admin[..i].contains("://") => format!("{}/{name}", &admin[..i]),
            _ => bail!("--pg must be a postgres:// URL ending in /DATABASE, not {admin:?}"),
        };
        let mut c = postgres::Client::connect(admin, postgres::NoTls)
            .with_context(|| format!("cannot connect to PostgreSQL at --pg {admin}"))?;
        c.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .and_then(|()| c.batch_execute(&format!("CREATE DATABASE {name}")))
            .with_context(|| format!("cannot create the database {name}"))?;
        Ok(FreshDb { admin: admin.to_string(), name, url })
    }
}

impl Drop for FreshDb {
    fn drop(&mut self) {
        if let Ok(mut c) = postgres::Client::connect(&self.admin, postgres::NoTls) {
            let _ = c.batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name));
        }
    }
}

/// Deletes the JetStream streams a cluster under `prefix` makes (closed candles, diffs, the
/// lease bucket), so a run leaves nothing on a shared NATS server.
pub async fn remove_cluster_streams(nats: &str, prefix: &str) {
    let Ok(client) = async_nats::connect(nats).await else { return };
    let js = async_nats::jetstream::new(client);
    let subjects = server::cluster::Subjects::new(prefix);
    let _ = js.delete_stream(subjects.candle_stream()).await;
    let _ = js.delete_stream(format!("{prefix}_depth")).await;
    let _ = js.delete_stream(format!("KV_{}", subjects.lease_bucket())).await;
}

/// Milliseconds since the Unix epoch, by the wall clock (what exchanges stamp events with).
pub fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A child process, killed (and reaped) however the run that started it ends.
pub struct KillOnDrop(pub std::process::Child);

impl KillOnDrop {
    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
