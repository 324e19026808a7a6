//! How the gateway reaches its enclaves: lazy HTTP/2 channels over Unix sockets or over TCP with
//! mutual TLS, that reconnect by themselves when an enclave restarts, with failover between
//! several enclaves, metered; and [`Transport`], the one type every transport is seen as.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use tonic::body::BoxBody;
use tonic::transport::{Channel, Endpoint, Uri};
use tower::ServiceExt;

/// The error a transport fails a call with (it never reached an enclave, or got no answer).
pub type TransportError = Box<dyn std::error::Error + Send + Sync>;
type Call =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<axum::http::Response<BoxBody>, TransportError>> + Send>>;

/// Any HTTP/2 service that answers gRPC requests, as one cheap-to-clone, `Sync` type: the metered
/// channels of [`connect_all`] in production, an enclave service in the same process in tests
/// (`tower`'s `BoxCloneService` is not `Sync`, and the gateway's state is shared across threads).
#[derive(Clone)]
pub struct Transport(Arc<dyn Fn(axum::http::Request<BoxBody>) -> Call + Send + Sync>);

impl Transport {
    /// Wraps `service`; each call goes to a clone of it, made ready first.
    pub fn new<S, B>(service: S) -> Self
    where
        S: tower::Service<axum::http::Request<BoxBody>, Response = axum::http::Response<B>>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
        S::Error: Into<TransportError>,
        B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
        B::Error: Into<TransportError>,
    {
        Transport(Arc::new(move |request| {
            let service = service.clone();
            Box::pin(async move {
                let response = service.oneshot(request).await.map_err(Into::into)?;
                Ok(response.map(|b| BoxBody::new(b.map_err(|e| tonic::Status::from_error(e.into())))))
            })
        }))
    }
}

impl tower::Service<axum::http::Request<BoxBody>> for Transport {
    type Response = axum::http::Response<BoxBody>;
    type Error = TransportError;
    type Future = Call;

    fn poll_ready(&mut self, _cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: axum::http::Request<BoxBody>) -> Self::Future {
        (self.0)(request)
    }
}

/// How long an enclave that could not be reached is passed over before it is tried again.
const DOWN_FOR: Duration = Duration::from_secs(2);

/// One enclave of a [`Failover`]: its name (socket path or URL, for logs and metrics), its
/// channel, and until when it is passed over (milliseconds on [`since_start`]'s clock; 0 = up).
struct Member {
    name: String,
    channel: Channel,
    down_until: AtomicU64,
}

/// Several enclaves behind one client. Each call goes to the next enclave that is up, in turn; a
/// call that cannot reach its enclave (no socket, connection refused or reset) is sent to the
/// next one, and the unreachable one is passed over for [`DOWN_FOR`]. Only calls that never got
/// an answer move: an enclave's refusal or error is the answer. Resending is safe because every
/// key operation is decided from the stamped body: the same body signs to the same signature
/// (RFC 6979, Ed25519) and exports to the same target, and a creation whose answer was lost left
/// nothing in the store.
#[derive(Clone)]
pub struct Failover {
    members: Arc<[Member]>,
    next: Arc<AtomicUsize>,
}

impl Failover {
    /// The members in the order one call tries them: those up from the next in turn, then
    /// those passed over (a call fails only when every enclave failed it).
    fn order(&self) -> Vec<usize> {
        let n = self.members.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let now = since_start();
        let (mut up, mut down) = (Vec::with_capacity(n), Vec::new());
        for i in (0..n).map(|k| (start + k) % n) {
            if self.members[i].down_until.load(Ordering::Relaxed) > now {
                down.push(i);
            } else {
                up.push(i);
            }
        }
        up.extend(down);
        up
    }
}

