//! The gateway's slots for the policy dry runs it asks of the enclave: so many at once, a share
//! of them per top-level organization, a bounded wait.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::error::ApiError;
use crate::record_kinds::POLICY;
use crate::store::Store;

/// The words of every refusal by the organization's policies (the reason is in the audit logs).
pub const NOT_AUTHORIZED: &str = "request not authorized";
pub const ROOT_ONLY: &str = "request not authorized: only root quorum users may submit this activity";

/// The settings of policy evaluation (see docs/operations.md "Operating limits").
#[derive(Debug, Clone)]
pub struct PolicySettings {
    /// Dry runs the gateway asks of the enclave at once.
    pub slots: usize,
    /// Evaluations of one organization at once (at least 1, at most `slots`).
    pub per_organization: usize,
    /// Longest wait for an evaluation slot before the request is shed with a 503.
    pub queue_timeout: Duration,
    /// Policies one organization may have; `create_policy(ies)` past it is refused with a 400.
    pub max_policies_per_organization: usize,
}

impl PolicySettings {
    /// From the configuration: 0 slots is the machine's cores, 0 per organization is half of
    /// them (at least 1).
    pub fn new(slots: usize, per_organization: usize, queue_timeout_ms: u64, max_policies: usize) -> Self {
        let slots = match slots {
            0 => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2),
            n => n,
        };
        let per_organization = match per_organization {
            0 => (slots / 2).max(1),
            n => n.min(slots),
        };
        Self {
            slots,
            per_organization,
            queue_timeout: Duration::from_millis(queue_timeout_ms),
            max_policies_per_organization: max_policies,
        }
    }
}

impl Default for PolicySettings {
    fn default() -> Self {
        Self::new(0, 0, DEFAULT_QUEUE_TIMEOUT_MS, DEFAULT_MAX_POLICIES)
    }
}

pub const DEFAULT_QUEUE_TIMEOUT_MS: u64 = 10_000;
pub const DEFAULT_MAX_POLICIES: usize = 100_000;

static SETTINGS: OnceLock<PolicySettings> = OnceLock::new();

/// Sets the process's policy settings; the first call wins (the gateway calls it at start,
/// before serving). Without it the defaults apply.
pub fn configure(settings: PolicySettings) {
    let _ = SETTINGS.set(settings);
}

fn settings() -> &'static PolicySettings {
    SETTINGS.get_or_init(PolicySettings::default)
}

/// The process's evaluation share.
pub fn share() -> &'static EvaluationShare {
    static SHARE: OnceLock<EvaluationShare> = OnceLock::new();
    SHARE.get_or_init(|| EvaluationShare::new(settings()))
}

/// Slots for evaluations asked of the enclave, and a per-organization share of them. A request
/// waits for its organization's share first and a slot second, both in arrival order; so an
/// organization with many expensive evaluations queues behind itself and leaves the other
/// slots to others.
pub struct EvaluationShare {
    slots: Arc<tokio::sync::Semaphore>,
    per_org: Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
    per_org_limit: usize,
    wait: Duration,
}

/// The request class named by the 503 of a shed evaluation.
struct PolicyEvaluation;

impl std::fmt::Debug for PolicyEvaluation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("policy evaluation")
    }
}

impl EvaluationShare {
    fn new(s: &PolicySettings) -> Self {
        Self {
            slots: Arc::new(tokio::sync::Semaphore::new(s.slots.max(1))),
            per_org: Mutex::new(HashMap::new()),
            per_org_limit: s.per_organization.max(1),
            wait: s.queue_timeout,
        }
    }

    /// Runs `evaluation` within `org`'s share; a 503 if no slot came within the wait. The slot is
    /// held until the evaluation ends.
    pub async fn run<T>(&self, org: &str, evaluation: impl Future<Output = T>) -> Result<T, ApiError> {
        let share = {
            let mut map = self.per_org.lock().map_err(|_| ApiError::internal())?;
            map.entry(org.to_string())
                .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(self.per_org_limit)))
                .clone()
        };
        let started = std::time::Instant::now();
        let acquired = tokio::time::timeout(self.wait, async {
            let mine = share.clone().acquire_owned().await.ok()?;
            let slot = self.slots.clone().acquire_owned().await.ok()?;
            Some((mine, slot))
        })
        .await;
        drop(share);
        let Ok(Some(held)) = acquired else {
            self.forget_idle(org);
            crate::metrics::observe_policy_evaluation_shed();
            return Err(ApiError::overloaded(PolicyEvaluation));
        };
        crate::metrics::observe_policy_evaluation_wait(started.elapsed());
        let t = std::time::Instant::now();
        let out = evaluation.await;
        crate::metrics::observe_policy_evaluation(t.elapsed());
        drop(held);
        self.forget_idle(org);
        Ok(out)
    }

    /// Drops an organization's share once nobody holds or waits for it (every holder and waiter
    /// keeps a clone), so the map holds only the organizations being evaluated.
    fn forget_idle(&self, org: &str) {
        if let Ok(mut map) = self.per_org.lock() {
            if map.get(org).is_some_and(|s| Arc::strong_count(s) == 1) {
                map.remove(org);
            }
        }
    }
}

/// Refuses (400) `adding` more policies when the organization would then have more than
/// `max_policies_per_organization`: an early answer from the gateway's records, before any work.
/// It is not the cap: concurrent creations can all pass it. The enclave decides the cap (its own
/// `max_policies_per_organization`) on the state each change commits on.
pub fn check_policy_count(store: &dyn Store, org: &str, adding: usize) -> Result<(), ApiError> {
    let max = settings().max_policies_per_organization;
    let (count, _) = store.records_version(org, POLICY)?;
    let count = usize::try_from(count).unwrap_or(0);
    if count.saturating_add(adding) > max {
        return Err(ApiError::invalid(format!(
            "too many policies: an organization may have at most {max} (it has {count}, this adds {adding}; \
             see max_policies_per_organization)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_organization_gets_its_share_of_the_slots_and_no_more() {
        let share = EvaluationShare::new(&PolicySettings::new(2, 1, 300, 0));
        let (release, held) = tokio::sync::oneshot::channel::<()>();
        let (started, running) = tokio::sync::oneshot::channel::<()>();
        let first = share.run("x", async move {
            let _ = started.send(());
            held.await.ok();
            1
        });
        let others = async {
            running.await.unwrap();
            // x holds its one share: its next evaluation waits, then is shed with the 503.
            let e = share.run("x", async { 2 }).await.unwrap_err();
            assert_eq!(e.retry_after, Some(1));
            assert!(e.message.contains("too many policy evaluation requests"), "{}", e.message);
            // y gets the other slot meanwhile.
            assert_eq!(share.run("y", async { 3 }).await.unwrap(), 3);
            release.send(()).unwrap();
        };
        let (first, ()) = tokio::join!(first, others);
        assert_eq!(first.unwrap(), 1);
        // Once x's evaluation ended, its share is free again, and nothing is kept for idle ones.
        assert_eq!(share.run("x", async { 4 }).await.unwrap(), 4);
        assert!(share.per_org.lock().unwrap().is_empty());
    }
}
