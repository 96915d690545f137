//! The service end to end, over real sockets, against the real simulator: the browser API and its
//! limits (`api`, `http_ws`; hostile clients in `http_hardening`; pings and idle sessions in
//! `ws_liveness`), the ingest supervisor's capacity rules (`supervisor`; a client address's fair
//! share in `churn` and `fair_share`), candles persisted then published through faults and crashes
//! (`ingest_faults`, `crash`, `backfill`), the SQLite store (`store`), order books (`depth_api`,
//! `depth_faults`), the tick-by-tick engine and its books (`l3engine`, `l3_service`,
//! `l3_replay`), and the `millrace replay` commands (`cli_replay_*`); the seams — a second bus
//! and store, shutdown leaving no task (`seams`) — the API's shapes against their `shared`
//! types (`api_shapes`), and no secret in any output (`secrets`).

mod api;
mod api_shapes;
mod backfill;
mod bus_nats;
mod churn;
mod cli_replay_klines;
mod cli_replay_l3;
mod cluster_auth;
mod cluster_forged;
mod cluster_supervisor;
mod cluster_venues;
mod cluster_workers;
mod crash;
mod depth_api;
mod depth_drift;
mod depth_faults;
mod export;
mod fair_share;
mod http_edge;
mod http_hardening;
mod http_ws;
mod ingest_faults;
mod l3_replay;
mod l3_service;
mod l3engine;
mod log_spans;
mod malloc_arenas;
mod playback;
mod recording;
mod seams;
mod secrets;
mod serve_pg_nats;
mod sim_control;
mod sim_restart;
mod store;
mod store_faults;
mod store_pg;
mod store_pg_flood;
mod store_pg_tls;
mod supervisor;
mod venue_books;
mod ws_liveness;
