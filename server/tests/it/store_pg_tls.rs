//! The PostgreSQL store over TLS, against PostgreSQL servers of the tests' own (`ssl = on`, a
//! certificate of a test's authority, `hostssl` / `hostnossl` lines in `pg_hba.conf`): each
//! `sslmode` of `store.url` does what libpq's does, through the service's real store path
//! (`PostgresStore::open`, a write and a read) and its start (`Backends::open`), and a
//! connection that claims TLS is encrypted in PostgreSQL's own view (`pg_stat_ssl`).

use server::app::Backends;
use server::config::StoreKind;
use server::error::report;
use server::store::postgres::PostgresStore;
use server::store::CandleStore;
use testkit::tls::TestCa;
use testkit::OwnPostgres;

use super::store::{all, rows, run, sid};

/// TCP from 127.0.0.1, encrypted only.
const TLS_ONLY: &[&str] = &["hostssl all all 127.0.0.1/32 trust"];

/// The URL of `pg`'s `postgres` database at `host`, with `params` (`sslmode=…&…`).
fn url(pg: &OwnPostgres, host: &str, params: &str) -> String {
    format!("postgres://postgres@{host}:{}/postgres?{params}", pg.port)
}

/// Opens the store at `url`, writes and reads candles through it (at minutes of `tag`'s own),
/// and says whether its connections were encrypted (`pg_stat_ssl.ssl` of each; they are told
/// from others' by an application name of `tag`'s own).
fn store_works(pg: &OwnPostgres, url: &str, tag: i64) -> bool {
    let name = format!("tlstest{tag}");
    let url = match url.starts_with("postgres://") {
        true => format!("{url}&application_name={name}"),
        false => format!("{url} application_name={name}"),
    };
    let store = PostgresStore::open(&url).unwrap_or_else(|e| panic!("{url}: {}", report(&e)));
    let s = sid("sim:spot:BTC/USDT:1m");
    let from = tag * 100 * 60_000;
    store.write(&[rows(&s, &run(from, 10, tag))]).unwrap();
    assert_eq!(store.candles(&s, Some(from), None, 100).unwrap(), run(from, 10, tag), "{url}");
    let encrypted: Vec<bool> = pg
        .socket_client()
        .query(
            "SELECT s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.application_name = $1",
            &[&name],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(!encrypted.is_empty(), "{url}: the store's connections are seen");
    assert!(encrypted.iter().all(|e| *e == encrypted[0]), "{url}: {encrypted:?}");
    encrypted[0]
}

/// Opening fails; the report of the error.
fn refused(url: &str) -> String {
    match PostgresStore::open(url) {
        Ok(_) => panic!("{url} connected"),
        Err(e) => report(&e),
    }
}

/// `require` encrypts without checking the certificate; `verify-ca` checks its chain and
/// `verify-full` its host too, each failing at start with an error naming `store.url`; a
/// client certificate authenticates; a server that takes only TLS refuses `disable`, and
/// `prefer` takes TLS there.
#[test]
fn each_sslmode_does_what_libpqs_does_on_a_server_that_requires_tls() {
    let dir = testkit::temp_dir("pg-tls");
    let ca = TestCa::new(&dir.join("ca"));
    let other_ca = TestCa::new(&dir.join("other-ca"));
    // the certificate names the address only, so `localhost` is a host it does not name
    let mut hba = vec!["hostssl all certuser 127.0.0.1/32 cert"];
    hba.extend_from_slice(TLS_ONLY);
    let pg = OwnPostgres::start_tls(dir.join("pg"), &ca, &["127.0.0.1"], &hba);
    let root = ca.ca_file();
    let root = root.display();
    let other = other_ca.ca_file();
    let other = other.display();

    // encrypted, whatever the certificate
    assert!(store_works(&pg, &url(&pg, "127.0.0.1", "sslmode=require"), 1));
    let wrong_root = format!("sslmode=require&sslrootcert={other}");
    let e = refused(&url(&pg, "127.0.0.1", &wrong_root));
    assert!(e.contains("sslmode=verify-ca") && e.contains("invalid peer certificate"), "{e}");
    // the chain and the host
    let full = format!("sslmode=verify-full&sslrootcert={root}");
    assert!(store_works(&pg, &url(&pg, "127.0.0.1", &full), 2));
    let ca_only = format!("sslmode=verify-ca&sslrootcert={root}");
    assert!(store_works(&pg, &url(&pg, "localhost", &ca_only), 3));
    // (both authorities have the same name, so the other one's chain fails on its signature)
    for (host, params, reason) in [
        ("localhost", full.clone(), "not valid for name"),
        ("127.0.0.1", format!("sslmode=verify-full&sslrootcert={other}"), "BadSignature"),
        ("127.0.0.1", format!("sslmode=verify-ca&sslrootcert={other}"), "BadSignature"),
    ] {
        let e = refused(&url(&pg, host, &params));
        assert!(e.contains("`store.url`"), "{host} {params}: {e}");
        assert!(e.contains("invalid peer certificate") && e.contains(reason), "{e}");
    }
    // a client certificate: the server knows the user by it
    let client = ca.client("certuser");
    pg.socket_client().batch_execute("CREATE ROLE certuser LOGIN SUPERUSER").unwrap();
    let cert_url = |with_cert: bool| {
        let mut params = full.clone();
        if with_cert {
            params +=
                &format!("&sslcert={}&sslkey={}", client.cert.display(), client.key.display());
        }
        format!("postgres://certuser@127.0.0.1:{}/postgres?{params}", pg.port)
    };
    assert!(store_works(&pg, &cert_url(true), 4));
    let e = refused(&cert_url(false));
    assert!(e.contains("certificate"), "{e}");
    // the server takes TLS only
    let e = refused(&url(&pg, "127.0.0.1", "sslmode=disable"));
    assert!(e.contains("no encryption") && e.contains("store.url"), "{e}");
    assert!(store_works(&pg, &url(&pg, "127.0.0.1", "sslmode=prefer"), 5));
    assert!(
        store_works(&pg, &url(&pg, "127.0.0.1", "connect_timeout=10"), 6),
        "prefer, by default"
    );
    // and the key=value form reads the same parameters
    let kv = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=verify-full \
         sslrootcert='{root}'",
        pg.port
    );
    assert!(store_works(&pg, &kv, 7));
    let s = sid("sim:spot:BTC/USDT:1m");
    let store = PostgresStore::open(&url(&pg, "127.0.0.1", &full)).unwrap();
    assert_eq!(all(&store, &s).len(), 70, "every connection wrote to the same server");
}

