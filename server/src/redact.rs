//! One redaction for every form a secret takes in millrace's configuration. Every output that
//! may show a store or bus location — `--print-config`, log lines, error messages — passes it
//! through [`redact`]; `/healthz`, which anyone may read, names the configuration key instead
//! and shows no location at all.
//!
//! [`redact`] keeps what helps an operator (scheme, user name, hosts, ports, database, the names
//! of parameters and the values of harmless ones) and replaces each secret with [`MASK`]:
//! - a URL's userinfo: `postgres://u:p@h/db` → `postgres://u:***@h/db`; a userinfo without `:`
//!   is a token for NATS (`nats://token@h` → `nats://***@h`) and a user name for PostgreSQL;
//! - a query parameter whose name says secret ([`is_secret_parameter`]: `password`,
//!   `sslpassword`, `token`, `secret`, `key`, …): `?password=***`;
//! - libpq's `key=value` strings by the same names (`host=h password=***`), read as libpq reads
//!   them (single quotes, backslash escapes);
//! - lists: comma-separated URLs (`nats://a:p@h1,nats://b:q@h2`) and bare `host:port`s;
//! - anything it cannot read: [`REDACTED`], whole — never echoed.
//!
//! [`redact_config`] prepares a configuration for printing: a secret key ([`is_secret_key`]) is
//! shown as [`REDACTED`] when set, a URL through [`redact`].
//!
//! A leaf: it imports nothing of the service.

/// What stands in for a secret inside a location.
pub const MASK: &str = "***";

/// What stands in for a whole value: a secret key's, or a location [`redact`] cannot read.
pub const REDACTED: &str = "<redacted>";

/// Whether a configuration key (the last name of its path) holds a secret: a name ending in
/// `password`, `token`, `seed` or `secret` (`server.admin_token`, `bus.password`,
/// `bus.nkey_seed`). Only string values are secrets: a number (a simulator's random `seed`) is
/// not.
pub fn is_secret_key(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["password", "token", "seed", "secret"].iter().any(|s| name.ends_with(s))
}

/// Whether a configuration key holds a location that may carry credentials: `url` or `*_url`.
pub fn is_location_key(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    name == "url" || name.ends_with("_url")
}

/// Whether a URL query parameter or libpq keyword holds a secret: its name contains `pass`
/// (`password`, `sslpassword`, `passwd`), `pwd`, `token`, `secret`, `key` (`sslkey`, `apikey`),
/// `seed`, `cred`, `auth` or `signature`. Generous on purpose: hiding a harmless value costs
/// less than showing a secret one.
pub fn is_secret_parameter(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["pass", "pwd", "token", "secret", "key", "seed", "cred", "auth", "signature"]
        .iter()
        .any(|s| name.contains(s))
}

/// `text` (a URL, a list of URLs, a libpq `key=value` string, a `host:port` list) with every
/// secret replaced (see the module documentation); [`REDACTED`] for what it cannot read.
pub fn redact(text: &str) -> String {
    let text = text.trim();
    let shown = if text.is_empty() {
        Some(String::new())
    } else if text.contains("://") {
        urls(text)
    } else if text.contains('=') {
        key_values(text)
    } else {
        // `host:port[,host:port]` (NATS takes them without a scheme); a userinfo here is NATS's
        address(text, false)
    };
    shown.unwrap_or_else(|| REDACTED.into())
}

/// Prepares a configuration (as TOML) for printing: a string under a secret key becomes
/// [`REDACTED`], one under a location key — or any string holding `://` — goes through
/// [`redact`]. Everything else is kept.
pub fn redact_config(table: &mut toml::Table) {
    for (key, value) in table.iter_mut() {
        redact_value(key, value);
    }
}

fn redact_value(key: &str, value: &mut toml::Value) {
    match value {
        toml::Value::String(s) if is_secret_key(key) => *s = REDACTED.into(),
        toml::Value::String(s) if is_location_key(key) || s.contains("://") => *s = redact(s),
        toml::Value::Table(t) => redact_config(t),
        toml::Value::Array(items) => items.iter_mut().for_each(|v| redact_value(key, v)),
        _ => {}
    }
}

