//! Shared gateway state: the store, the enclaves and limits.

use std::sync::Arc;

use crate::custody::Custody;
use crate::limits::Limits;
use crate::store::Store;

/// Everything a request handler needs, shared behind an `Arc`.
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub custody: Custody,
    pub body_limit: usize,
    pub limits: Limits,
    pub webhooks: crate::config::WebhookSettings,
}

impl AppState {
    /// Runs store reads without stalling the executor. First inline, in no-wait mode
    /// ([`crate::store::nowait`]): an indexed read that finds a free reader connection costs
    /// microseconds. If any read in `f` would have waited (all readers busy, SQLITE_BUSY while the
    /// WAL is reset), `f` runs again under `block_in_place`, where the worker first hands its
    /// queued tasks to another thread, so the wait never delays unrelated requests or `/healthz`.
    /// (Running every read under `block_in_place` cost 40% more gateway CPU per signature, see
    /// docs/performance.md "Performance".) On a current-thread runtime (unit tests) the retry runs inline.
    pub async fn db<T>(self: &Arc<Self>, f: impl Fn(&dyn Store) -> T) -> Result<T, crate::error::ApiError> {
        Ok(self.read_store(f))
    }

    /// The synchronous form of [`AppState::db`], for code that already runs inside a handler.
    pub fn read_store<T>(&self, f: impl Fn(&dyn Store) -> T) -> T {
        let store = self.store.as_ref();
        if let Some(out) = crate::store::nowait::run(|| f(store)) {
            return out;
        }
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
