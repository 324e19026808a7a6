//! A connection's socket under two time limits: a write that makes no progress for the write
//! timeout fails (a client that sends and never reads cannot hold the connection and its send
//! queue), and closing drains what the client is still sending for a bounded time and amount (a
//! lingering close), so it reads the answer (a 413, a 431) instead of a reset.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{sleep, Instant, Sleep};

/// How long and how much a closing connection drains.
const LINGER_FOR: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 64 << 20;

pub struct GuardedSocket<S> {
    inner: S,
    write_timeout: Duration,
    /// Armed while a write is pending; fires after `write_timeout` without progress.
    write_deadline: Option<Pin<Box<Sleep>>>,
    closing: Option<Closing>,
}

/// A lingering close in progress: the write side is shut, reads are drained until end of
/// stream, the deadline or the byte budget.
struct Closing {
    deadline: Pin<Box<Sleep>>,
    drained: usize,
}

impl<S> GuardedSocket<S> {
    pub fn new(inner: S, write_timeout: Duration) -> Self {
        Self { inner, write_timeout, write_deadline: None, closing: None }
    }

    /// A write's outcome: progress disarms the deadline, `Pending` is [`Self::stalled`].
    fn progress<T>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if poll.is_pending() {
            return self.stalled(cx);
        }
        self.write_deadline = None;
        poll
    }

    /// `Pending` from a write: arms the deadline, and fails once it has passed without progress.
    fn stalled<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let timeout = self.write_timeout;
        let deadline = self.write_deadline.get_or_insert_with(|| Box::pin(sleep(timeout)));
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client has not read for the write timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for GuardedSocket<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for GuardedSocket<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.progress(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.progress(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        self.progress(cx, poll)
    }

    /// Shuts the write side (the answer is out), then drains the client's bytes until it closes
    /// too, for at most `LINGER_FOR` and `LINGER_BYTES`: closing a socket with unread data sends
    /// a reset, which can destroy the answer before the client reads it.
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.closing.is_none() {
            match Pin::new(&mut self.inner).poll_shutdown(cx) {
                Poll::Pending => return self.stalled(cx),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {}
            }
            self.closing =
                Some(Closing { deadline: Box::pin(tokio::time::sleep_until(Instant::now() + LINGER_FOR)), drained: 0 });
        }
        let this = &mut *self;
        let Some(closing) = this.closing.as_mut() else { return Poll::Ready(Ok(())) };
        let mut sink = [0u8; 16 * 1024];
        loop {
            if closing.drained >= LINGER_BYTES || closing.deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Ok(()));
            }
            let mut buf = ReadBuf::new(&mut sink);
            match ready!(Pin::new(&mut this.inner).poll_read(cx, &mut buf)) {
                Ok(()) if buf.filled().is_empty() => return Poll::Ready(Ok(())),
                Ok(()) => closing.drained += buf.filled().len(),
                // A reset from the client ends the linger: nothing more to protect.
                Err(_) => return Poll::Ready(Ok(())),
            }
        }
    }
}
