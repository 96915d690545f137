//! How the PostgreSQL store reaches its server: `store.url` read as libpq reads it, and TLS with
//! rustls (no OpenSSL).
//!
//! `store.url` is a `postgres://` URL or a libpq `key=value` string. tokio-postgres parses both,
//! but knows only `sslmode=disable|prefer|require` and none of libpq's certificate parameters, so
//! [`PgUrl::parse`] (in `config::pg_url`: it is configuration) takes libpq's TLS parameters out
//! first and hands it the rest:
//! - `sslmode` (libpq's meanings):
//!   - `disable`: no TLS;
//!   - `prefer`, the default (as libpq's): TLS when the server offers it, the certificate not
//!     checked; a server that does not offer TLS is talked to in the clear, and so is one whose
//!     TLS session failed (a handshake error, or `pg_hba.conf` refusing the encrypted session but
//!     not a plain one): libpq tries once more without TLS then, and so does millrace. Anyone on
//!     the path can make `prefer` fall back to the clear: it protects against listeners at best;
//!   - `require`: TLS or no connection, the certificate not checked (encryption without
//!     authentication, as libpq) — but with `sslrootcert` given, as `verify-ca` (libpq's rule);
//!   - `verify-ca`: the server's certificate must chain to a root of `sslrootcert`;
//!   - `verify-full`: and name the host connected to (a DNS name or IP address of the
//!     certificate's subject alternative names);
//!   - `allow` (plain first, TLS if refused) is not supported: an error names it.
//! - `sslrootcert`: a PEM file of the roots `verify-*` trusts, or `system` (as libpq 16): the
//!   system's trusted certificates. Without it, `verify-ca` and `verify-full` trust the system's
//!   certificates too (libpq would read `root.crt` in the user's `.postgresql` folder; millrace
//!   reads nothing from a home directory): a server with a certificate of a private authority
//!   needs `sslrootcert`.
//! - `sslcert` and `sslkey`: a client certificate (PEM chain) and its private key, both or
//!   neither.
//!
//! Other libpq TLS parameters (`sslcrl`, `sslpassword`, `sslsni`, …) are refused by
//! tokio-postgres as unknown options: an error names them rather than ignoring them.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;

use postgres::config::SslMode as WireMode;
use postgres::tls::{MakeTlsConnect, TlsConnect};
use postgres::{Client, NoTls, Socket};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_cert_signed_by_trust_anchor, WebPkiServerVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

pub use crate::config::pg_url::{PgUrl, Roots, SslMode, UrlError};

/// A connection that could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PgConnectError {
    #[error(transparent)]
    Pg(#[from] postgres::Error),
    /// `prefer`: the connection over TLS failed after TLS started, and so did the one without.
    #[error("over TLS: {tls}; then without TLS (sslmode=prefer)")]
    Prefer {
        tls: String,
        #[source]
        plain: postgres::Error,
    },
}

/// Opens connections as a [`PgUrl`] says; its certificate files are read once, by
/// [`Connector::new`].
pub struct Connector {
    config: postgres::Config,
    /// `config` without TLS, for `prefer`'s second try.
    plain: postgres::Config,
    mode: SslMode,
    /// `None` with `disable`.
    tls: Option<MakeRustlsConnect>,
}

impl Connector {
    /// Reads the certificates `url` names and builds the TLS configuration.
    pub fn new(url: PgUrl) -> Result<Connector, UrlError> {
        let mode = url.effective_mode();
        let tls = match mode {
            SslMode::Disable => None,
            _ => Some(MakeRustlsConnect::new(client_config(
                mode,
                url.roots.as_ref().unwrap_or(&Roots::System),
                url.client_cert.as_ref(),
            )?)),
        };
        let mut plain = url.config.clone();
        plain.ssl_mode(WireMode::Disable);
        Ok(Connector { config: url.config, plain, mode, tls })
    }

    /// The `sslmode` in effect.
    pub fn mode(&self) -> SslMode {
        self.mode
    }

    /// A new connection (blocking).
    pub fn connect(&self) -> Result<Client, PgConnectError> {
        let Some(tls) = &self.tls else {
            return Ok(self.config.connect(NoTls)?);
        };
        let started = Arc::new(AtomicBool::new(false));
        let connector = Watched { inner: tls.clone(), started: started.clone() };
        match self.config.connect(connector) {
            Err(e) if self.mode == SslMode::Prefer && started.load(SeqCst) => self
                .plain
                .connect(NoTls)
                .map_err(|plain| PgConnectError::Prefer { tls: crate::error::report(&e), plain }),
            other => Ok(other?),
        }
    }
}

