//! [`RoleLease`]: one holder at a time of a role (`leader` for the supervisors, `persister` for the
//! persisters), a key in the JetStream KV bucket `{prefix}_cluster` whose entries live
//! `lease_s`. The holder renews it every tick with a revision-checked update; when it stops
//! (killed, partitioned) the entry ages out and a standby creates it. The revision it was
//! created with is the new holder's epoch.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use bytes::Bytes;

/// A role's lease, as seen by one candidate.
pub struct RoleLease {
    kv: async_nats::jetstream::kv::Store,
    key: &'static str,
    id: String,
    /// The revision of our last write while we hold it.
    revision: Option<u64>,
}

impl RoleLease {
    /// Candidate `id` for the role `key` of `kv`.
    pub fn new(kv: async_nats::jetstream::kv::Store, key: &'static str, id: &str) -> Self {
        RoleLease { kv, key, id: id.to_string(), revision: None }
    }

    /// Whether this candidate holds the lease (as of its last [`RoleLease::keep`]).
    pub fn held(&self) -> bool {
        self.revision.is_some()
    }

    /// Renews or tries to take the lease; returns the epoch when this call took it, `Err` when
    /// we lost it. `errors` counts failed renewals.
    pub async fn keep(&mut self, errors: &AtomicU64) -> Result<Option<u64>, ()> {
        let value = Bytes::from(self.id.clone());
        match self.revision {
            Some(rev) => match self.kv.update(self.key, value, rev).await {
                Ok(r) => {
                    self.revision = Some(r);
                    Ok(None)
                }
                Err(e) => {
                    tracing::warn!(key = self.key, error = %e, "lost the lease");
                    errors.fetch_add(1, Relaxed);
                    self.revision = None;
                    Err(())
                }
            },
            None => match self.kv.create(self.key, value).await {
                Ok(r) => {
                    self.revision = Some(r);
                    Ok(Some(r))
                }
                Err(_) => Ok(None), // someone holds it (or NATS is away): stand by
            },
        }
    }

    /// The current holder's id, if any.
    pub async fn holder(&self) -> Option<String> {
        match self.kv.get(self.key).await {
            Ok(Some(v)) => Some(String::from_utf8_lossy(&v).into_owned()),
            _ => None,
        }
    }

    /// Gives the lease up at once (shutdown), so a standby need not wait for it to age out.
    pub async fn release(&mut self) {
        if self.revision.take().is_some() {
            let _ = self.kv.purge(self.key).await;
        }
    }
}
