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
    /// Runs store reads. They are short, indexed SQLite reads on a pooled reader connection
    /// (WAL: never blocked by the writer), so they run inline: a hop to the blocking pool costs
    /// more than the read itself (measured with `coffer-bench`, see README "Performance").
    pub async fn db<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&dyn Store) -> T + Send + 'static,
    ) -> Result<T, crate::error::ApiError> {
        Ok(f(self.store.as_ref()))
    }

    /// Commits an activity with its effects: the group committer replies through a oneshot,
    /// so no thread waits for the fsync.
    pub async fn commit(
        self: &Arc<Self>,
        record: crate::store::ActivityRecord,
        writes: Vec<crate::store::Write>,
    ) -> Result<crate::store::Committed, crate::error::ApiError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.store.commit_then(
            record,
            writes,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        rx.await.map_err(|_| crate::error::ApiError::internal())?.map_err(Into::into)
    }
}
