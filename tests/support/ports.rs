//! Free TCP ports on loopback addresses.
//!
//! A port is found by binding port 0 and dropping the socket, so another process could take
//! it before the test uses it; ports handed out by this process are remembered and never
//! handed out twice, which removes the likely collisions (between tests of one binary).

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::Mutex;

static HANDED_OUT: Mutex<Vec<u16>> = Mutex::new(Vec::new());

/// `127.0.0.<n>`: Linux routes all of 127.0.0.0/8 to loopback, so tests can give every
/// backend its own address without any setup.
pub fn loopback(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, n)
}

fn remember(port: u16) -> bool {
    let mut seen = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    if seen.contains(&port) {
        return false;
    }
    seen.push(port);
    true
}

/// A port that was free on 127.0.0.1.
pub fn free_port() -> u16 {
    free_port_on(&[Ipv4Addr::LOCALHOST])
}

/// A port that was free on every one of `ips` at once (use it for several backends of one
/// EndpointSlice, whose endpoints share one port number). Include `0.0.0.0` for a port an
/// Envoy listener binds on all addresses.
pub fn free_port_on(ips: &[Ipv4Addr]) -> u16 {
    let first = ips.first().copied().unwrap_or(Ipv4Addr::LOCALHOST);
    for _ in 0..200 {
        let port = {
            let probe = TcpListener::bind((first, 0)).expect("binding a port-0 socket");
            probe.local_addr().expect("local address").port()
        };
        // One address at a time: a listener on 127.0.0.2:P and a bind of 0.0.0.0:P conflict.
        let free_everywhere = ips[1.min(ips.len())..]
            .iter()
            .all(|ip| TcpListener::bind((*ip, port)).is_ok());
        if free_everywhere && remember(port) {
            return port;
        }
    }
    panic!("no port free on all of {ips:?} after 200 tries")
}

/// A socket address with a free port on `ip`.
pub fn free_addr_on(ip: Ipv4Addr) -> SocketAddr {
    SocketAddr::from((ip, free_port_on(&[ip])))
}

/// A free `127.0.0.1` socket address.
pub fn free_addr() -> SocketAddr {
    free_addr_on(Ipv4Addr::LOCALHOST)
}

/// Distinct free ports on 127.0.0.1.
pub fn free_ports(n: usize) -> Vec<u16> {
    let ports: HashSet<u16> = (0..n).map(|_| free_port()).collect();
    assert_eq!(ports.len(), n, "free ports are distinct");
    ports.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_never_handed_out_twice() {
        let ports = free_ports(20);
        let again = free_ports(20);
        assert!(ports.iter().all(|p| !again.contains(p)));
    }

    #[test]
    fn a_port_free_on_several_addresses_binds_on_all() {
        let ips = [loopback(2), loopback(3), Ipv4Addr::UNSPECIFIED];
        let port = free_port_on(&ips);
        {
            let _all = TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).unwrap();
        }
        let _a = TcpListener::bind((loopback(2), port)).unwrap();
        let _b = TcpListener::bind((loopback(3), port)).unwrap();
    }
}
