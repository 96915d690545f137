//! `millrace serve` on the cluster's backends, PostgreSQL (`[store]`) and NATS (`[bus]`), on the
//! machine's real servers with a database and a subject prefix of its own: closed candles are
//! stored before any client sees them, exactly as on SQLite and the in-process bus.

use server::config::{BusKind, StoreKind};
use testkit::PgDb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_candles_are_stored_in_postgres_before_clients_see_them_over_nats() {
    // (the postgres client is blocking: off the runtime's threads)
    let db = tokio::task::block_in_place(|| PgDb::fresh("serve"));
    let url = db.url().to_string();
    super::api::stored_before_seen(|c| {
        c.store.kind = StoreKind::Postgres;
        c.store.url = Some(url);
        c.bus.kind = BusKind::Nats;
        c.bus.url =
            std::env::var("MILLRACE_TEST_NATS").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
        c.bus.prefix = format!("tserve{}", std::process::id());
    })
    .await;
    let n: i64 = tokio::task::block_in_place(|| {
        let n = db.client().query_one("SELECT count(*) FROM candles", &[]).unwrap().get(0);
        drop(db);
        n
    });
    assert!(n >= 12, "{n} candles in PostgreSQL");
}
