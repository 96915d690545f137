//! `store.url` read as libpq reads it (the PostgreSQL store's connection parameters, TLS
//! included): the text is configuration, parsed here without opening a file or a socket; the
//! store opens connections with it (`store::pg_connect`).
//!
//! tokio-postgres parses both the `postgres://` URL and the `key=value` form, but knows only
//! `sslmode=disable|prefer|require` and none of libpq's certificate parameters, so
//! [`PgUrl::parse`] takes libpq's TLS parameters out first and hands it the rest. What each
//! parameter means is documented in `store::pg_connect`.

use std::path::PathBuf;

use postgres::config::SslMode as WireMode;
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
}