/// The service does not start on a `verify-full` URL whose host the certificate does not
/// name; its error names `store.url` and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_does_not_start_when_verify_full_fails() {
    let dir = testkit::temp_dir("pg-tls-start");
    let ca = TestCa::new(&dir.join("ca"));
    let pg = tokio::task::block_in_place(|| {
        OwnPostgres::start_tls(dir.join("pg"), &ca, &["127.0.0.1"], TLS_ONLY)
    });
    let mut config = testkit::test_config(vec![]);
    config.store.kind = StoreKind::Postgres;
    let params = format!("sslmode=verify-full&sslrootcert={}", ca.ca_file().display());
    config.store.url = Some(url(&pg, "localhost", &params));
    let e = match Backends::open(&config).await {
        Ok(_) => panic!("started"),
        Err(e) => report(&e),
    };
    assert!(e.contains("configuration key `store.url`"), "{e}");
    assert!(e.contains("sslmode=verify-full") && e.contains("not valid for name"), "{e}");
    config.store.url = Some(url(&pg, "127.0.0.1", &params));
    let backends = Backends::open(&config).await.unwrap();
    tokio::task::block_in_place(move || drop(backends));
}

/// `prefer` as libpq: a server that does not offer TLS is talked to in the clear, and so is one
/// whose `pg_hba.conf` refuses the encrypted session but takes a plain one; `require` connects
/// to neither.
#[test]
fn prefer_falls_back_to_the_clear_as_libpq_does() {
    let dir = testkit::temp_dir("pg-prefer");
    let ca = TestCa::new(&dir.join("ca"));
    let plain_only = ["hostnossl all all 127.0.0.1/32 trust"];
    let tls_refused = OwnPostgres::start_tls(dir.join("nossl"), &ca, &["127.0.0.1"], &plain_only);
    let no_tls = OwnPostgres::start(dir.join("off"));
    for pg in [&tls_refused, &no_tls] {
        assert!(!store_works(pg, &url(pg, "127.0.0.1", "sslmode=prefer"), 1));
        assert!(!store_works(pg, &url(pg, "127.0.0.1", "sslmode=disable"), 2));
        let e = refused(&url(pg, "127.0.0.1", "sslmode=require"));
        assert!(e.contains("sslmode=require"), "{e}");
    }
}
