//! Which web pages may open `/ws`: the `Origin` check of a WebSocket upgrade
//! (`server.allowed_origins`).
//!
//! Browsers send `Origin` with every WebSocket handshake and let any page open a WebSocket to any
//! server: without this check, any web site could take job leases through its visitors'
//! browsers. Allowed are: requests without `Origin` (not a browser: tools, bots, the load
//! tools), the server's own origin (host and port equal to the request's `Host`, the dashboard
//! served by this server), and the configured patterns.

/// Why an entry of `server.allowed_origins` is not an origin pattern.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadOrigin {
    #[error("{0:?} is not scheme://host[:port] (or \"*\", or \"null\")")]
    NotAnOrigin(String),
    #[error("{0:?}: the scheme may hold only letters, digits, `+`, `-` and `.`")]
    Scheme(String),
    #[error("{0:?}: an origin is scheme://host[:port], without user, path, query or fragment")]
    Extra(String),
    #[error("{0:?}: no host")]
    NoHost(String),
    #[error("{0:?}: a bad IPv6 address in brackets")]
    Ipv6(String),
    #[error("{0:?}: the port must be a number up to 65535, or `*`")]
    Port(String),
}

/// One entry of `server.allowed_origins`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// `*`: every page.
    Any,
    /// `null`: the opaque origin of sandboxed frames and `file://` pages.
    Null,
    /// `scheme://host[:port]`, or `scheme://host:*` for any port.
    Origin { scheme: String, host: String, port: PortPattern },
}

/// The port part of a [`Pattern::Origin`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortPattern {
    Any,
    /// `None`: the scheme's default port (or none given for a scheme without one).
    Is(Option<u16>),
}

/// An origin as sent by a browser: scheme, lower-case host, port (`None` = the scheme's default).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Origin {
    scheme: String,
    host: String,
    port: Option<u16>,
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" | "ws" => Some(80),
        "https" | "wss" => Some(443),
        _ => None,
    }
}

/// Splits `host[:port]` (the host may be a bracketed IPv6 address).
fn split_host_port(s: &str) -> Result<(&str, Option<&str>), BadOrigin> {
    if s.starts_with('[') {
        let end = s.find(']').ok_or_else(|| BadOrigin::Ipv6(s.to_string()))?;
        let (host, rest) = s.split_at(end + 1);
        match rest {
            "" => Ok((host, None)),
            _ => match rest.strip_prefix(':') {
                Some(port) => Ok((host, Some(port))),
                None => Err(BadOrigin::Ipv6(s.to_string())),
            },
        }
    } else {
        match s.rsplit_once(':') {
            Some((host, port)) => Ok((host, Some(port))),
            None => Ok((s, None)),
        }
    }
}

/// `scheme://host[:port]` with the port part as text (`*` allowed by the caller's choice).
fn parse_parts(s: &str) -> Result<(String, String, Option<&str>), BadOrigin> {
    let (scheme, rest) =
        s.split_once("://").ok_or_else(|| BadOrigin::NotAnOrigin(s.to_string()))?;
    if scheme.is_empty()
        || !scheme.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    {
        return Err(BadOrigin::Scheme(s.to_string()));
    }
    if rest.contains(['/', '?', '#', '@', ' ']) {
        return Err(BadOrigin::Extra(s.to_string()));
    }
    let (host, port) = split_host_port(rest)?;
    if host.is_empty() {
        return Err(BadOrigin::NoHost(s.to_string()));
    }
    Ok((scheme.to_ascii_lowercase(), host.to_ascii_lowercase(), port))
}

fn parse_port(scheme: &str, port: Option<&str>, whole: &str) -> Result<Option<u16>, BadOrigin> {
    let port = match port {
        None => None,
        Some(p) => Some(p.parse::<u16>().map_err(|_| BadOrigin::Port(whole.to_string()))?),
    };
    // An explicit default port is the same origin as none.
    Ok(if port == default_port(scheme) { None } else { port })
}

impl Pattern {
    /// Parses one configured entry; the error says what is wrong with it.
    pub fn parse(s: &str) -> Result<Pattern, BadOrigin> {
        match s {
            "*" => return Ok(Pattern::Any),
            "null" => return Ok(Pattern::Null),
            _ => {}
        }
        let (scheme, host, port) = parse_parts(s)?;
        let port = match port {
            Some("*") => PortPattern::Any,
            p => PortPattern::Is(parse_port(&scheme, p, s)?),
        };
        Ok(Pattern::Origin { scheme, host, port })
    }

