//! Where blocking HSM and crypto work runs: off the async executor.

use tonic::{Response, Status};

use crate::error::EnclaveError;

/// Runs blocking HSM and crypto work off the async executor.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, EnclaveError> + Send + 'static,
) -> Result<Response<T>, Status> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => Ok(Response::new(v)),
        Ok(Err(e)) => {
            if matches!(e, EnclaveError::Hsm(_) | EnclaveError::Internal(_)) {
                tracing::error!(error = %e, "enclave call failed");
            }
            Err(e.into())
        }
        Err(_) => Err(Status::internal("enclave worker panicked")),
    }
}
