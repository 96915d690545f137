//! `server.allowed_hosts`: the hosts a request may name, parsed from configuration (the HTTP
//! edge's check that uses them is `http::host`).

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// Why an entry of `server.allowed_hosts` is not a host.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadHost {
    #[error("an empty entry (a name, an address, or \"*\")")]
    Empty,
    #[error("{0:?}: a host is a name or an address with an optional port, without scheme, user, path or spaces")]
    Extra(String),
    #[error("{0:?}: a bad IPv6 address in brackets")]
    Ipv6(String),
    #[error("{0:?}: the port must be a number up to 65535")]
    Port(String),
    #[error("{0:?}: a name holds only letters, digits, `-`, `_` and `.`")]
    Name(String),
}

/// One entry of `server.allowed_hosts` (the port is ignored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// `*`: any host.
    Any,
    /// A name, lower case, without a trailing dot.
    Name(String),
    /// An address (IPv4, or IPv6 written in brackets or bare).
    Ip(IpAddr),
}

/// `host[:port]`, `[v6][:port]`, or (in configuration only) a bare IPv6 address.
pub fn parse_host(s: &str, bare_ipv6: bool) -> Result<HostPattern, BadHost> {
    let s = s.trim();
    if s.is_empty() {
        return Err(BadHost::Empty);
    }
    if s.contains(['/', '@', '?', '#', ' ', '\t', '\\']) || s.contains("://") {
        return Err(BadHost::Extra(s.to_string()));
    }
    let port_ok = |p: &str| p.parse::<u16>().is_ok();
    if let Some(rest) = s.strip_prefix('[') {
        let (addr, after) = rest.split_once(']').ok_or_else(|| BadHost::Ipv6(s.to_string()))?;
        let ip = addr.parse::<Ipv6Addr>().map_err(|_| BadHost::Ipv6(s.to_string()))?;
        match after {
            "" => {}
            _ => match after.strip_prefix(':') {
                Some(p) if port_ok(p) => {}
                Some(_) => return Err(BadHost::Port(s.to_string())),
                None => return Err(BadHost::Ipv6(s.to_string())),
            },
        }
        return Ok(HostPattern::Ip(IpAddr::V6(ip).to_canonical()));
    }
    if bare_ipv6 {
        if let Ok(ip) = s.parse::<Ipv6Addr>() {
            return Ok(HostPattern::Ip(IpAddr::V6(ip).to_canonical()));
        }
    }
    let name = match s.split_once(':') {
        Some((name, port)) if port_ok(port) => name,
        Some(_) => return Err(BadHost::Port(s.to_string())),
        None => s,
    };
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(HostPattern::Ip(ip.to_canonical()));
    }
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty()
        || !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(BadHost::Name(s.to_string()));
    }
    Ok(HostPattern::Name(name.to_ascii_lowercase()))
}

impl HostPattern {
    /// Parses one configured entry; the error says what is wrong with it.
    pub fn parse(s: &str) -> Result<HostPattern, BadHost> {
        if s.trim() == "*" {
            return Ok(HostPattern::Any);
        }
        parse_host(s, true)
    }
}

/// The hosts a request may name, parsed once.
#[derive(Debug, Clone)]
pub struct AllowedHosts {
    patterns: Vec<HostPattern>,
}

impl AllowedHosts {
    /// From `server.allowed_hosts` (already validated; a bad entry is skipped) and the address
    /// the server is bound to (allowed unless unspecified: `0.0.0.0`, `::`).
    pub fn new(entries: &[String], bound: SocketAddr) -> Self {
        let mut patterns: Vec<HostPattern> =
            entries.iter().filter_map(|e| HostPattern::parse(e).ok()).collect();
        if !bound.ip().is_unspecified() {
            patterns.push(HostPattern::Ip(bound.ip().to_canonical()));
        }
        Self { patterns }
    }

    /// May a request name `host` (a `Host` header's value, or the authority of its target)?
    pub fn allows(&self, host: &str) -> bool {
        if self.patterns.contains(&HostPattern::Any) {
            return true;
        }
        match parse_host(host, false) {
            Ok(h) => self.patterns.contains(&h),
            Err(_) => false,
        }
    }

