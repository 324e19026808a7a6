//! Where blocking HSM and crypto work runs: off the async executor.

use tonic::{Response, Status};

use crate::error::EnclaveError;

/// Runs blocking HSM and crypto work off the async executor, in an audit scope of its own: every
/// decision the authority allows inside `f` gets its outcome line when `f` returns (see
/// `crate::audit`; a call that goes on after `f` carries its decisions out).
pub(super) async fn run_blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, EnclaveError> + Send + 'static,
) -> Result<T, EnclaveError> {
    match tokio::task::spawn_blocking(move || crate::audit::scope(f)).await {
        Ok(result) => result,
        Err(_) => Err(EnclaveError::Internal("enclave worker panicked".into())),
    }
}

/// [`run_blocking`], answered as gRPC.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, EnclaveError> + Send + 'static,
) -> Result<Response<T>, Status> {
    run_blocking(f).await.map(Response::new).map_err(status)
}

/// An enclave error as a gRPC status; HSM and internal failures are logged.
pub(super) fn status(e: EnclaveError) -> Status {
    if matches!(e, EnclaveError::Hsm(_) | EnclaveError::Internal(_)) {
        tracing::error!(error = %e, "enclave call failed");
    }
    e.into()
}