/// A URL scheme: a letter, then letters, digits, `+`, `-`, `.`.
fn is_scheme(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
}

/// Where `s` starts with `scheme://`, the scheme.
fn scheme_of(s: &str) -> Option<&str> {
    let (scheme, _) = s.split_once("://")?;
    is_scheme(scheme).then_some(scheme)
}

/// A URL, or a comma-separated list of them (split only before a `scheme://`, so a comma in a
/// password or a host list stays in its URL). Every URL must be readable: one that is not
/// may be the piece of a password that held `,scheme://`.
fn urls(text: &str) -> Option<String> {
    scheme_of(text)?;
    let mut parts = Vec::new();
    let mut start = 0;
    for (i, _) in text.match_indices(',') {
        if scheme_of(text[i + 1..].trim_start()).is_some() {
            parts.push(text[start..i].trim());
            start = i + 1;
        }
    }
    parts.push(text[start..].trim());
    // a lone user name is kept in one PostgreSQL URL; in a list it is taken for a token
    let single = parts.len() == 1;
    let shown: Option<Vec<String>> = parts.into_iter().map(|u| url(u, single)).collect();
    Some(shown?.join(","))
}

/// A user name worth showing: letters, digits, `_`, `-`, `.`, `%`.
fn is_plain_name(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "_-.%".contains(c))
}

/// One URL, redacted; `None` when it cannot be read. Its authority ends at the first `/`, `?`
/// or `#`, its userinfo at the authority's last `@`; an `@` after the authority means a
/// userinfo holding one of those (which part is the secret is unclear), so `None`.
fn url(u: &str, single: bool) -> Option<String> {
    let scheme = scheme_of(u)?;
    let rest = &u[scheme.len() + 3..];
    let (authority, tail) = rest.split_at(rest.find(['/', '?', '#']).unwrap_or(rest.len()));
    if tail.contains('@') || tail.chars().any(char::is_whitespace) {
        return None;
    }
    let keep_lone_user = single && (scheme == "postgres" || scheme == "postgresql");
    let mut out = format!("{scheme}://{}", address(authority, keep_lone_user)?);
    let (tail, fragment) = match tail.split_once('#') {
        Some((t, _)) => (t, true),
        None => (tail, false),
    };
    let (path, query) = match tail.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (tail, None),
    };
    out.push_str(path);
    if let Some(query) = query {
        let params: Vec<String> = query
            .split('&')
            .map(|p| match p.split_once('=') {
                Some((name, _)) if is_secret_parameter(name) => format!("{name}={MASK}"),
                _ => p.to_string(),
            })
            .collect();
        out.push('?');
        out.push_str(&params.join("&"));
    }
    if fragment {
        out.push('#');
        out.push_str(MASK);
    }
    Some(out)
}

/// `[userinfo@]host[:port][,host[:port]…]`, redacted: the userinfo (up to the last `@`) keeps
/// only a user name before its `:` — and a lone user name when `keep_lone_user` (PostgreSQL);
/// otherwise a lone userinfo is a token. `None` unless every host is one.
fn address(text: &str, keep_lone_user: bool) -> Option<String> {
    let (userinfo, hosts) = match text.rfind('@') {
        Some(at) => (Some(&text[..at]), &text[at + 1..]),
        None => (None, text),
    };
    if !hosts.split(',').all(is_host_port) {
        return None;
    }
    let user = match userinfo {
        None => String::new(),
        Some(ui) => match ui.split_once(':') {
            Some((user, _)) if is_plain_name(user) => format!("{user}:{MASK}@"),
            None if keep_lone_user && is_plain_name(ui) => format!("{ui}@"),
            _ => format!("{MASK}@"),
        },
    };
    Some(format!("{user}{hosts}"))
}

