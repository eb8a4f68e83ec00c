//! The address policy of every outgoing call a2ad makes for someone else (webhook
//! deliveries, upstream A2A agents): which addresses may be dialled, checked on literal
//! addresses and, through [`GuardedResolver`], on every name at dial time.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether a target address may receive deliveries.
///
/// Link-local, unspecified and multicast addresses are always refused; loopback and
/// private ranges only when `allow_private` is set. An IPv6 address that carries an IPv4
/// address (IPv4-mapped, IPv4-compatible, IPv4-translated, NAT64, 6to4, Teredo) is judged
/// by the IPv4 rules for what it carries, so `[64:ff9b::a9fe:a9fe]` is 169.254.169.254.
pub(crate) fn address_allowed(ip: IpAddr, allow_private: bool) -> Result<(), &'static str> {
    match ip {
        IpAddr::V4(v4) => v4_allowed(v4, allow_private),
        IpAddr::V6(v6) => {
            for v4 in embedded_ipv4(v6).into_iter().flatten() {
                v4_allowed(v4, allow_private)?;
            }
            if embedded_ipv4(v6)[0].is_some() {
                // Mapped, compatible and translated forms are only their IPv4 address.
                return Ok(());
            }
            v6_allowed(v6, allow_private)
        }
    }
}

fn v4_allowed(v4: Ipv4Addr, allow_private: bool) -> Result<(), &'static str> {
    if v4.is_link_local() {
        return Err("link-local addresses are never allowed");
    }
    if v4.is_unspecified() || v4.is_multicast() || v4.is_broadcast() {
        return Err("unspecified, broadcast and multicast addresses are never allowed");
    }
    let o = v4.octets();
    let private = v4.is_loopback()
        || v4.is_private()
        || (o[0] == 100 && (o[1] & 0xc0) == 64) // shared address space 100.64/10
        || o[0] == 0;
    if private && !allow_private {
        return Err("loopback and private addresses are not allowed by this server");
    }
    Ok(())
}

fn v6_allowed(v6: Ipv6Addr, allow_private: bool) -> Result<(), &'static str> {
    let seg0 = v6.segments()[0];
    if (seg0 & 0xffc0) == 0xfe80 {
        return Err("link-local addresses are never allowed");
    }
    if v6.is_unspecified() || v6.is_multicast() {
        return Err("unspecified and multicast addresses are never allowed");
    }
    let private = v6.is_loopback()
        || (seg0 & 0xfe00) == 0xfc00 // unique local fc00::/7
        || (seg0 & 0xffc0) == 0xfec0; // site local fec0::/10 (deprecated)
    if private && !allow_private {
        return Err("loopback and private addresses are not allowed by this server");
    }
    Ok(())
}

/// The IPv4 addresses an IPv6 address carries. Slot 0: forms that *are* an IPv4 address
/// (mapped `::ffff:a.b.c.d`, compatible `::a.b.c.d`, translated `::ffff:0:a.b.c.d`);
/// slots 1 and 2: tunnelling and translation prefixes (NAT64 `64:ff9b::/96` and
/// `64:ff9b:1::/48`, 6to4 `2002::/16`, Teredo `2001::/32` server and client).
fn embedded_ipv4(v6: Ipv6Addr) -> [Option<Ipv4Addr>; 3] {
    let s = v6.segments();
    let tail = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    let pair =
        |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    if let Some(v4) = v6.to_ipv4_mapped() {
        return [Some(v4), None, None];
    }
    if s[..6] == [0, 0, 0, 0, 0, 0] && !(s[6] == 0 && s[7] <= 1) {
        return [Some(tail), None, None];
    }
    if s[..6] == [0, 0, 0, 0, 0xffff, 0] {
        return [Some(tail), None, None];
    }
    if s[0] == 0x64 && s[1] == 0xff9b && (s[2..6] == [0, 0, 0, 0] || s[2] == 1) {
        return [None, Some(tail), None];
    }
    if s[0] == 0x2002 {
        return [None, Some(pair(s[1], s[2])), None];
    }
    if s[0] == 0x2001 && s[1] == 0 {
        let client = Ipv4Addr::from(!u32::from(tail));
        return [None, Some(pair(s[2], s[3])), Some(client)];
    }
    [None, None, None]
}

/// The literal IP address a URL's host is, if it is one (a name is checked when it is
/// resolved).
pub(crate) fn literal_ip(url: &url::Url) -> Option<IpAddr> {
    match url.host() {
        Some(url::Host::Ipv4(v4)) => Some(IpAddr::V4(v4)),
        Some(url::Host::Ipv6(v6)) => Some(IpAddr::V6(v6)),
        _ => None,
    }
}

/// The resolver's refusal of a target address (SSRF guard), found again in reqwest's
/// error chain by type.
#[derive(Debug)]
pub(crate) struct TargetRefused {
    /// What was dialled (`webhook target`, `upstream`).
    pub(crate) what: &'static str,
    pub(crate) host: String,
    pub(crate) why: &'static str,
}

impl std::fmt::Display for TargetRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} refused: {}", self.what, self.host, self.why)
    }
}

impl std::error::Error for TargetRefused {}

pub(crate) fn refusal<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a TargetRefused> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = current {
        if let Some(refused) = err.downcast_ref::<TargetRefused>() {
            return Some(refused);
        }
        current = err.source();
    }
    None
}

/// Resolves host names and keeps only the addresses the policy allows, so the connection
/// can only go to an address that was checked at this call (no DNS-rebinding gap).
pub(crate) struct GuardedResolver {
    /// Private ranges allowed (a reload of `[webhooks]` may flip it).
    pub(crate) allow_private: Arc<AtomicBool>,
    /// Bound on one lookup.
    pub(crate) timeout: std::time::Duration,
    /// What is dialled, for the refusal's words.
    pub(crate) what: &'static str,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let (allow_private, timeout, what) = (
            self.allow_private.load(Ordering::Relaxed),
            self.timeout,
            self.what,
        );
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> =
                tokio::time::timeout(timeout, tokio::net::lookup_host((host.as_str(), 0)))
                    .await
                    .map_err(|_| format!("resolving {host} timed out"))??
                    .collect();
            let allowed: Vec<SocketAddr> = addrs
                .iter()
                .copied()
                .filter(|a| address_allowed(a.ip(), allow_private).is_ok())
                .collect();
            if allowed.is_empty() {
                let why = addrs
                    .first()
                    .and_then(|a| address_allowed(a.ip(), allow_private).err())
                    .unwrap_or("no address");
                let refused: Box<dyn std::error::Error + Send + Sync> =
                    Box::new(TargetRefused { what, host, why });
                return Err(refused);
            }
            Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs)
        })
    }
}
