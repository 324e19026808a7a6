//! Shared gateway state: the store, the enclave client and limits.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::enclave_client::Enclave;
use crate::error::ApiError;
use crate::store::Store;

/// Everything a request handler needs, shared behind an `Arc`.
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub enclave: Enclave,
    pub body_limit: usize,
    pub limits: Limits,
}

/// The classes of API requests, each with its own bound on requests in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestClass {
    Signing,
    Write,
    Read,
}

/// Serving limits (see README "Operating limits").
pub struct Limits {
    pub body_read_timeout: Duration,
    signing: Arc<Semaphore>,
    writes: Arc<Semaphore>,
    reads: Arc<Semaphore>,
}

impl Limits {
    pub fn new(cfg: &crate::config::GatewayConfig) -> Self {
        let sem = |n: usize| Arc::new(Semaphore::new(n.max(1)));
        Self {
            body_read_timeout: Duration::from_millis(cfg.body_read_timeout_ms),
            signing: sem(cfg.max_in_flight_signing),
            writes: sem(cfg.max_in_flight_writes),
            reads: sem(cfg.max_in_flight_reads),
        }
    }

    /// A slot for one request of `class`, or at once a 503 with `Retry-After` when all are taken
    /// (overload is shed, not queued).
    pub fn admit(&self, class: RequestClass) -> Result<OwnedSemaphorePermit, ApiError> {
        let sem = match class {
            RequestClass::Signing => &self.signing,
            RequestClass::Write => &self.writes,
            RequestClass::Read => &self.reads,
        };
        sem.clone().try_acquire_owned().map_err(|_| ApiError::overloaded(class))
    }
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
