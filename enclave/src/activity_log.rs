//! Each organization's activity log head as this enclave appends to it: a per-organization lock
//! and cached head in front of the authority store's compare-and-set.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use coffer_auth::proof::{self, LogLink};

use crate::authority_store::{AuthorityStore, StoreError};
use crate::error::{EnclaveError, RefusalReason};

/// Each organization's log head as this enclave last appended it; the store's compare-and-set
/// orders appends across enclaves.
#[derive(Default)]
pub struct ActivityLog {
    heads: Mutex<HashMap<String, Arc<HeadSlot>>>,
}

/// One organization's head as this enclave last appended it, `(links, head)`; `None` until read
/// from the store (or after another enclave moved it). Held through an append.
type HeadSlot = Mutex<Option<(u64, String)>>;

/// How many times an append recomputes after another enclave appended first.
const APPEND_TRIES: usize = 8;

impl ActivityLog {
    fn slot(&self, organization_id: &str) -> Result<Arc<HeadSlot>, EnclaveError> {
        let mut heads = self.heads.lock().map_err(|_| EnclaveError::Internal("activity log poisoned".into()))?;
        Ok(heads.entry(organization_id.to_string()).or_default().clone())
    }

    /// Appends the link `make(seq, previous head)` returns, signed by `sign` before the head
    /// moves (a link the store took is always one the enclave signed).
    pub fn append<T>(
        &self,
        store: &dyn AuthorityStore,
        organization_id: &str,
        make: impl Fn(u64, &str) -> Result<(LogLink, T), EnclaveError>,
    ) -> Result<(LogLink, T), EnclaveError> {
        let slot = self.slot(organization_id)?;
        let mut cached = slot.lock().map_err(|_| EnclaveError::Internal("activity log poisoned".into()))?;
        for _ in 0..APPEND_TRIES {
            let (links, head) = match cached.clone() {
                Some(h) => h,
                None => store.log_head(organization_id)?.unwrap_or_else(|| (0, proof::genesis(organization_id))),
            };
            let (link, signed) = make(links + 1, &head)?;
            match store.advance_log(organization_id, links, &link.head) {
                Ok(()) => {
                    *cached = Some((links + 1, link.head.clone()));
                    return Ok((link, signed));
                }
                Err(StoreError::VersionMoved { .. }) => *cached = None,
                Err(e) => {
                    *cached = None;
                    return Err(e.into());
                }
            }
        }
        Err(EnclaveError::Busy {
            reason: RefusalReason::Unspecified,
            message: "the activity log kept moving; retry".into(),
        })
    }
}
