//! Organizations with a state change whose enclave call got no answer (the enclave may have
//! applied it), or whose records did not follow the enclave's changes: the catch-up
//! (`catch_up.rs`) repairs them from the enclave's state once it answers, and once no activity of
//! theirs is between its enclave call and its commit here.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// Most organizations kept; past it the rest are left to `coffer-gateway rebuild` (logged).
const MAX_KEPT: usize = 10_000;
/// Tries of one organization before it is left to `coffer-gateway rebuild` (logged).
const MAX_TRIES: u32 = 30;

/// Each organization noted, and how many times its catch-up failed.
static UNCERTAIN: Mutex<BTreeMap<String, u32>> = Mutex::new(BTreeMap::new());

/// Activities of each organization this gateway is running (from before their enclave calls to
/// after their commit): a repair read between an enclave's commit and ours would write what the
/// activity is about to write, or be overwritten by it.
static WORKING: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());

/// An activity of an organization at work ([`working`]); its organization's repair waits until
/// it is dropped.
pub struct Working(String);

/// Whether an activity of `organization_id` is running ([`working`]).
pub fn is_working(organization_id: &str) -> bool {
    WORKING.lock().unwrap_or_else(|e| e.into_inner()).contains_key(organization_id)
}

/// Marks an activity of `organization_id` as running until the guard is dropped.
pub fn working(organization_id: &str) -> Working {
    *WORKING.lock().unwrap_or_else(|e| e.into_inner()).entry(organization_id.to_string()).or_insert(0) += 1;
    Working(organization_id.to_string())
}

impl Drop for Working {
    fn drop(&mut self) {
        let mut working = WORKING.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = working.get_mut(&self.0) {
            *n -= 1;
            if *n == 0 {
                working.remove(&self.0);
            }
        }
    }
}

/// A state change sent to the enclave whose outcome is not yet recorded here ([`unrecorded`]):
/// dropped before [`Unrecorded::settled`], its organization is noted (the enclave may have applied
/// it: no answer, a client that went away mid-request, a commit here that failed).
pub struct Unrecorded(Option<String>);

/// A state change of `organization_id` about to be sent to the enclave.
pub fn unrecorded(organization_id: &str) -> Unrecorded {
    Unrecorded(Some(organization_id.to_string()))
}

impl Unrecorded {
    /// Its outcome is recorded here, or the enclave refused it (nothing applied).
    pub fn settled(mut self) {
        self.0 = None;
    }
}

impl Drop for Unrecorded {
    fn drop(&mut self) {
        if let Some(organization_id) = self.0.take() {
            note(&organization_id);
        }
    }
}

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

/// Every organization noted since the last call, once, with its failed tries; one with an
/// activity at work stays noted for a later call.
pub fn take() -> Vec<(String, u32)> {
    let working = WORKING.lock().unwrap_or_else(|e| e.into_inner());
    let mut kept = UNCERTAIN.lock().unwrap_or_else(|e| e.into_inner());
    let (busy, ready): (BTreeMap<String, u32>, BTreeMap<String, u32>) =
        std::mem::take(&mut *kept).into_iter().partition(|(o, _)| working.contains_key(o));
    *kept = busy;
    ready.into_iter().collect()
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
        // An organization with an activity at work is taken only once it is done.
        super::note("uncertain-test-c");
        let first = super::working("uncertain-test-c");
        let second = super::working("uncertain-test-c");
        assert!(ours(super::take()).is_empty());
        drop(first);
        assert!(ours(super::take()).is_empty());
        drop(second);
        assert_eq!(ours(super::take()), [("uncertain-test-c".into(), 0)]);
        // A change sent and never settled is noted; one settled is not.
        super::unrecorded("uncertain-test-d").settled();
        drop(super::unrecorded("uncertain-test-e"));
        assert_eq!(ours(super::take()), [("uncertain-test-e".into(), 0)]);
    }
}