    fn matches(&self, origin: &Origin) -> bool {
        match self {
            Pattern::Any => true,
            Pattern::Null => false,
            Pattern::Origin { scheme, host, port } => {
                *scheme == origin.scheme
                    && *host == origin.host
                    && match port {
                        PortPattern::Any => true,
                        PortPattern::Is(p) => *p == origin.port,
                    }
            }
        }
    }
}

impl Origin {
    fn parse(s: &str) -> Option<Origin> {
        let (scheme, host, port) = parse_parts(s).ok()?;
        let port = parse_port(&scheme, port, s).ok()?;
        Some(Origin { scheme, host, port })
    }

    /// Is this the origin of a page served by this server, reached through `host` (the
    /// request's `Host` header)?
    fn is_host(&self, host: &str) -> bool {
        let Ok((h, p)) = split_host_port(host.trim()) else { return false };
        let Ok(p) = parse_port(&self.scheme, p, host) else { return false };
        h.eq_ignore_ascii_case(&self.host) && p == self.port
    }
}

/// The configured patterns, parsed once.
#[derive(Debug, Clone, Default)]
pub struct AllowedOrigins {
    patterns: Vec<Pattern>,
}

impl AllowedOrigins {
    /// From `server.allowed_origins` (already validated; a bad entry is skipped).
    pub fn new(entries: &[String]) -> Self {
        Self { patterns: entries.iter().filter_map(|e| Pattern::parse(e).ok()).collect() }
    }

    /// May a page of `origin` (the `Origin` header; `None` without one) open a WebSocket on a
    /// request whose `Host` header is `host`?
    pub fn allows(&self, origin: Option<&str>, host: Option<&str>) -> bool {
        let Some(origin) = origin else { return true };
        let origin = origin.trim();
        if origin == "null" {
            return self.patterns.iter().any(|p| matches!(p, Pattern::Null | Pattern::Any));
        }
        if self.patterns.contains(&Pattern::Any) {
            return true;
        }
        let Some(parsed) = Origin::parse(origin) else { return false };
        host.is_some_and(|h| parsed.is_host(h)) || self.patterns.iter().any(|p| p.matches(&parsed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn default() -> AllowedOrigins {
        AllowedOrigins::new(&crate::config::ServerConfig::default().allowed_origins)
    }

    #[test]
    fn the_default_allows_the_own_origin_localhost_and_non_browsers() {
        let a = default();
        let host = Some("millrace.example:8080");
        assert!(a.allows(None, host), "no Origin: not a browser");
        assert!(a.allows(Some("http://millrace.example:8080"), host));
        assert!(a.allows(Some("HTTP://Millrace.Example:8080"), host));
        assert!(a.allows(Some("http://localhost:5173"), host));
        assert!(a.allows(Some("http://127.0.0.1:3000"), host));
        assert!(a.allows(Some("https://[::1]:9"), host));
        assert!(a.allows(Some("http://localhost"), host));
        // Default ports are the same origin written either way.
        assert!(a.allows(Some("http://millrace.example"), Some("millrace.example:80")));
        assert!(a.allows(Some("https://millrace.example:443"), Some("millrace.example")));

        assert!(!a.allows(Some("http://evil.example"), host));
        assert!(!a.allows(Some("http://millrace.example:8081"), host), "another port");
        assert!(!a.allows(Some("https://millrace.example:8080.evil.example"), host));
        assert!(!a.allows(Some("http://localhost.evil.example"), host));
        assert!(!a.allows(Some("null"), host));
        assert!(!a.allows(Some("garbage"), host));
        assert!(!a.allows(Some("http://evil.example"), None));
    }

    #[test]
    fn configured_patterns() {
        let a = AllowedOrigins::new(&["https://dash.example".into(), "http://10.0.0.5:*".into()]);
        assert!(a.allows(Some("https://dash.example"), Some("api.example")));
        assert!(a.allows(Some("https://dash.example:443"), Some("api.example")));
        assert!(!a.allows(Some("http://dash.example"), Some("api.example")), "other scheme");
        assert!(!a.allows(Some("https://dash.example:444"), Some("api.example")));
        assert!(a.allows(Some("http://10.0.0.5:1234"), Some("api.example")));
        assert!(!a.allows(Some("http://localhost:1234"), Some("api.example")), "not listed");
        let any = AllowedOrigins::new(&["*".into()]);
        assert!(any.allows(Some("http://evil.example"), None) && any.allows(Some("null"), None));
    }

    #[test]
    fn bad_entries_are_refused_with_a_reason() {
        for bad in ["localhost", "http://", "http://a/b", "http://a:x", "http://a:99999", "://a"] {
            assert!(Pattern::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            Pattern::parse("http://[::1]:*").unwrap(),
            Pattern::Origin { scheme: "http".into(), host: "[::1]".into(), port: PortPattern::Any }
        );
    }
}