/// `host`, `host:port`, `[v6]`, `[v6]:port`, or empty (a URL without a host, libpq's
/// `postgres:///db`); a host of letters, digits, `.`, `-`, `_`, `%` (an encoded socket path).
fn is_host_port(s: &str) -> bool {
    let (host_ok, port) = match s.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((ip, rest)) => {
                (ip.chars().all(|c| c.is_ascii_hexdigit() || ":.".contains(c)), rest)
            }
            None => return false,
        },
        None => {
            let (host, port) = s.find(':').map_or((s, ""), |i| s.split_at(i));
            (host.chars().all(|c| c.is_ascii_alphanumeric() || ".-_%".contains(c)), port)
        }
    };
    let port_ok = port.is_empty()
        || port
            .strip_prefix(':')
            .is_some_and(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()));
    host_ok && port_ok
}

/// The keywords of libpq's connection strings (PostgreSQL 16, and tokio-postgres's
/// `keepalives_retries`).
const LIBPQ_KEYWORDS: [&str; 42] = [
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "passfile",
    "require_auth",
    "channel_binding",
    "connect_timeout",
    "client_encoding",
    "options",
    "application_name",
    "fallback_application_name",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "keepalives_retries",
    "tcp_user_timeout",
    "replication",
    "gssencmode",
    "sslmode",
    "requiressl",
    "sslcompression",
    "sslcert",
    "sslkey",
    "sslpassword",
    "sslcertmode",
    "sslrootcert",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "requirepeer",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "krbsrvname",
    "gsslib",
    "gssdelegation",
    "service",
    "target_session_attrs",
    "load_balance_hosts",
];

