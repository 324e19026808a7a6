//! Gives hyper's own error answers (400 malformed request, 414, 431) the JSON error body.
//!
//! hyper answers a request it cannot parse by itself, before any handler sees it, with an
//! empty body and no `Content-Type`, and offers no hook to change that. This wrapper sits
//! between hyper and the socket and replaces exactly those answers: a response head that starts
//! a write, has one of those statuses and declares `content-length: 0`. Every answer the router
//! produces carries a JSON body, so it can never match.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use axum::http::StatusCode;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::error::ApiError;

/// A connection's socket, with hyper's bodiless error answers rewritten to JSON.
pub struct JsonErrors<S> {
    inner: S,
    max_header_bytes: usize,
    /// A rewritten answer not yet fully written.
    pending: Vec<u8>,
    written: usize,
}

impl<S> JsonErrors<S> {
    pub fn new(inner: S, max_header_bytes: usize) -> Self {
        Self { inner, max_header_bytes, pending: Vec::new(), written: 0 }
    }
}

/// The JSON error for a status hyper answers a parse failure with.
fn parse_error(status: u16, max_header_bytes: usize) -> Option<ApiError> {
    let message = match status {
        400 => "malformed HTTP request".to_string(),
        414 => "request URI too long".to_string(),
        431 => format!("request header fields too large: at most {max_header_bytes} bytes and 100 headers"),
        _ => return None,
    };
    Some(ApiError { status: StatusCode::from_u16(status).ok(), ..ApiError::invalid(message) })
}

/// The replacement for `buf` when it is one of hyper's bodiless parse-error answers.
fn rewrite(buf: &[u8], max_header_bytes: usize) -> Option<Vec<u8>> {
    let head_len = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    if head_len != buf.len() || !buf.starts_with(b"HTTP/1.1 4") {
        return None;
    }
    let head = std::str::from_utf8(&buf[..head_len]).ok()?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next()?;
    let status: u16 = status_line.get(9..12)?.parse().ok()?;
    let error = parse_error(status, max_header_bytes)?;
    let mut empty = false;
    let mut kept = String::new();
    for line in lines.filter(|l| !l.is_empty()) {
        let lower = line.to_ascii_lowercase();
        if lower == "content-length: 0" {
            empty = true;
        } else if lower.starts_with("content-type:") || lower.starts_with("content-length:") {
            return None;
        } else if !lower.starts_with("connection:") {
            kept.push_str(line);
            kept.push_str("\r\n");
        }
    }
    if !empty {
        return None;
    }
    let body = error.body().to_string();
    Some(
        format!(
            "{status_line}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n{kept}\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

impl<S: AsyncWrite + Unpin> JsonErrors<S> {
    /// Writes what is left of a rewritten answer.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.pending.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for JsonErrors<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for JsonErrors<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        ready!(self.poll_pending(cx))?;
        if let Some(answer) = rewrite(buf, self.max_header_bytes) {
            self.pending = answer;
            self.written = 0;
            // The whole original counts as written; the replacement goes out on the next polls.
            let _ = self.poll_pending(cx)?;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    // Not vectored: hyper then hands every response over as one flat buffer, so an answer's
    // head is always seen whole at the start of a write.
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_bodiless_parse_error_answers_are_rewritten() {
        let hyper_431 = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: x\r\n\r\n";
        let out = String::from_utf8(rewrite(hyper_431, 65536).unwrap()).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 431 "));
        assert!(head.contains("content-type: application/json\r\n"));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        assert!(head.contains("date: x"));
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["code"], 3);
        assert!(json["message"].as_str().unwrap().contains("65536"));

        // The router's own answers (a body, a content type) and other statuses pass untouched.
        let ours = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
        assert!(rewrite(ours, 1).is_none());
        assert!(rewrite(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n", 1).is_none());
        assert!(rewrite(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", 1).is_none());
        assert!(rewrite(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n", 1).is_none(), "partial head");
    }

    /// hyper itself, on a real connection, answers a malformed request and oversized headers
    /// with the JSON body through the wrapper.
    #[tokio::test]
    async fn hyper_parse_errors_reach_the_client_as_json() {
        use hyper_util::rt::{TokioExecutor, TokioIo};
        use hyper_util::server::conn::auto::Builder;
        use hyper_util::service::TowerToHyperService;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        for (request, status) in [
            (b"GET / HTTP/1.1\r\nHost: x\r\nbad header line\r\n\r\n".to_vec(), "400"),
            ([b"GET / HTTP/1.1\r\nX-Big: ".as_slice(), &[b'a'; 20_000], b"\r\n\r\n"].concat(), "431"),
        ] {
            let (client, server) = tokio::io::duplex(1 << 20);
            let router = axum::Router::new().route("/", axum::routing::get(|| async { "unreachable" }));
            let conn = tokio::spawn(async move {
                let mut builder = Builder::new(TokioExecutor::new());
                builder.http1().max_buf_size(8192);
                let io = TokioIo::new(JsonErrors::new(server, 8192));
                let _ = builder.serve_connection(io, TowerToHyperService::new(router)).await;
            });
            let (mut rd, mut wr) = tokio::io::split(client);
            wr.write_all(&request).await.unwrap();
            let mut answer = Vec::new();
            rd.read_to_end(&mut answer).await.unwrap();
            conn.await.unwrap();
            let answer = String::from_utf8(answer).unwrap();
            assert!(answer.starts_with(&format!("HTTP/1.1 {status} ")), "{answer}");
            let body = answer.split_once("\r\n\r\n").unwrap().1;
            let json: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(json["code"], 3, "{answer}");
        }
    }
}