impl tower::Service<axum::http::Request<BoxBody>> for Failover {
    type Response = axum::http::Response<BoxBody>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        // Each member's channel is made ready when a call picks it.
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: axum::http::Request<BoxBody>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            // Unary calls: the body is one small message, kept so that it can be sent again.
            let body = body.collect().await?.to_bytes();
            let mut last: Option<Self::Error> = None;
            for i in this.order() {
                let member = &this.members[i];
                let mut request = axum::http::Request::new(tonic::body::boxed(http_body_util::Full::new(body.clone())));
                *request.method_mut() = parts.method.clone();
                *request.uri_mut() = parts.uri.clone();
                *request.version_mut() = parts.version;
                *request.headers_mut() = parts.headers.clone();
                // A unary answer is read whole here: a connection lost after the answer's
                // headers (the enclave killed while writing it) is a call that got no answer.
                let answered = match member.channel.clone().oneshot(request).await {
                    Ok(response) => {
                        let (head, body) = response.into_parts();
                        body.collect().await.map(|whole| (head, whole)).map_err(Self::Error::from)
                    }
                    Err(e) => Err(e.into()),
                };
                match answered {
                    Ok((head, whole)) => {
                        member.down_until.store(0, Ordering::Relaxed);
                        let trailers = whole.trailers().cloned();
                        let body = http_body_util::Full::new(whole.to_bytes())
                            .with_trailers(std::future::ready(trailers.map(Ok)));
                        return Ok(axum::http::Response::from_parts(head, tonic::body::boxed(body)));
                    }
                    Err(e) => {
                        if this.members.len() > 1 {
                            tracing::warn!(enclave = %member.name, error = %e, "enclave unreachable; trying the next");
                        }
                        member.down_until.store(since_start() + DOWN_FOR.as_millis() as u64, Ordering::Relaxed);
                        crate::metrics::observe_enclave_unreachable(&member.name);
                        last = Some(e);
                    }
                }
            }
            Err(last.unwrap_or_else(|| "no enclave configured".into()))
        })
    }
}

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

/// Where an enclave listens: a Unix socket, or a TCP address reached with mutual TLS.
#[derive(Debug, Clone, PartialEq)]
pub enum EnclaveEndpoint {
    Unix(PathBuf),
    /// `https://HOST:PORT`; the enclave's certificate must name HOST and chain to `tls.ca`.
    Tls {
        url: String,
        tls: EnclaveTls,
    },
}

/// PEM files for mutual TLS with enclaves over TCP: the CA that issued the enclaves'
/// certificates, and the gateway's own certificate and private key.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct EnclaveTls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl EnclaveEndpoint {
    /// The socket path or URL, as logs and metrics name the enclave.
    pub fn name(&self) -> String {
        match self {
            EnclaveEndpoint::Unix(p) => p.display().to_string(),
            EnclaveEndpoint::Tls { url, .. } => url.clone(),
        }
    }
}

/// Connects lazily to several enclaves sharing one HSM's keys, with [`Failover`] between them:
/// the first call (and every call after an enclave went away) dials again.
pub fn connect_all(endpoints: Vec<EnclaveEndpoint>) -> anyhow::Result<Transport> {
    let members = endpoints
        .into_iter()
        .map(|endpoint| {
            Ok(Member { name: endpoint.name(), channel: channel(endpoint)?, down_until: AtomicU64::new(0) })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let failover = Failover { members: members.into(), next: Arc::new(AtomicUsize::new(0)) };
    Ok(Transport::new(Metered(failover)))
}

fn channel(endpoint: EnclaveEndpoint) -> anyhow::Result<Channel> {
    let configure = |e: Endpoint| {
        e.connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(30))
            .http2_keep_alive_interval(Duration::from_secs(30))
    };
    Ok(match endpoint {
        EnclaveEndpoint::Unix(socket) => configure(Endpoint::try_from("http://enclave.invalid")?)
            .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let socket = socket.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(socket).await?;
                    Ok::<_, std::io::Error>(TokioIo::new(stream))
                }
            })),
        EnclaveEndpoint::Tls { url, tls } => {
            let read = |p: &std::path::Path| {
                std::fs::read(p)
                    .map(zeroize::Zeroizing::new)
                    .map_err(|e| anyhow::anyhow!("reading {}: {e}", p.display()))
            };
            let (ca, cert, key) = (read(&tls.ca)?, read(&tls.cert)?, read(&tls.key)?);
            let host = url::Url::parse(&url)?.host_str().map(str::to_string).unwrap_or_default();
            let config = tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(&*ca))
                .identity(tonic::transport::Identity::from_pem(&*cert, &*key))
                .domain_name(host);
            configure(Endpoint::from_shared(url)?.tls_config(config)?).connect_lazy()
        }
    })
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
