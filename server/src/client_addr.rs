//! Which address a client counts as, for every per-address limit: connections per address
//! (`http::conn`), job starts per address (`http::starts`), the fair share of on-demand jobs
//! (`jobs::admission`) and the admin throttle (`http::admin`).
//!
//! - IPv4: the address itself.
//! - IPv4-mapped IPv6 (`::ffff:a.b.c.d`, what a dual-stack listener sees of an IPv4 client): its
//!   IPv4 address, so one client counts the same whichever socket it reached.
//! - Other IPv6: its /64. One host or one site is routinely given a whole /64 (SLAAC, privacy
//!   addresses, a /64 per customer), so a client can take a new address per connection at no
//!   cost; counting the /64 is what counting "one client" means in IPv6. (A holder of a /48
//!   still has 65,536 of them: the global caps bound what they can take together.)
//!
//! A limit keyed by [`ClientAddr`] cannot be keyed by a raw address by mistake: the only way to
//! make one is [`ClientAddr::of`].

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

/// A client address as every per-address limit counts it (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientAddr(IpAddr);

/// The bits of an IPv6 address that name its /64.
const PREFIX_64: u128 = !((1u128 << 64) - 1);

impl ClientAddr {
    /// The client address `ip` counts as.
    pub fn of(ip: IpAddr) -> ClientAddr {
        match ip.to_canonical() {
            v4 @ IpAddr::V4(_) => ClientAddr(v4),
            IpAddr::V6(v6) => ClientAddr(IpAddr::V6(Ipv6Addr::from(u128::from(v6) & PREFIX_64))),
        }
    }

    /// The address (IPv4) or the network address of the /64 (IPv6).
    pub fn ip(self) -> IpAddr {
        self.0
    }
}

/// `192.0.2.7`, or `2001:db8:1:2::/64`.
impl fmt::Display for ClientAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpAddr::V4(v4) => write!(f, "{v4}"),
            IpAddr::V6(v6) => write!(f, "{v6}/64"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(s: &str) -> ClientAddr {
        ClientAddr::of(s.parse().unwrap())
    }

    #[test]
    fn ipv4_is_itself_mapped_ipv6_is_its_ipv4_and_ipv6_is_its_64() {
        assert_eq!(of("192.0.2.7").to_string(), "192.0.2.7");
        assert_ne!(of("192.0.2.7"), of("192.0.2.8"));
        // A dual-stack listener sees IPv4 clients as mapped addresses: the same client.
        assert_eq!(of("::ffff:192.0.2.7"), of("192.0.2.7"));
        assert_ne!(of("::ffff:192.0.2.7"), of("::ffff:192.0.2.8"), "not grouped as ::/64");
        assert_ne!(of("::ffff:127.0.0.1"), of("::1"));
        // Every address of one /64 is one client; the next /64 is another.
        let a = of("2001:db8:1:2::1");
        for other in ["2001:db8:1:2::2", "2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:DB8:1:2:abcd::9"]
        {
            assert_eq!(of(other), a, "{other}");
        }
        assert_ne!(of("2001:db8:1:3::1"), a);
        assert_ne!(of("2001:db8:2:2::1"), a);
        assert_eq!(a.to_string(), "2001:db8:1:2::/64");
        assert_eq!(a.ip(), "2001:db8:1:2::".parse::<IpAddr>().unwrap());
        assert_eq!(of("::1").to_string(), "::/64");
    }
}