/// The rustls configuration of `mode`.
fn client_config(
    mode: SslMode,
    roots: &Roots,
    client_cert: Option<&(PathBuf, PathBuf)>,
) -> Result<ClientConfig, UrlError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let algs = provider.signature_verification_algorithms;
    let verifier: Arc<dyn ServerCertVerifier> = match mode {
        SslMode::VerifyFull => WebPkiServerVerifier::builder_with_provider(
            Arc::new(root_store(mode, roots)?),
            provider.clone(),
        )
        .build()
        .map_err(|e| UrlError::Tls(rustls::Error::General(e.to_string())))?,
        SslMode::VerifyCa => Arc::new(Lenient { roots: Some(root_store(mode, roots)?), algs }),
        _ => Arc::new(Lenient { roots: None, algs }),
    };
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(UrlError::Tls)?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    match client_cert {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key)) => {
            let chain = certificates("sslcert", cert)?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|source| UrlError::Read {
                param: "sslkey",
                path: key.clone(),
                source,
            })?;
            builder.with_client_auth_cert(chain, key).map_err(UrlError::ClientCert)
        }
    }
}

/// The certificates of a PEM file (at least one).
fn certificates(
    param: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, UrlError> {
    let read = |source| UrlError::Read { param, path: path.to_path_buf(), source };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(read)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read)?;
    if certs.is_empty() {
        return Err(UrlError::NoCertificate { param, path: path.to_path_buf() });
    }
    Ok(certs)
}

/// The roots `verify-*` trusts.
fn root_store(mode: SslMode, roots: &Roots) -> Result<RootCertStore, UrlError> {
    let mut store = RootCertStore::empty();
    match roots {
        Roots::File(path) => {
            let certs = certificates("sslrootcert", path)?;
            let (added, rejected) = store.add_parsable_certificates(certs);
            if added == 0 {
                return Err(UrlError::NoUsableRoot { path: path.clone(), rejected });
            }
        }
        Roots::System => {
            let certs = rustls_native_certs::load_native_certs()
                .map_err(|e| UrlError::NoSystemRoots { mode, source: Some(e) })?;
            store.add_parsable_certificates(certs);
            if store.is_empty() {
                return Err(UrlError::NoSystemRoots { mode, source: None });
            }
        }
    }
    Ok(store)
}

/// The modes that do not check the certificate's names, as libpq: `prefer` and `require` take
/// any certificate (`roots` is `None`), `verify-ca` one that chains to a trusted root. Either
/// way the handshake's signatures are checked, so the session is with the holder of the key of
/// the certificate shown.
#[derive(Debug)]
struct Lenient {
    roots: Option<RootCertStore>,
    algs: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Some(roots) = &self.roots {
            let cert = ParsedCertificate::try_from(end_entity)?;
            verify_server_cert_signed_by_trust_anchor(
                &cert,
                roots,
                intermediates,
                now,
                self.algs.all,
            )?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

/// The rustls connector, noting whether a TLS handshake began (the server accepted the TLS
/// request): what `prefer` needs to know to try again without TLS, as libpq does.
struct Watched {
    inner: MakeRustlsConnect,
    started: Arc<AtomicBool>,
}

/// [`Watched`]'s connector for one host.
struct WatchedConnect<T> {
    inner: T,
    started: Arc<AtomicBool>,
}

impl MakeTlsConnect<Socket> for Watched {
    type Stream = <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream;
    type TlsConnect = WatchedConnect<<MakeRustlsConnect as MakeTlsConnect<Socket>>::TlsConnect>;
    type Error = <MakeRustlsConnect as MakeTlsConnect<Socket>>::Error;

    fn make_tls_connect(&mut self, domain: &str) -> Result<Self::TlsConnect, Self::Error> {
        let inner = MakeTlsConnect::<Socket>::make_tls_connect(&mut self.inner, domain)?;
        Ok(WatchedConnect { inner, started: self.started.clone() })
    }
}

impl<T: TlsConnect<Socket>> TlsConnect<Socket> for WatchedConnect<T> {
    type Stream = T::Stream;
    type Error = T::Error;
    type Future = T::Future;

    fn connect(self, stream: Socket) -> Self::Future {
        self.started.store(true, SeqCst);
        self.inner.connect(stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreadable_certificate_files_are_named() {
        let dir = std::env::temp_dir().join(format!("millrace-pgtls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "no certificate here\n").unwrap();
        let missing = dir.join("missing.pem");
        for (url, says) in [
            (
                format!("host=h sslmode=verify-full sslrootcert={}", missing.display()),
                format!("sslrootcert {}: cannot be read", missing.display()),
            ),
            (
                format!("host=h sslmode=verify-ca sslrootcert={}", empty.display()),
                format!("sslrootcert {}: holds no PEM certificate", empty.display()),
            ),
            (
                format!("host=h sslmode=require sslcert={} sslkey=k", empty.display()),
                format!("sslcert {}: holds no PEM certificate", empty.display()),
            ),
        ] {
            let e = Connector::new(PgUrl::parse(&url).unwrap()).err().unwrap();
            assert!(crate::error::report(&e).contains(&says), "{}", crate::error::report(&e));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