    /// The start-up warning of a server bound to every address (`0.0.0.0`, `::`) with the
    /// default list: it answers only requests that name it `localhost`, `127.0.0.1` or `[::1]`,
    /// so clients reaching it by another name or address are refused until the key names them.
    pub fn bound_everywhere_warning(entries: &[String], bound: SocketAddr) -> Option<String> {
        let default = super::ServerConfig::default().allowed_hosts;
        (bound.ip().is_unspecified() && entries == default.as_slice()).then(|| {
            format!(
                "bound to {bound} with the default `server.allowed_hosts` ({}): requests naming this server by any other name or address get 421; set `server.allowed_hosts` to the names and addresses clients use (or \"*\")",
                default.join(", ")
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn default(bound: &str) -> AllowedHosts {
        let entries = super::super::ServerConfig::default().allowed_hosts;
        AllowedHosts::new(&entries, bound.parse().unwrap())
    }

    #[test]
    fn the_default_allows_loopback_names_and_the_bound_address_on_any_port() {
        let a = default("192.0.2.10:8080");
        for host in [
            "localhost",
            "localhost:8080",
            "LocalHost:1",
            "localhost.:8080",
            "127.0.0.1:8080",
            "127.0.0.1",
            "[::1]:8080",
            "[0:0::1]",
            "[::ffff:127.0.0.1]:9",
            "192.0.2.10:8080",
            "192.0.2.10:80",
        ] {
            assert!(a.allows(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "127.0.0.1.evil.example",
            "192.0.2.11:8080",
            "127.0.0.2:8080",
            "::1",
            "[::1",
            "localhost:99999",
            "localhost:x",
            "",
            "user@localhost",
            "<not text>",
        ] {
            assert!(!a.allows(host), "{host}");
        }
        // Bound to every address: only the listed names.
        let any = default("0.0.0.0:8080");
        assert!(any.allows("localhost:8080") && !any.allows("192.0.2.10:8080"));
    }

    #[test]
    fn configured_entries_names_addresses_and_any() {
        let a = AllowedHosts::new(
            &["dash.example".into(), "10.0.0.5:1234".into(), "2001:db8::1".into()],
            "0.0.0.0:80".parse().unwrap(),
        );
        assert!(a.allows("dash.example:443") && a.allows("DASH.example"));
        assert!(a.allows("10.0.0.5:9") && a.allows("[2001:db8::1]:80"));
        assert!(!a.allows("localhost:80"), "the list replaces the default");
        assert!(!a.allows("sub.dash.example"));
        let any = AllowedHosts::new(&["*".into()], "127.0.0.1:80".parse().unwrap());
        assert!(any.allows("evil.example") && any.allows("garbage here"));
    }

    #[test]
    fn bad_entries_are_refused_with_a_reason() {
        for bad in
            ["", " ", "http://a", "a/b", "a:x", "a:99999", "[::1", "[zz]", "a b", "é.example"]
        {
            assert!(HostPattern::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            HostPattern::parse("Example.COM.").unwrap(),
            HostPattern::Name("example.com".into())
        );
        assert_eq!(
            HostPattern::parse("[::1]:8080").unwrap(),
            HostPattern::Ip("::1".parse().unwrap())
        );
    }

    #[test]
    fn a_server_bound_everywhere_with_the_default_list_is_warned_about() {
        let default = super::super::ServerConfig::default().allowed_hosts;
        let warn = |entries: &[String], bound: &str| {
            AllowedHosts::bound_everywhere_warning(entries, bound.parse().unwrap())
        };
        let w = warn(&default, "0.0.0.0:8080").expect("a warning");
        assert!(w.contains("`server.allowed_hosts`") && w.contains("0.0.0.0:8080"), "{w}");
        assert!(warn(&default, "[::]:8080").is_some());
        assert!(warn(&default, "127.0.0.1:8080").is_none());
        assert!(warn(&["millrace.example".into()], "0.0.0.0:8080").is_none());
    }
}
