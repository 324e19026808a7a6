//! Shared gateway state: the store, the enclave client and limits.

use std::sync::Arc;

use crate::enclave_client::Enclave;
use crate::store::Store;

/// Everything a request handler needs, shared behind an `Arc`.
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub enclave: Enclave,
    pub body_limit: usize,
}

impl AppState {
    /// Runs blocking store work off the async executor.
    pub async fn db<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&dyn Store) -> T + Send + 'static,
    ) -> Result<T, crate::error::ApiError> {
        let state = self.clone();
        tokio::task::spawn_blocking(move || f(state.store.as_ref()))
            .await
            .map_err(|_| crate::error::ApiError::internal())
    }
}
