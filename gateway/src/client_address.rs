//! Which address a request comes from: the peer, or the client a trusted proxy names in
//! `X-Forwarded-For` (read by the IP allowlists, `crate::ip_allowlists`).

use std::net::IpAddr;

use axum::http::HeaderMap;
use ipnet::IpNet;

/// An address (`10.0.0.1`, a host route) or a CIDR (`10.0.0.0/8`).
pub fn parse_network(s: &str) -> Option<IpNet> {
    let s = s.trim();
    s.parse::<IpNet>().ok().or_else(|| s.parse::<IpAddr>().ok().map(IpNet::from))
}

/// `::ffff:a.b.c.d` as `a.b.c.d`: one client, one address, whichever socket family carried it.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The client of a request from `peer` with `headers`: the peer, unless it is one of
/// `trusted` proxies, in which case the right-most `X-Forwarded-For` address that is not itself
/// trusted (each proxy appends the address it saw; only the trusted ones' additions are
/// believed). Hops are read one by one from the right, as bytes: what lies left of the hop that
/// names the client (a client's own forged prefix, even one that is not text) is never read.
/// `None`: the hop that should name the client names no address.
pub fn client_address(peer: IpAddr, headers: &HeaderMap, trusted: &[IpNet]) -> Option<IpAddr> {
    let peer = canonical(peer);
    let is_trusted = |ip: IpAddr| trusted.iter().any(|n| n.contains(&ip));
    if !is_trusted(peer) {
        return Some(peer);
    }
    let hops: Vec<&[u8]> =
        headers.get_all("x-forwarded-for").iter().flat_map(|v| v.as_bytes().split(|b| *b == b',')).collect();
    let mut last = peer;
    for hop in hops.iter().rev() {
        let ip = std::str::from_utf8(hop).ok().and_then(|h| h.trim().parse::<IpAddr>().ok()).map(canonical)?;
        if !is_trusted(ip) {
            return Some(ip);
        }
        last = ip;
    }
    // No header, or every hop a trusted proxy: the left-most is the client as far as anyone can
    // tell.
    Some(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(xff: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in xff {
            h.append("x-forwarded-for", v.parse().unwrap());
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn forwarded_for_is_read_only_from_trusted_proxies_and_from_the_right() {
        let trusted = vec![parse_network("10.0.0.0/8").unwrap(), parse_network("2001:db8::1").unwrap()];
        // An untrusted peer's header is ignored, whatever it claims.
        assert_eq!(client_address(ip("198.51.100.7"), &headers(&["203.0.113.1"]), &trusted), Some(ip("198.51.100.7")));
        // A trusted peer: the right-most untrusted hop (a client's own prefix is not believed).
        let h = headers(&["203.0.113.66, 198.51.100.9", "10.1.1.1"]);
        assert_eq!(client_address(ip("10.0.0.2"), &h, &trusted), Some(ip("198.51.100.9")));
        assert_eq!(client_address(ip("2001:db8::1"), &headers(&["192.0.2.5"]), &trusted), Some(ip("192.0.2.5")));
        // No header: the proxy itself; a garbled hop: no address.
        assert_eq!(client_address(ip("10.0.0.2"), &headers(&[]), &trusted), Some(ip("10.0.0.2")));
        assert_eq!(client_address(ip("10.0.0.2"), &headers(&["nonsense"]), &trusted), None);
        // A client's own prefix, even bytes that are not text, is never read: the proxy's hop is.
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", axum::http::HeaderValue::from_bytes(b"\xff, 198.51.100.9").unwrap());
        assert_eq!(client_address(ip("10.0.0.2"), &h, &trusted), Some(ip("198.51.100.9")));
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", axum::http::HeaderValue::from_bytes(b"\xff").unwrap());
        assert_eq!(client_address(ip("10.0.0.2"), &h, &trusted), None);
        assert_eq!(client_address(ip("10.0.0.2"), &headers(&["10.0.0.3"]), &trusted), Some(ip("10.0.0.3")));
        // IPv4-mapped IPv6 is the IPv4 address.
        assert_eq!(client_address(ip("::ffff:198.51.100.7"), &headers(&[]), &[]), Some(ip("198.51.100.7")));
    }
}
