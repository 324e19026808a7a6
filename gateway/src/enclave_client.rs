//! The gateway's gRPC client to the enclave: a lazy HTTP/2 channel over the Unix socket that
//! reconnects by itself when the enclave restarts.

use std::path::PathBuf;
use std::time::Duration;

use coffer_proto::v1::enclave_client::EnclaveClient;
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

/// A cheap-to-clone handle to the enclave.
pub type Enclave = EnclaveClient<Channel>;

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
    Ok(EnclaveClient::new(channel).max_decoding_message_size(64 * 1024 * 1024))
}
