//! The tick-by-tick books as the API reaches them: in this process ([`L3Access::Here`]), or in
//! another one ([`L3Access::Remote`]) through the [`RemoteBooks`] plug point, which a layer
//! around the service fills (a cluster gateway asks the worker that hosts them; see
//! `crate::cluster::l3`). The API answers the same either way, with the same typed
//! [`Refusal`]s.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use shared::protocol::ops::{
    AutoBalanceReply, AutoBalanceRequest, BookInfo, EngineStats, HotspotReply, HotspotRequest,
    MigrateReply, MigrateRequest, ShardsReport,
};
use shared::protocol::{BookHealth, InstrumentId, RestDepth};

use super::control::Refusal;
use super::L3Books;

/// What the API asks of tick-by-tick books that run in another process.
pub trait RemoteBooks: Send + Sync + 'static {
    /// Whether `instrument`'s book is one of them.
    fn serves(&self, instrument: &InstrumentId) -> bool;
    /// The engine's report.
    fn shards(&self) -> BoxFuture<'_, Result<ShardsReport, Refusal>>;
    /// A book as last published, with its health (`None`: no such book there).
    fn depth(
        &self,
        instrument: &InstrumentId,
        limit: usize,
    ) -> BoxFuture<'_, Result<Option<(RestDepth, BookHealth)>, Refusal>>;
    /// Every book published there.
    fn books(&self) -> BoxFuture<'_, Result<Vec<BookInfo>, Refusal>>;
    fn migrate(&self, req: MigrateRequest) -> BoxFuture<'_, Result<MigrateReply, Refusal>>;
    fn auto_balance(
        &self,
        req: AutoBalanceRequest,
    ) -> BoxFuture<'_, Result<AutoBalanceReply, Refusal>>;
    fn hotspot(&self, req: HotspotRequest) -> BoxFuture<'_, Result<HotspotReply, Refusal>>;
    /// The engine's stats as last reported (for `/metrics`).
    fn engine(&self) -> Option<EngineStats>;
    /// What `/healthz` says while they do not answer.
    fn problem(&self) -> Option<String>;
}

/// The tick-by-tick books as the API reaches them: in this process, or in another.
pub enum L3Access {
    Here(Arc<L3Books>),
    Remote(Arc<dyn RemoteBooks>),
}

impl L3Access {
    /// The books, when this process runs them.
    pub fn here(&self) -> Option<&Arc<L3Books>> {
        match self {
            L3Access::Here(books) => Some(books),
            L3Access::Remote(_) => None,
        }
    }

    /// The other process's books, when another process runs them.
    pub fn remote(&self) -> Option<&Arc<dyn RemoteBooks>> {
        match self {
            L3Access::Here(_) => None,
            L3Access::Remote(r) => Some(r),
        }
    }

    pub async fn shards(&self) -> Result<ShardsReport, Refusal> {
        match self {
            L3Access::Here(books) => Ok(books.shards().await),
            L3Access::Remote(r) => r.shards().await,
        }
    }

    pub async fn migrate(&self, req: MigrateRequest) -> Result<MigrateReply, Refusal> {
        match self {
            L3Access::Here(books) => books.migrate(&req),
            L3Access::Remote(r) => r.migrate(req).await,
        }
    }

    pub async fn auto_balance(&self, req: AutoBalanceRequest) -> Result<AutoBalanceReply, Refusal> {
        match self {
            L3Access::Here(books) => Ok(books.auto_balance(&req)),
            L3Access::Remote(r) => r.auto_balance(req).await,
        }
    }

    pub async fn hotspot(&self, req: HotspotRequest) -> Result<HotspotReply, Refusal> {
        match self {
            L3Access::Here(books) => books.hotspot(&req).await,
            L3Access::Remote(r) => r.hotspot(req).await,
        }
    }

    /// The engine's stats, for `/metrics` (a remote host's as last reported).
    pub fn engine(&self) -> Option<EngineStats> {
        match self {
            L3Access::Here(books) => Some(books.handle.stats()),
            L3Access::Remote(r) => r.engine(),
        }
    }

    /// Stops the books if they run here.
    pub async fn stop(&self) {
        if let L3Access::Here(books) = self {
            books.stop().await;
        }
    }
}
