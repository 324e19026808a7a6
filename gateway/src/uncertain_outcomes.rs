//! Organizations with a state change whose enclave call got no answer (the enclave may have
//! applied it): the catch-up (`catch_up.rs`) repairs them from the enclave's state once it answers.

use std::collections::BTreeSet;
use std::sync::Mutex;

/// Most organizations kept; past it the rest are left to `coffer-gateway rebuild` (logged).
const MAX_KEPT: usize = 10_000;

static UNCERTAIN: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Notes that a change of `organization_id` may have been applied by the enclave unanswered.
pub fn note(organization_id: &str) {
    let mut kept = UNCERTAIN.lock().unwrap_or_else(|e| e.into_inner());
    if kept.len() < MAX_KEPT {
        kept.insert(organization_id.to_string());
    } else {
        tracing::warn!(organization = %organization_id, "too many organizations to catch up with the enclave: run coffer-gateway rebuild for it");
    }
}

/// Every organization noted since the last call, once.
pub fn take() -> Vec<String> {
    std::mem::take(&mut *UNCERTAIN.lock().unwrap_or_else(|e| e.into_inner())).into_iter().collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn each_organization_is_taken_once() {
        super::note("uncertain-test-b");
        super::note("uncertain-test-a");
        super::note("uncertain-test-b");
        let ours =
            |taken: Vec<String>| taken.into_iter().filter(|o| o.starts_with("uncertain-test-")).collect::<Vec<_>>();
        assert_eq!(ours(super::take()), ["uncertain-test-a", "uncertain-test-b"]);
        assert!(ours(super::take()).is_empty());
    }
}
