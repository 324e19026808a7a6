//! The gateway's gRPC client to the enclave: a lazy HTTP/2 channel over the Unix socket that
//! reconnects by itself when the enclave restarts.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use coffer_proto::v1::enclave_client::EnclaveClient;
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

/// A cheap-to-clone handle to the enclave.
pub type Enclave = EnclaveClient<Metered<Channel>>;

/// A channel that counts each call by gRPC method and outcome, with its latency (`/metrics`).
#[derive(Clone, Debug)]
pub struct Metered<S>(S);

impl<S, B, R> tower::Service<axum::http::Request<B>> for Metered<S>
where
    S: tower::Service<axum::http::Request<B>, Response = axum::http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    R: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: axum::http::Request<B>) -> Self::Future {
        let method = request.uri().path().rsplit('/').next().unwrap_or_default().to_string();
        let started = Instant::now();
        let call = self.0.call(request);
        Box::pin(async move {
            let result = call.await;
            // An error answer is "trailers only": its grpc-status is in the headers.
            let outcome = match &result {
                Ok(r) if r.headers().get("grpc-status").is_some_and(|s| s != "0") => "error",
                Ok(_) => "ok",
                Err(_) => "unavailable",
            };
            crate::metrics::observe_enclave_call(&method, outcome, started.elapsed());
            result
        })
    }
}

/// Connects lazily: the first call (and every call after the enclave went away) dials again.
pub fn connect(socket: PathBuf) -> Result<Enclave, tonic::transport::Error> {
    let channel = Endpoint::try_from("http://enclave.invalid")?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(30))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(socket).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }));
    Ok(EnclaveClient::new(Metered(channel)).max_decoding_message_size(64 * 1024 * 1024))
}

/// When the enclave last answered a health probe (milliseconds since the process's first look,
/// plus one; 0 = not since the last failed call). Process-wide: a gateway has one enclave client.
static LAST_ANSWER: AtomicU64 = AtomicU64::new(0);

fn since_start() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// A health probe reached the enclave.
pub fn note_answered() {
    LAST_ANSWER.store(since_start(), Ordering::Relaxed);
}

/// A call found the enclave unreachable: the next health check asks it again.
pub fn note_unreachable() {
    LAST_ANSWER.store(0, Ordering::Relaxed);
}

/// Whether a probe reached the enclave within `window` and no call has failed since, so a
/// health check can answer without queueing behind key operations on the enclave's connection.
pub fn answered_within(window: Duration) -> bool {
    let at = LAST_ANSWER.load(Ordering::Relaxed);
    at != 0 && since_start().saturating_sub(at) <= window.as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_call_forgets_the_last_answer() {
        note_answered();
        assert!(answered_within(Duration::from_secs(60)));
        note_unreachable();
        assert!(!answered_within(Duration::from_secs(60)));
        note_answered();
        std::thread::sleep(Duration::from_millis(30));
        assert!(!answered_within(Duration::from_millis(10)), "an answer older than the window");
    }
}
