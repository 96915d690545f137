//! How the PostgreSQL store reaches its server: `store.url` read as libpq reads it, and TLS with
//! rustls (no OpenSSL).
//!
//! `store.url` is a `postgres://` URL or a libpq `key=value` string. tokio-postgres parses both,
//! but knows only `sslmode=disable|prefer|require` and none of libpq's certificate parameters, so
//! [`PgUrl::parse`] takes libpq's TLS parameters out first and hands it the rest:
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
//!   certificates too (libpq would read `~/.postgresql/root.crt`; millrace reads nothing from a
//!   home directory): a server with a certificate of a private authority needs `sslrootcert`.
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

/// `sslmode`, as libpq spells and means it (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    const ALL: [SslMode; 5] = [
        SslMode::Disable,
        SslMode::Prefer,
        SslMode::Require,
        SslMode::VerifyCa,
        SslMode::VerifyFull,
    ];

    /// Its name in `store.url`.
    pub fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

impl std::fmt::Display for SslMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Where `verify-*` finds the roots it trusts (`sslrootcert`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Roots {
    /// The system's trusted certificates (`sslrootcert=system`, or no `sslrootcert`).
    System,
    /// A PEM file of root certificates.
    File(PathBuf),
}

/// What is wrong with `store.url` (its text is never part of the message: it may hold a
/// password). The service shows it as `configuration key `store.url`: …`.
#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    #[error("not a PostgreSQL URL or key=value string")]
    Parse(#[source] postgres::Error),
    #[error("a value of parameter {0} is not valid percent-encoded UTF-8")]
    Encoding(String),
    #[error("unterminated quoted value of parameter {0}")]
    Unterminated(String),
    #[error(
        "sslmode {0:?} is not one of disable, prefer, require, verify-ca, verify-full (libpq's \
         allow is not supported)"
    )]
    SslMode(String),
    #[error("{present} needs {missing}: a client certificate and its key go together")]
    ClientPair { present: &'static str, missing: &'static str },
    #[error("{param} {}: cannot be read", path.display())]
    Read {
        param: &'static str,
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{param} {}: holds no PEM certificate", path.display())]
    NoCertificate { param: &'static str, path: PathBuf },
    #[error("sslrootcert {}: none of its {rejected} certificates is a usable root", path.display())]
    NoUsableRoot { path: PathBuf, rejected: usize },
    #[error(
        "sslmode={mode} trusts the system's certificates (no sslrootcert, or sslrootcert=system), \
         and none could be read; name a CA file in sslrootcert"
    )]
    NoSystemRoots {
        mode: SslMode,
        #[source]
        source: Option<std::io::Error>,
    },
    #[error("sslcert / sslkey: the certificate and key are not usable")]
    ClientCert(#[source] rustls::Error),
    #[error("the TLS configuration")]
    Tls(#[source] rustls::Error),
}

/// A connection that could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
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

/// The parameters of libpq that are taken out of `store.url` before tokio-postgres reads it.
const TLS_PARAMS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

/// `store.url` read (no file is opened yet: see [`Connector::new`]).
#[derive(Debug, Clone)]
pub struct PgUrl {
    /// Everything but the TLS parameters (tokio-postgres's own `sslmode` is set from `mode`).
    pub config: postgres::Config,
    pub mode: SslMode,
    /// `sslrootcert`, if given.
    pub roots: Option<Roots>,
    /// `sslcert` and `sslkey`, if given.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

impl PgUrl {
    /// Reads `url` (see the module documentation).
    pub fn parse(url: &str) -> Result<PgUrl, UrlError> {
        let (rest, params) = take_tls_params(url)?;
        let mut config: postgres::Config = rest.parse().map_err(UrlError::Parse)?;
        let find = |name: &str| params.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v);
        let mode = match find("sslmode") {
            None => SslMode::Prefer,
            Some(v) => SslMode::ALL
                .into_iter()
                .find(|m| m.name() == v)
                .ok_or_else(|| UrlError::SslMode(v.clone()))?,
        };
        let roots = find("sslrootcert").map(|v| match v.as_str() {
            "system" => Roots::System,
            path => Roots::File(PathBuf::from(path)),
        });
        let client_cert = match (find("sslcert"), find("sslkey")) {
            (Some(cert), Some(key)) => Some((PathBuf::from(cert), PathBuf::from(key))),
            (None, None) => None,
            (Some(_), None) => {
                return Err(UrlError::ClientPair { present: "sslcert", missing: "sslkey" })
            }
            (None, Some(_)) => {
                return Err(UrlError::ClientPair { present: "sslkey", missing: "sslcert" })
            }
        };
        config.ssl_mode(match mode {
            SslMode::Disable => WireMode::Disable,
            SslMode::Prefer => WireMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => WireMode::Require,
        });
        Ok(PgUrl { config, mode, roots, client_cert })
    }

    /// The mode in effect: `require` with `sslrootcert` verifies the chain, as libpq does.
    pub fn effective_mode(&self) -> SslMode {
        match (self.mode, &self.roots) {
            (SslMode::Require, Some(Roots::File(_))) => SslMode::VerifyCa,
            (mode, _) => mode,
        }
    }
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
    pub fn connect(&self) -> Result<Client, ConnectError> {
        let Some(tls) = &self.tls else {
            return Ok(self.config.connect(NoTls)?);
        };
        let started = Arc::new(AtomicBool::new(false));
        let connector = Watched { inner: tls.clone(), started: started.clone() };
        match self.config.connect(connector) {
            Err(e) if self.mode == SslMode::Prefer && started.load(SeqCst) => self
                .plain
                .connect(NoTls)
                .map_err(|plain| ConnectError::Prefer { tls: crate::error::report(&e), plain }),
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
        SslMode::VerifyCa => Arc::new(ChainOnly { roots: root_store(mode, roots)?, algs }),
        _ => Arc::new(Unverified { algs }),
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

/// `prefer` and `require`: any certificate (libpq checks none in these modes), but the
/// handshake's signatures are still checked, so the session is with the holder of the key of
/// the certificate shown.
#[derive(Debug)]
struct Unverified {
    algs: WebPkiSupportedAlgorithms,
}

/// `verify-ca`: the certificate must chain to a trusted root; its names are not checked.
#[derive(Debug)]
struct ChainOnly {
    roots: RootCertStore,
    algs: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
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

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.algs.all,
        )?;
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

/// Splits libpq's TLS parameters ([`TLS_PARAMS`]) from the rest of `url` (URL or key=value
/// form); returns the rest as text and the parameters decoded, in order.
fn take_tls_params(url: &str) -> Result<(String, Vec<(String, String)>), UrlError> {
    let trimmed = url.trim_start();
    if trimmed.starts_with("postgres://") || trimmed.starts_with("postgresql://") {
        take_from_query(url)
    } else {
        take_from_pairs(url)
    }
}

/// The URL form: parameters in the query (`?a=b&c=d`), percent-encoded.
fn take_from_query(url: &str) -> Result<(String, Vec<(String, String)>), UrlError> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_string(), Vec::new()));
    };
    let decode = |s: &str, name: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .map(|v| v.into_owned())
            .map_err(|_| UrlError::Encoding(name.to_string()))
    };
    let (mut kept, mut taken) = (Vec::new(), Vec::new());
    for pair in query.split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let key = decode(key, "names")?;
        if TLS_PARAMS.contains(&key.as_str()) {
            let value = decode(value, &key)?;
            taken.push((key, value));
        } else {
            kept.push(pair);
        }
    }
    let rest =
        if kept.is_empty() { base.to_string() } else { format!("{base}?{}", kept.join("&")) };
    Ok((rest, taken))
}

