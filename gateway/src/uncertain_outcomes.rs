//! Organizations with a state change whose enclave call got no answer (the enclave may have
//! applied it): the catch-up (`catch_up.rs`) repairs them from the enclave's state once it answers.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// Most organizations kept; past it the rest are left to `coffer-gateway rebuild` (logged).
const MAX_KEPT: usize = 10_000;
/// Tries of one organization before it is left to `coffer-gateway rebuild` (logged).
const MAX_TRIES: u32 = 30;

/// Each organization noted, and how many times its catch-up failed.
static UNCERTAIN: Mutex<BTreeMap<String, u32>> = Mutex::new(BTreeMap::new());

/// Notes that a change of `organization_id` may have been applied by the enclave unanswered.
pub fn note(organization_id: &str) {
    keep(organization_id, 0);
}

/// Notes `organization_id` again after its `tries`th catch-up failed, unless it has failed
/// [`MAX_TRIES`] times.
pub fn retry(organization_id: &str, tries: u32) {
    if tries + 1 >= MAX_TRIES {
        tracing::warn!(organization = %organization_id, tries = tries + 1, "not caught up with the enclave: run coffer-gateway rebuild for it");
        return;
    }
    keep(organization_id, tries + 1);
}

fn keep(organization_id: &str, tries: u32) {
    let mut kept = UNCERTAIN.lock().unwrap_or_else(|e| e.into_inner());
    if kept.len() < MAX_KEPT || kept.contains_key(organization_id) {
        let t = kept.entry(organization_id.to_string()).or_insert(tries);
        *t = (*t).max(tries);
    } else {
        tracing::warn!(organization = %organization_id, "too many organizations to catch up with the enclave: run coffer-gateway rebuild for it");
    }
}

/// Every organization noted since the last call, once, with its failed tries.
pub fn take() -> Vec<(String, u32)> {
    std::mem::take(&mut *UNCERTAIN.lock().unwrap_or_else(|e| e.into_inner())).into_iter().collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn each_organization_is_taken_once_and_dropped_after_its_tries() {
        let ours = |taken: Vec<(String, u32)>| {
            taken.into_iter().filter(|(o, _)| o.starts_with("uncertain-test-")).collect::<Vec<_>>()
        };
        super::note("uncertain-test-b");
        super::note("uncertain-test-a");
        super::note("uncertain-test-b");
        assert_eq!(ours(super::take()), [("uncertain-test-a".into(), 0), ("uncertain-test-b".into(), 0)]);
        assert!(ours(super::take()).is_empty());
        super::retry("uncertain-test-a", 3);
        super::retry("uncertain-test-b", super::MAX_TRIES - 1);
        assert_eq!(ours(super::take()), [("uncertain-test-a".into(), 4)]);
    }
}
