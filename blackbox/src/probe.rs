//! What the hostile-client checks share: the request they measure ([`Probe`]), and their
//! connections from chosen loopback source addresses.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Uri};
use tokio::net::{TcpSocket, TcpStream};

use load::conn::{Conn, Target};

/// The request whose answer rate is measured: one the service answers without changing
/// anything (an ID, `GET /ledger`, the consume of a token never issued).
#[derive(Clone, Debug)]
pub struct Probe {
    /// Its method.
    pub method: Method,
    /// Its path (and query), `/id/orders`.
    pub path: String,
    /// Its JSON body.
    pub json: Option<Bytes>,
    /// Its `Authorization: Bearer` credential.
    pub bearer: Option<String>,
}

impl Probe {
    /// `GET path`.
    #[must_use]
    pub fn get(path: &str) -> Self {
        Self {
            method: Method::GET,
            path: path.to_owned(),
            json: None,
            bearer: None,
        }
    }

    /// `POST path` with a JSON `body` and a `bearer` credential.
    #[must_use]
    pub fn post(path: &str, body: &serde_json::Value, bearer: Option<&str>) -> Self {
        Self {
            method: Method::POST,
            path: path.to_owned(),
            json: Some(Bytes::from(body.to_string())),
            bearer: bearer.map(str::to_owned),
        }
    }

    /// Sends it once on `conn` to `target` (its path parsed: `path`), waiting at most
    /// `timeout`: whether it was served (an answer below 500; a 5xx, a refusal or a timeout is
    /// a request not served).
    pub async fn ask(
        &self,
        conn: &mut Conn,
        target: &Target,
        path: &Uri,
        timeout: Duration,
    ) -> bool {
        let r = conn
            .send(
                target,
                self.method.clone(),
                path,
                (self.json.clone(), self.bearer.as_deref()),
                timeout,
            )
            .await;
        matches!(r, Ok((status, _)) if status < 500)
    }
}

/// The source address of connection `i` of a hostile check on a loopback IPv4 target:
/// 127.0.0.2 for the first `per_source`, 127.0.0.3 for the next, …, so that a per-address
/// connection limit does not refuse them first; `None` elsewhere (the system picks).
pub fn loopback_source(target: SocketAddr, i: usize, per_source: usize) -> Option<IpAddr> {
    if !target.ip().is_loopback() || target.is_ipv6() {
        return None;
    }
    let n = 2 + i / per_source.max(1);
    let n = u8::try_from(n.min(254)).unwrap_or(254);
    Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, n)))
}

/// A socket to connect to `target` from `from` (`None`: the system picks). The port is picked
/// at connect, not at bind (`IP_BIND_ADDRESS_NO_PORT`): a bind to port 0 searches the whole
/// port range and slowed the opening of thousands of connections to a hundred a second.
///
/// # Errors
/// The socket cannot be made or bound.
pub fn socket_from(target: SocketAddr, from: Option<IpAddr>) -> std::io::Result<TcpSocket> {
    let socket = if target.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if let Some(ip) = from {
        if ip.is_ipv4() {
            // Without it the bind still works, only slower.
            let _ = nix::sys::socket::setsockopt(
                &socket,
                nix::sys::socket::sockopt::IpBindAddressNoPort,
                &true,
            );
        }
        socket.bind(SocketAddr::new(ip, 0))?;
    }
    Ok(socket)
}

/// Whether the service closed `tcp` (EOF or an error) now, without waiting.
pub fn closed_now(tcp: &TcpStream) -> bool {
    let mut buf = [0u8; 512];
    loop {
        match tcp.try_read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}
