//! An agent's upstreams with their host names resolved, as a pure matcher
//! that tells which upstream (and so which role) a socket's remote address
//! belongs to. The lookup itself is the edge's (`selfheal::config`).

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, SocketAddr},
};

use super::{AgentConfig, Role, Upstream, UpstreamAddr};

/// How an upstream's address was resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// Written as addresses (ip:port, CIDR, :port): nothing to look up.
    Literal,
    /// A host name and the addresses it resolved to (never empty).
    Resolved(Vec<SocketAddr>),
    /// A host name that did not resolve: this upstream matches nothing.
    Failed(String),
}

/// An upstream with its host name (if any) resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedUpstream {
    pub upstream: Upstream,
    pub resolution: Resolution,
}

impl ResolvedUpstream {
    /// Whether a socket whose remote end is `remote` talks to this upstream.
    /// IPv4-mapped IPv6 addresses (`::ffff:10.0.0.1`) are the IPv4 address
    /// they map, on either side.
    pub fn matches(&self, remote: SocketAddr) -> bool {
        let ip = canonical(remote.ip());
        let port = remote.port();
        match &self.upstream.addr {
            UpstreamAddr::Port(p) => *p == port,
            UpstreamAddr::Socket(sa) => canonical(sa.ip()) == ip && sa.port() == port,
            UpstreamAddr::Cidr(net, prefix) => cidr_contains(*net, *prefix, ip),
            UpstreamAddr::Host { .. } => match &self.resolution {
                Resolution::Resolved(addrs) => addrs
                    .iter()
                    .any(|sa| canonical(sa.ip()) == ip && sa.port() == port),
                Resolution::Literal | Resolution::Failed(_) => false,
            },
        }
    }
}

/// An agent's upstreams, resolved once, ready to classify sockets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResolvedUpstreams {
    /// In config order.
    pub upstreams: Vec<ResolvedUpstream>,
}

impl ResolvedUpstreams {
    /// The upstream a socket with remote end `remote` talks to: the first in
    /// config order that matches. Pure.
    pub fn upstream_of(&self, remote: SocketAddr) -> Option<&ResolvedUpstream> {
        self.upstreams.iter().find(|u| u.matches(remote))
    }

    /// The role of a socket with remote end `remote`, if any upstream matches.
    pub fn role_of(&self, remote: SocketAddr) -> Option<Role> {
        self.upstream_of(remote).map(|u| u.upstream.role)
    }

    /// One line per host name: what it resolved to, or why it did not.
    pub fn notes(&self) -> Vec<String> {
        let mut out = Vec::new();
        for u in &self.upstreams {
            let addr = &u.upstream.addr;
            match &u.resolution {
                Resolution::Literal => {}
                Resolution::Resolved(addrs) => {
                    let list: Vec<_> = addrs.iter().map(ToString::to_string).collect();
                    out.push(format!("{addr} resolves to {}", list.join(", ")));
                }
                Resolution::Failed(e) => {
                    out.push(format!(
                        "{addr} does not resolve ({e}): it matches no socket"
                    ));
                }
            }
        }
        out
    }
}

impl AgentConfig {
    /// Resolves the upstreams' host names (once each) with `lookup` (the
    /// system resolver: `selfheal::config::resolve_upstreams`). A name that
    /// does not resolve is not an error: that upstream matches nothing and
    /// [`ResolvedUpstreams::notes`] says why.
    pub fn resolve_upstreams_with(
        &self,
        mut lookup: impl FnMut(&str, u16) -> Result<Vec<SocketAddr>, String>,
    ) -> ResolvedUpstreams {
        let mut cache: HashMap<(String, u16), Resolution> = HashMap::new();
        let upstreams = self
            .upstreams
            .iter()
            .map(|u| {
                let resolution = match &u.addr {
                    UpstreamAddr::Host { host, port } => cache
                        .entry((host.clone(), *port))
                        .or_insert_with(|| match lookup(host, *port) {
                            Ok(mut addrs) => {
                                let mut seen = Vec::new();
                                addrs.retain(|a| {
                                    let key = (a.ip(), a.port());
                                    let new = !seen.contains(&key);
                                    seen.push(key);
                                    new
                                });
                                if addrs.is_empty() {
                                    Resolution::Failed("no addresses".into())
                                } else {
                                    Resolution::Resolved(addrs)
                                }
                            }
                            Err(e) => Resolution::Failed(e),
                        })
                        .clone(),
                    _ => Resolution::Literal,
                };
                ResolvedUpstream {
                    upstream: u.clone(),
                    resolution,
                }
            })
            .collect();
        ResolvedUpstreams { upstreams }
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it maps; others as is.
/// (`::1` stays IPv6: only `::ffff:a.b.c.d` is mapped.)
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Whether `ip` (canonical) is in `net/prefix`. A mapped network
/// (`::ffff:10.0.0.0/104`) is its IPv4 network; an IPv6 network shorter than
/// the mapped range (`::/0`) also holds IPv4 addresses in their mapped form.
fn cidr_contains(net: IpAddr, prefix: u8, ip: IpAddr) -> bool {
    let (net, prefix) = match net {
        IpAddr::V6(n) if prefix >= 96 && n.to_ipv4_mapped().is_some() => (
            IpAddr::V4(n.to_ipv4_mapped().unwrap_or(Ipv4Addr::UNSPECIFIED)),
            prefix - 96,
        ),
        other => (other, prefix),
    };
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            prefix_eq(u32::from(n).into(), u32::from(a).into(), prefix, 32)
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => prefix_eq(u128::from(n), u128::from(a), prefix, 128),
        (IpAddr::V6(n), IpAddr::V4(a)) => {
            prefix_eq(u128::from(n), u128::from(a.to_ipv6_mapped()), prefix, 128)
        }
        (IpAddr::V4(_), IpAddr::V6(_)) => false,
    }
}

/// Whether the first `prefix` of `bits` bits of `a` and `b` agree.
fn prefix_eq(a: u128, b: u128, prefix: u8, bits: u32) -> bool {
    let prefix = u32::from(prefix).min(bits);
    if prefix == 0 {
        return true;
    }
    let shift = bits - prefix;
    (a >> shift) == (b >> shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_edges() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(cidr_contains(ip("0.0.0.0"), 0, ip("1.2.3.4")));
        assert!(cidr_contains(ip("10.1.2.3"), 8, ip("10.9.9.9")));
        assert!(!cidr_contains(ip("10.0.0.0"), 8, ip("11.0.0.0")));
        assert!(cidr_contains(ip("1.2.3.4"), 32, ip("1.2.3.4")));
        assert!(!cidr_contains(ip("1.2.3.4"), 32, ip("1.2.3.5")));
        assert!(cidr_contains(ip("::"), 0, ip("::1")));
        assert!(cidr_contains(ip("::"), 0, ip("1.2.3.4")));
        assert!(cidr_contains(ip("::ffff:10.0.0.0"), 104, ip("10.1.1.1")));
        assert!(!cidr_contains(ip("10.0.0.0"), 8, ip("::1")));
        assert!(cidr_contains(ip("fd00::"), 8, ip("fdff::1")));
        assert!(!cidr_contains(ip("fd00::"), 8, ip("fe00::1")));
    }
}