/// A libpq `key=value` string, read as libpq reads it (`key = value`, values bare with
/// backslash escapes or single-quoted with `\'` and `\\`), with secret values masked; `None`
/// when it is not one (a word that is not a libpq keyword included).
fn key_values(text: &str) -> Option<String> {
    let mut chars = text.chars().peekable();
    let mut out = Vec::new();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            break;
        }
        let mut keyword = String::new();
        while let Some(c) = chars.next_if(|c| !c.is_whitespace() && *c != '=') {
            keyword.push(c);
        }
        if !LIBPQ_KEYWORDS.contains(&keyword.as_str()) {
            return None; // not a connection string, or a secret where a keyword should be
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        chars.next_if_eq(&'=')?;
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next()? {
                    '\'' => break,
                    '\\' => value.push(chars.next()?),
                    c => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    value.push(chars.next()?);
                } else {
                    value.push(c);
                }
            }
            if value.is_empty() {
                return None;
            }
        }
        let shown = if is_secret_parameter(&keyword) {
            MASK.to_string()
        } else if value.is_empty()
            || value.contains(|c: char| c.is_whitespace() || "'\\".contains(c))
        {
            format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
        } else {
            value
        };
        out.push(format!("{keyword}={shown}"));
    }
    (!out.is_empty()).then(|| out.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::testkit::Rng;

    /// Every form a location takes in millrace's configuration, and what an operator sees.
    #[test]
    fn each_form_is_shown_without_its_secrets() {
        let cases = [
            // URLs with userinfo
            ("postgres://millrace:s3cret@db:5432/market", "postgres://millrace:***@db:5432/market"),
            ("postgresql://u:p@h/db", "postgresql://u:***@h/db"),
            ("postgres://postgres@127.0.0.1/x", "postgres://postgres@127.0.0.1/x"),
            ("postgres://u:p@ss@h:5432/db", "postgres://u:***@h:5432/db"),
            ("postgres://u:a,b@h1:5432,h2:5433/db", "postgres://u:***@h1:5432,h2:5433/db"),
            ("nats://u:p@h:4222", "nats://u:***@h:4222"),
            ("nats://tok3n@h:4222", "nats://***@h:4222"),
            ("tls://tok3n@h", "tls://***@h"),
            ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
            ("nats://[::1]:4222", "nats://[::1]:4222"),
            ("postgres:///db?host=%2Frun%2Fpostgresql", "postgres:///db?host=%2Frun%2Fpostgresql"),
            // query parameters
            (
                "postgres://h/db?password=p&sslmode=require",
                "postgres://h/db?password=***&sslmode=require",
            ),
            (
                "postgres://u@h/db?sslmode=verify-full&sslpassword=p",
                "postgres://u@h/db?sslmode=verify-full&sslpassword=***",
            ),
            (
                "nats://h:4222?token=t&auth_token=a&secret=s&apikey=k",
                "nats://h:4222?token=***&auth_token=***&secret=***&apikey=***",
            ),
            (
                "postgres://h/db?application_name=millrace#frag",
                "postgres://h/db?application_name=millrace#***",
            ),
            // libpq key=value
            (
                "host=db port=5432 user=millrace password=s3cret dbname=market",
                "host=db port=5432 user=millrace password=*** dbname=market",
            ),
            ("host=/run/postgresql user=postgres", "host=/run/postgresql user=postgres"),
            ("host = h  password = 'p q' user=u", "host=h password=*** user=u"),
            (r"password='it\'s \\ here' host=h", "password=*** host=h"),
            (r"password=no\ space host=h", "password=*** host=h"),
            ("application_name='a b' sslpassword=x", "application_name='a b' sslpassword=***"),
            // lists
            ("nats://a:p@h1:4222,nats://b:q@h2:4222", "nats://a:***@h1:4222,nats://b:***@h2:4222"),
            ("nats://a:p@h1, tls://tok@h2", "nats://a:***@h1,tls://***@h2"),
            ("postgres://u@h1,postgres://v@h2", "postgres://***@h1,postgres://***@h2"),
            ("nats://h1:4222,h2:4222", "nats://h1:4222,h2:4222"),
            ("h1:4222,h2:4222", "h1:4222,h2:4222"),
            ("u:p@h1:4222", "u:***@h1:4222"),
            ("tok@h1", "***@h1"),
            // what cannot be read is not echoed
            ("postgres://u:pa/ss@h/db", REDACTED),
            ("postgres://u:123/abc@h/db", REDACTED),
            ("nats://u:p#x@h", REDACTED),
            ("postgres://h/db?application_name=a@b", REDACTED),
            ("postgres://u:p@h:port/db", REDACTED),
            ("postgres://h/db name", REDACTED),
            ("nats://u:x,postgres://s3cret@h", REDACTED),
            ("host=h password='unterminated", REDACTED),
            ("host=h password", REDACTED),
            ("password=p q", REDACTED),
            ("host=h password=a://b", REDACTED),
            ("host=h s3cret=x", REDACTED),
            ("t0ken=@h:4222", REDACTED),
            ("not a url: s3cret", REDACTED),
            ("x nats://u:p@h", REDACTED),
            ("", ""),
        ];
        for (input, shown) in cases {
            assert_eq!(redact(input), shown, "redact({input:?})");
        }
    }

    /// `secret` as a URL carries it: every byte but unreserved ones percent-encoded.
    fn encoded(secret: &str) -> String {
        secret
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect()
    }

    /// Hundreds of random secrets — every character a password may hold, including the ones
    /// that end a URL's parts or a libpq value, written raw and encoded — planted in every form:
    /// the output never holds the secret, nor its distinctive core. (A token written raw has no
    /// `:`: with one, a URL reads it as user and password, and shows the user.)
    #[test]
    fn a_planted_secret_never_appears_in_the_output() {
        let alphabet: Vec<char> =
            "abcXYZ019 :@/?#&=,;'\"\\%+-_.~!$()[]{}<>|`^*é€\t".chars().collect();
        let mut rng = Rng::new(7);
        for round in 0..500 {
            let core = format!("Zq{round}Vx");
            let mut secret = core.clone();
            for _ in 0..rng.below(12) {
                let c = alphabet[rng.below(alphabet.len() as u64) as usize];
                if rng.chance(1, 2) {
                    secret.insert(0, c);
                } else {
                    secret.push(c);
                }
            }
            let token = secret.replace(':', "");
            let quoted = secret.replace('\\', "\\\\").replace('\'', "\\'");
            let bare: String = secret
                .chars()
                .flat_map(|c| {
                    if c.is_whitespace() || c == '\\' || c == '\'' {
                        vec!['\\', c]
                    } else {
                        vec![c]
                    }
                })
                .collect();
            let enc = encoded(&secret);
            let forms = [
                format!("postgres://millrace:{secret}@db:5432/market"),
                format!("postgres://millrace:{enc}@db:5432/market"),
                format!("postgres://db:5432/market?sslmode=require&password={enc}"),
                format!("postgres://u@db/market?sslpassword={enc}&application_name=x"),
                format!("host=db user=millrace password='{quoted}' dbname=market"),
                format!("host=db password={bare} user=u"),
                format!("nats://user:{secret}@h:4222"),
                format!("nats://{token}@h:4222"),
                format!("nats://{enc}@h:4222"),
                format!("nats://a:{secret}@h1:4222,nats://b:{secret}@h2:4222"),
                format!("nats://{token}@h1:4222,nats://{token}@h2:4222"),
                format!("nats://h:4222?token={enc}"),
                format!("user:{secret}@h:4222"),
                format!("{token}@h:4222"),
            ];
            for form in forms {
                let out = redact(&form);
                let whole = secret.trim();
                let shows_whole = whole.len() > 2 && out.contains(whole);
                assert!(
                    !out.contains(&core) && !shows_whole,
                    "redact({form:?}) = {out:?} shows the secret {secret:?}"
                );
            }
        }
    }

    #[test]
    fn secret_keys_are_named_by_their_suffix() {
        for key in ["admin_token", "password", "nkey_seed", "client_secret", "token", "PASSWORD"] {
            assert!(is_secret_key(key), "{key}");
        }
        for key in ["user", "url", "key_file", "ca_file", "credentials_file", "require_tls"] {
            assert!(!is_secret_key(key), "{key}");
        }
    }

    /// `--print-config`'s view: secret keys shown as `<redacted>` when set, URLs redacted, the
    /// rest (and a simulator's numeric `seed`) as it is.
    #[test]
    fn a_configuration_is_printed_without_its_secrets() {
        let mut t: toml::Table = toml::from_str(
            r#"
            [server]
            admin_token = "adm1n-s3cret"
            addr = "127.0.0.1:8080"
            [store]
            url = "host=db password=pg-s3cret"
            [bus]
            url = "nats://u:nats-s3cret@h:4222,nats://t0ken-s3cret@h2:4222"
            password = "bus-s3cret"
            nkey_seed = "SUAseed-s3cret"
            user = "gateway"
            [[sources]]
            name = "sim"
            seed = 42
            rest_base = "https://key:rest-s3cret@api.example"
            "#,
        )
        .unwrap();
        redact_config(&mut t);
        let printed = toml::to_string(&t).unwrap();
        assert!(!printed.contains("s3cret"), "{printed}");
        assert_eq!(t["server"]["admin_token"].as_str(), Some(REDACTED));
        assert_eq!(t["server"]["addr"].as_str(), Some("127.0.0.1:8080"));
        assert_eq!(t["store"]["url"].as_str(), Some("host=db password=***"));
        assert_eq!(t["bus"]["url"].as_str(), Some("nats://u:***@h:4222,nats://***@h2:4222"));
        assert_eq!(t["bus"]["password"].as_str(), Some(REDACTED));
        assert_eq!(t["bus"]["nkey_seed"].as_str(), Some(REDACTED));
        assert_eq!(t["bus"]["user"].as_str(), Some("gateway"));
        assert_eq!(t["sources"][0]["seed"].as_integer(), Some(42));
        assert_eq!(t["sources"][0]["rest_base"].as_str(), Some("https://key:***@api.example"));
    }
}