/// The `key=value` form: `key = value` pairs separated by spaces, a value in single quotes or
/// not, `\` escaping the next character (libpq's and tokio-postgres's grammar). A pair this
/// reader cannot make sense of is left for tokio-postgres to report.
fn take_from_pairs(text: &str) -> Result<(String, Vec<(String, String)>), UrlError> {
    let mut chars = text.char_indices().peekable();
    let (mut kept, mut taken) = (Vec::new(), Vec::new());
    let skip_ws = |chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>| {
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
    };
    loop {
        skip_ws(&mut chars);
        let Some(&(start, _)) = chars.peek() else { break };
        let mut key_end = start;
        while let Some((i, c)) = chars.next_if(|(_, c)| !c.is_whitespace() && *c != '=') {
            key_end = i + c.len_utf8();
        }
        let key = &text[start..key_end];
        skip_ws(&mut chars);
        if chars.next_if(|(_, c)| *c == '=').is_none() {
            // not a pair: tokio-postgres says what is wrong with it
            kept.push(&text[start..]);
            break;
        }
        skip_ws(&mut chars);
        let mut value = String::new();
        let mut end = text.len();
        if chars.next_if(|(_, c)| *c == '\'').is_some() {
            let mut closed = false;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\'' => {
                        closed = true;
                        end = i + 1;
                        break;
                    }
                    '\\' => value.extend(chars.next().map(|(_, c)| c)),
                    c => value.push(c),
                }
            }
            if !closed {
                return Err(UrlError::Unterminated(key.to_string()));
            }
        } else {
            while let Some((i, c)) = chars.next_if(|(_, c)| !c.is_whitespace()) {
                end = i + c.len_utf8();
                match c {
                    '\\' => {
                        if let Some((j, c)) = chars.next() {
                            end = j + c.len_utf8();
                            value.push(c);
                        }
                    }
                    c => value.push(c),
                }
            }
        }
        if TLS_PARAMS.contains(&key) {
            taken.push((key.to_string(), value));
        } else {
            kept.push(&text[start..end]);
        }
    }
    Ok((kept.join(" "), taken))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken(url: &str) -> (String, Vec<(String, String)>) {
        take_tls_params(url).unwrap()
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn tls_parameters_leave_the_url_form_and_the_rest_stays() {
        assert_eq!(taken("postgres://u:p@h/db"), ("postgres://u:p@h/db".into(), vec![]));
        assert_eq!(
            taken(
                "postgres://u:p%3F@h:5433/db?application_name=m&sslmode=verify-full\
                 &sslrootcert=%2Fetc%2Fca%20x.pem&connect_timeout=5"
            ),
            (
                "postgres://u:p%3F@h:5433/db?application_name=m&connect_timeout=5".into(),
                pairs(&[("sslmode", "verify-full"), ("sslrootcert", "/etc/ca x.pem")])
            )
        );
        assert_eq!(
            taken("postgresql://h/db?sslcert=c.pem&sslkey=k.pem"),
            ("postgresql://h/db".into(), pairs(&[("sslcert", "c.pem"), ("sslkey", "k.pem")]))
        );
        assert!(matches!(
            take_tls_params("postgres://h/db?sslrootcert=%FF"),
            Err(UrlError::Encoding(p)) if p == "sslrootcert"
        ));
    }

    #[test]
    fn tls_parameters_leave_the_key_value_form_and_the_rest_stays() {
        assert_eq!(
            taken("host=db user=m password='a b\\'c' sslmode = require dbname=x"),
            ("host=db user=m password='a b\\'c' dbname=x".into(), pairs(&[("sslmode", "require")]))
        );
        assert_eq!(
            taken("sslrootcert='/etc/my ca.pem' host=h sslcert=/c\\ d.pem sslkey=k"),
            (
                "host=h".into(),
                pairs(&[
                    ("sslrootcert", "/etc/my ca.pem"),
                    ("sslcert", "/c d.pem"),
                    ("sslkey", "k")
                ])
            )
        );
        assert!(matches!(
            take_tls_params("host=h sslrootcert='/x"),
            Err(UrlError::Unterminated(p)) if p == "sslrootcert"
        ));
        // what is not a pair is left for tokio-postgres to refuse
        assert_eq!(taken("host=h junk").0, "host=h junk");
    }

    #[test]
    fn modes_and_certificate_parameters_are_read_as_libpq_does() {
        let url = |s: &str| PgUrl::parse(s).unwrap();
        assert_eq!(url("postgres://h/db").mode, SslMode::Prefer, "libpq's default");
        for mode in SslMode::ALL {
            let u = url(&format!("host=h sslmode={mode}"));
            assert_eq!(u.mode, mode);
            let wire = match mode {
                SslMode::Disable => WireMode::Disable,
                SslMode::Prefer => WireMode::Prefer,
                _ => WireMode::Require,
            };
            assert_eq!(u.config.get_ssl_mode(), wire, "{mode}");
        }
        let u = url("postgres://h/db?sslmode=require&sslrootcert=/ca.pem");
        assert_eq!(u.roots, Some(Roots::File("/ca.pem".into())));
        assert_eq!(u.effective_mode(), SslMode::VerifyCa, "require with a root file");
        let u = url("postgres://h/db?sslmode=require&sslrootcert=system");
        assert_eq!(u.effective_mode(), SslMode::Require);
        let u = url("host=h sslcert=c sslkey=k");
        assert_eq!(u.client_cert, Some(("c".into(), "k".into())));

        for (bad, says) in [
            ("host=h sslmode=allow", "allow is not supported"),
            ("host=h sslmode=verify_full", "\"verify_full\" is not one of"),
            ("host=h sslcert=c", "sslcert needs sslkey"),
            ("postgres://h/db?sslkey=k", "sslkey needs sslcert"),
            ("postgres://h/db?sslcrl=x", "not a PostgreSQL URL"),
        ] {
            let e = PgUrl::parse(bad).unwrap_err();
            assert!(crate::error::report(&e).contains(says), "{bad}: {}", crate::error::report(&e));
        }
    }

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
