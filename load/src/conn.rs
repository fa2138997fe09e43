//! One raw HTTP/1.1 keep-alive connection per goose user, made with hyper directly (as `oha`
//! and `wrk` keep one connection per virtual user): no pool, no middleware layers, no URL
//! parsing per request. The connection is made on first use and made again after any error
//! or when the server closes it (`Connection: close`, a restart after kill -9).
//!
//! Plain HTTP only: an `https` target goes through the reqwest client instead
//! ([`crate::workload::user_client`]).

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HOST, HeaderValue};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Where the raw connections go: `host:port` to connect to, and the `Host` header.
#[derive(Clone, Debug)]
pub struct Target {
    addr: String,
    host: HeaderValue,
}

impl Target {
    /// The target of a plain-HTTP base URL; `None` for any other scheme (https) or a URL
    /// without a host.
    #[must_use]
    pub fn of(base: &reqwest::Url) -> Option<Self> {
        if base.scheme() != "http" {
            return None;
        }
        let host = base.host_str()?;
        let port = base.port_or_known_default()?;
        let addr = format!("{host}:{port}");
        let host = HeaderValue::from_str(&addr).ok()?;
        Some(Self { addr, host })
    }
}

/// Why a request got no answer; each is one error class of the stats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// No connection (refused, unreachable, handshake failed).
    Connect,
    /// No complete answer within the timeout.
    Timeout,
    /// The request could not be built (bad path).
    Client,
    /// The connection failed while sending or before the head of the answer.
    Transport,
    /// The connection failed while reading the body.
    Body,
}

impl Failure {
    /// The error class counted in the stats.
    #[must_use]
    pub fn class(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Timeout => "timeout",
            Self::Client => "client",
            Self::Transport => "transport",
            Self::Body => "body",
        }
    }
}

/// One user's connection (none until first used, or after a failure).
#[derive(Debug, Default)]
pub struct Conn {
    sender: Option<SendRequest<Full<Bytes>>>,
}

async fn connect(target: &Target) -> Result<SendRequest<Full<Bytes>>, Failure> {
    let stream = TcpStream::connect(&target.addr)
        .await
        .map_err(|_| Failure::Connect)?;
    stream.set_nodelay(true).map_err(|_| Failure::Connect)?;
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|_| Failure::Connect)?;
    // the connection's driver: ends when the connection closes (error, server close, or
    // every `SendRequest` dropped)
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

impl Conn {
    /// The connection's sender, ready for a request: the open one if it is still usable,
    /// else a new one.
    async fn ready(&mut self, target: &Target) -> Result<&mut SendRequest<Full<Bytes>>, Failure> {
        if let Some(s) = &mut self.sender
            && (s.is_closed() || s.ready().await.is_err())
        {
            self.sender = None;
        }
        if self.sender.is_none() {
            self.sender = Some(connect(target).await?);
        }
        self.sender.as_mut().ok_or(Failure::Connect)
    }

