//! The API listener: a global and a per-IP connection cap (past them, a JSON 503 and close), a
//! header read timeout that also closes connections that stay idle, a header size limit, a write
//! timeout and a lingering close (`socket`), in front of the router; hyper's own error answers get
//! the JSON body (`json_errors`).

mod json_errors;
mod socket;

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;
use crate::limits::ClientAddr;
use tower::ServiceExt;

/// Connection limits of one listener (see docs/operations.md "Operating limits").
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub max_connections_per_ip: usize,
    /// Longest wait for a request's headers, from the connection's start or the previous
    /// response on a kept-alive connection: idle and slow-header connections are closed.
    pub header_read_timeout: Duration,
    /// Largest request head (request line and headers); past it, a JSON 431. At least 8 KiB.
    pub max_header_bytes: usize,
    /// Longest a write to the client may make no progress (it sends and never reads) before the
    /// connection is closed.
    pub write_timeout: Duration,
}

/// Open connections per client address.
type PerIp = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// One admitted connection; leaving frees its global and per-IP place.
struct Slot {
    per_ip: PerIp,
    ip: IpAddr,
    _global: OwnedSemaphorePermit,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut open) = self.per_ip.lock() {
            if let Some(n) = open.get_mut(&self.ip) {
                *n -= 1;
                if *n == 0 {
                    open.remove(&self.ip);
                }
            }
        }
    }
}

fn admit(global: &Arc<Semaphore>, per_ip: &PerIp, ip: IpAddr, max_per_ip: usize) -> Option<Slot> {
    let permit = global.clone().try_acquire_owned().ok()?;
    let mut open = per_ip.lock().ok()?;
    let n = open.entry(ip).or_insert(0);
    if *n >= max_per_ip {
        return None;
    }
    *n += 1;
    Some(Slot { per_ip: per_ip.clone(), ip, _global: permit })
}

/// Answers a connection past the caps with a JSON 503 and closes it (bounded in time).
async fn refuse(mut stream: TcpStream) {
    let body = ApiError::overloaded_connections().body().to_string();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Retry-After: 1\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        if stream.write_all(response.as_bytes()).await.is_ok() && stream.shutdown().await.is_ok() {
            // Drain what the client sent so closing does not reset the answer away.
            let mut sink = [0u8; 1024];
            while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
        }
    })
    .await;
}

/// A listener on `addr` with room for `backlog` connections not yet accepted (the standard
/// library's bind asks for 128, which a burst of new clients overflows).
pub fn bind(addr: std::net::SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog.max(1))
}

/// Serves `router` on `listener` until `shutdown` resolves, then lets open requests finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let global = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let per_ip: PerIp = Arc::new(Mutex::new(HashMap::new()));
    // Refusals are cheap but not free: past this many at once, excess connections are dropped.
    let refusing = Arc::new(Semaphore::new(256));
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    // Every connection task holds a receiver; the sender's `closed()` waits for them all.
    let (open_tx, open_rx) = watch::channel(());
    let mut stop = stop_rx.clone();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors or the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => break,
        };
        let _ = stream.set_nodelay(true);
        let Some(slot) = admit(&global, &per_ip, peer.ip(), limits.max_connections_per_ip) else {
            if let Ok(permit) = refusing.clone().try_acquire_owned() {
                tokio::spawn(async move {
                    refuse(stream).await;
                    drop(permit);
                });
            }
            continue;
        };
        let (mut stop, open) = (stop_rx.clone(), open_rx.clone());
        let client = ClientAddr(peer.ip());
        let service = router.clone().map_request(move |mut request: axum::http::Request<_>| {
            request.extensions_mut().insert(client);
            request
        });
        let timeout = limits.header_read_timeout;
        tokio::spawn(async move {
            let _slot = slot;
            let _open = open;
            // hyper's header timer starts once the protocol is known: a connection that never
            // sends a byte is closed here.
            let mut first = [0u8; 1];
            if !matches!(tokio::time::timeout(timeout, stream.peek(&mut first)).await, Ok(Ok(n)) if n > 0) {
                return;
            }
            let max_header_bytes = limits.max_header_bytes.max(8192);
            let mut builder = Builder::new(TokioExecutor::new());
            builder.http1().timer(TokioTimer::new()).header_read_timeout(timeout).max_buf_size(max_header_bytes);
            let socket = socket::GuardedSocket::new(stream, limits.write_timeout);
            let io = TokioIo::new(json_errors::JsonErrors::new(socket, max_header_bytes));
            let conn = builder.serve_connection_with_upgrades(io, TowerToHyperService::new(service));
            tokio::pin!(conn);
            let mut closing = false;
            loop {
                tokio::select! {
                    _ = conn.as_mut() => break,
                    _ = stop.changed(), if !closing => {
                        closing = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
        });
    }
    drop(open_rx);
    drop(listener);
    open_tx.closed().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_count_per_address_and_free_on_drop() {
        let global = Arc::new(Semaphore::new(3));
        let per_ip: PerIp = Arc::new(Mutex::new(HashMap::new()));
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let a1 = admit(&global, &per_ip, a, 2).unwrap();
        let _a2 = admit(&global, &per_ip, a, 2).unwrap();
        assert!(admit(&global, &per_ip, a, 2).is_none(), "per-address cap");
        let b1 = admit(&global, &per_ip, b, 2).unwrap();
        assert!(admit(&global, &per_ip, b, 2).is_none(), "global cap");
        drop(a1);
        assert!(admit(&global, &per_ip, a, 2).is_some(), "a closed connection frees its places");
        drop(b1);
        assert!(!per_ip.lock().unwrap().contains_key(&b), "no entry is kept for an address without connections");
    }
}
