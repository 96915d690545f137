//! What more than one of millrace's load tools needs.

/// Deletes the JetStream streams a cluster under `prefix` makes (closed candles, diffs, the
/// lease bucket), so a run leaves nothing on a shared NATS server.
pub async fn remove_cluster_streams(nats: &str, prefix: &str) {
    let Ok(client) = async_nats::connect(nats).await else { return };
    let js = async_nats::jetstream::new(client);
    server::cluster::remove_streams(&js, &server::cluster::Subjects::new(prefix)).await;
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