    async fn exchange(
        &mut self,
        target: &Target,
        method: Method,
        path: &Uri,
        json: Option<Bytes>,
        bearer: Option<&str>,
    ) -> Result<(u16, Bytes), Failure> {
        let mut builder = Request::builder()
            .method(method)
            .uri(path.clone())
            .header(HOST, target.host.clone());
        if json.is_some() {
            builder = builder.header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        if let Some(credential) = bearer {
            let value = HeaderValue::try_from(format!("Bearer {credential}"))
                .map_err(|_| Failure::Client)?;
            builder = builder.header(http::header::AUTHORIZATION, value);
        }
        let request = builder
            .body(Full::new(json.unwrap_or_default()))
            .map_err(|_| Failure::Client)?;
        let sender = self.ready(target).await?;
        let response = match sender.try_send_request(request).await {
            Ok(r) => r,
            Err(mut e) => {
                self.sender = None;
                // hyper hands the request back when it never wrote it (the connection was
                // found closed before the write). Like hyper-util's pool, send it once more on
                // a fresh connection. A request that was written is never sent twice: when the
                // server drops an idle connection just as the request goes out, hyper reports
                // `IncompleteMessage` without the request (the server may or may not have read
                // it), and that stays a `transport` error, as with hyper-util.
                let Some(request) = e.take_message() else {
                    return Err(Failure::Transport);
                };
                let sender = self.ready(target).await?;
                match sender.send_request(request).await {
                    Ok(r) => r,
                    Err(_) => {
                        self.sender = None;
                        return Err(Failure::Transport);
                    }
                }
            }
        };
        let status = response.status().as_u16();
        match response.into_body().collect().await {
            Ok(body) => Ok((status, body.to_bytes())),
            Err(_) => {
                self.sender = None;
                Err(Failure::Body)
            }
        }
    }

    /// Sends one request on this connection (made or remade first if needed) and reads the
    /// whole answer, within `timeout` for all of it. A timed-out connection is dropped (its
    /// answer may still come and would be taken for the next request's).
    ///
    /// # Errors
    /// The [`Failure`] that kept the request from an answer.
    pub async fn send(
        &mut self,
        target: &Target,
        method: Method,
        path: &Uri,
        (json, bearer): (Option<Bytes>, Option<&str>),
        timeout: Duration,
    ) -> Result<(u16, Bytes), Failure> {
        let exchange = self.exchange(target, method, path, json, bearer);
        match tokio::time::timeout(timeout, exchange).await {
            Ok(r) => r,
            Err(_) => {
                self.sender = None;
                Err(Failure::Timeout)
            }
        }
    }
}

/// The address of a URL's host and port (the scheme's usual port when none is given): a
/// message naming `--url` otherwise.
///
/// # Errors
/// The URL does not parse, names no host or port, or does not resolve.
pub fn socket_addr(url: &str) -> Result<SocketAddr, String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("--url {url}: {e}"))?;
    let port = parsed.port().or(match parsed.scheme() {
        "http" => Some(80),
        "https" => Some(443),
        "redis" => Some(6379),
        "postgres" | "postgresql" => Some(5432),
        _ => None,
    });
    let (Some(host), Some(port)) = (parsed.host_str(), port) else {
        return Err(format!("--url {url}: no host and port"));
    };
    (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.find(SocketAddr::is_ipv4).or_else(|| a.next()))
        .ok_or_else(|| format!("--url {url}: cannot resolve {host}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_http_gets_raw_connections() {
        let t = Target::of(&reqwest::Url::parse("http://127.0.0.1:8080/").unwrap()).unwrap();
        assert_eq!(t.addr, "127.0.0.1:8080");
        assert_eq!(t.host, "127.0.0.1:8080");
        let t = Target::of(&reqwest::Url::parse("http://localhost").unwrap()).unwrap();
        assert_eq!(t.addr, "localhost:80");
        assert!(Target::of(&reqwest::Url::parse("https://localhost:8443").unwrap()).is_none());
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_connect_failure_and_the_next_try_connects_again() {
        // a port that was just free: nothing listens on it
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let target =
            Target::of(&reqwest::Url::parse(&format!("http://127.0.0.1:{port}")).unwrap()).unwrap();
        let mut conn = Conn::default();
        let path: Uri = "/snowflake".parse().unwrap();
        let r = conn
            .send(
                &target,
                Method::GET,
                &path,
                (None, None),
                Duration::from_secs(10),
            )
            .await;
        assert_eq!(r, Err(Failure::Connect));
        assert!(conn.sender.is_none());
    }

    /// A server answering `{"id":N}` with the connection's number, closing every connection
    /// after its first answer, and never answering on the connection numbered `silent`.
    async fn server(silent: u64) -> Target {
        server_closing(silent, true).await
    }

    /// As [`server`]; with `announce` false the answer says nothing about closing (a keep-alive
    /// answer) and the server drops the connection right after it, as a server timing out an
    /// idle connection does.
    async fn server_closing(silent: u64, announce: bool) -> Target {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            for n in 0u64.. {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let mut got = Vec::new();
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(k) => got.extend_from_slice(&buf[..k]),
                        }
                    }
                    if n == silent {
                        tokio::time::sleep(Duration::from_secs(60)).await;
                        return;
                    }
                    let body = format!("{{\"id\":{n}}}");
                    let close = if announce {
                        "connection: close\r\n"
                    } else {
                        ""
                    };
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n{close}\r\n",
                        body.len()
                    );
                    let _ = s.write_all(format!("{head}{body}").as_bytes()).await;
                });
            }
        });
        Target::of(&reqwest::Url::parse(&format!("http://127.0.0.1:{port}")).unwrap()).unwrap()
    }

    #[tokio::test]
    async fn a_closed_connection_is_made_again_and_a_silent_one_times_out() {
        let target = server(2).await;
        let mut conn = Conn::default();
        let path: Uri = "/id/t".parse().unwrap();
        let long = Duration::from_secs(10);
        // the server closes after each answer: each request gets a new connection
        for n in 0..2 {
            let (status, body) = conn
                .send(&target, Method::GET, &path, (None, None), long)
                .await
                .unwrap();
            assert_eq!(status, 200);
            assert_eq!(body, format!("{{\"id\":{n}}}").as_bytes());
        }
        // connection 2 never answers
        let short = Duration::from_millis(300);
        let r = conn
            .send(&target, Method::GET, &path, (None, None), short)
            .await;
        assert_eq!(r, Err(Failure::Timeout));
        assert!(conn.sender.is_none());
        // and the next request is on connection 3
        let (_, body) = conn
            .send(
                &target,
                Method::POST,
                &path,
                (Some(Bytes::from_static(b"{}")), None),
                long,
            )
            .await
            .unwrap();
        assert_eq!(body, &b"{\"id\":3}"[..]);
    }
}
