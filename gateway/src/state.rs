//! Shared gateway state: the store, the enclave client and limits.

use std::sync::Arc;

use crate::enclave_client::Enclave;
use crate::limits::Limits;
use crate::store::Store;

/// Everything a request handler needs, shared behind an `Arc`.
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub enclave: Enclave,
    pub body_limit: usize,
    pub limits: Limits,
}

impl AppState {
    /// Runs store reads without stalling the executor: on the multi-threaded runtime the worker
    /// first hands its queued tasks to another thread (`block_in_place`), so a read that waits
    /// (a reader connection in use, SQLITE_BUSY retries while the WAL is reset, a cold page) never
    /// delays unrelated requests or `/healthz`. On a current-thread runtime (unit tests) it runs
    /// inline.
    pub async fn db<T>(self: &Arc<Self>, f: impl FnOnce(&dyn Store) -> T) -> Result<T, crate::error::ApiError> {
        Ok(self.read_store(f))
    }

    /// The synchronous form of [`AppState::db`], for code that already runs inside a handler.
    pub fn read_store<T>(&self, f: impl FnOnce(&dyn Store) -> T) -> T {
        let store = self.store.as_ref();
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(|| f(store))
            }
            _ => f(store),
        }
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
