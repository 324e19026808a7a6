//! Per-organization caps on what an organization's state may hold, checked on the state a change
//! leaves ([`Limits::check`]). The enclave checks them where it stages a change, on the state
//! version it then commits on (compare-and-set): concurrent changes cannot pass a cap between
//! them, since the one that commits second is decided again on the state the first left.

use crate::model::OrgState;

/// The caps (the enclave's settings, see its `max_*_per_organization`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Webhook endpoints one organization may have.
    pub webhook_endpoints: usize,
    /// Policies one organization may have.
    pub policies: usize,
    /// Bytes of policy text one organization may have: every policy's name, condition,
    /// consensus and time window together ([`policy_text_bytes`]). It bounds what a decision compiles and
    /// what a compiled set holds, so each organization's set fits the evaluator's cache.
    pub policy_text_bytes: usize,
    /// What one organization's state may weigh in the enclave's memory, loaded and its policies
    /// compiled ([`CapCounts::weight`]). The enclave's configuration sets it to half its state
    /// cache (`state_cache_mib`), the most one state may take of it: a state that did not fit would be read and compiled again on
    /// every request, each request holding its own copy.
    pub state_bytes: usize,
    /// The same for a sign-up (a sub-organization the auth proxy made for a visitor): an
    /// eighth of [`Limits::state_bytes`] by the enclave's configuration, so that a visitor's
    /// sign-ups, each at its cap, cannot make the cache read and compile them again on every
    /// request (eight weigh what one organization at its cap does; sixteen fill the cache).
    pub signup_state_bytes: usize,
}

/// The default webhook endpoint cap.
pub const DEFAULT_MAX_WEBHOOK_ENDPOINTS: usize = 10;
/// The default policy cap.
pub const DEFAULT_MAX_POLICIES: usize = 100_000;
/// The default cap on an organization's policy text: 256 KiB, four clauses at their own cap
/// (`coffer_policy::MAX_CLAUSE_BYTES`), or deny lists of about 5,000 addresses. Compiled, the
/// densest text (literal lists of numbers) takes about 90 times its size: 23 MiB.
pub const DEFAULT_MAX_POLICY_TEXT_BYTES: usize = 256 * 1024;
/// The default cap on a state's weight: half the enclave's default state cache (64 MiB).
pub const DEFAULT_MAX_STATE_BYTES: usize = 32 << 20;
/// The default cap on a sign-up's state's weight: an eighth of [`DEFAULT_MAX_STATE_BYTES`].
pub const DEFAULT_MAX_SIGNUP_STATE_BYTES: usize = DEFAULT_MAX_STATE_BYTES / 8;

/// Estimated bytes of a loaded state apart from its records: the maps' roots and derived indexes
/// (an organization with one user, API key, wallet and account measured about 15 KiB in all).
const STATE_BYTES: usize = 12 * 1024;
/// Estimated bytes of one record of a state (a user, credential, policy, wallet, account, ...).
const RECORD_BYTES: usize = 768;
/// Estimated bytes of a compiled policy per byte of its text (the densest source measured 86).
const COMPILED_BYTES_PER_TEXT_BYTE: usize = 96;
/// Estimated bytes a smart contract interface takes per byte of its body and address (the text
/// kept, and the ABI the transaction facts read from it).
const INTERFACE_BYTES_PER_BYTE: usize = 4;
/// Estimated bytes of a retired key id (a deleted wallet's, account's or key's id, kept so that
/// no id comes back).
const RETIRED_ID_BYTES: usize = 96;

impl Default for Limits {
    fn default() -> Self {
        Self {
            webhook_endpoints: DEFAULT_MAX_WEBHOOK_ENDPOINTS,
            policies: DEFAULT_MAX_POLICIES,
            policy_text_bytes: DEFAULT_MAX_POLICY_TEXT_BYTES,
            state_bytes: DEFAULT_MAX_STATE_BYTES,
            signup_state_bytes: DEFAULT_MAX_SIGNUP_STATE_BYTES,
        }
    }
}

/// The bytes of policy text `state` holds: every policy's name, condition, consensus and time
/// window (the name too: every decision's outcomes carry it).
pub fn policy_text_bytes(state: &OrgState) -> usize {
    state.policies.values().map(text_bytes).sum()
}

/// Which cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    WebhookEndpoints,
    Policies,
    PolicyTextBytes,
    StateBytes,
}

impl Limit {
    /// What it counts, in words.
    pub fn what(self) -> &'static str {
        match self {
            Limit::WebhookEndpoints => "webhook endpoints",
            Limit::Policies => "policies",
            Limit::PolicyTextBytes => "bytes of policy text (names, conditions, consensus and time windows together)",
            Limit::StateBytes => "bytes of state in the enclave's memory (estimated from its records and policy text)",
        }
    }

    /// The enclave setting that sets it.
    pub fn setting(self) -> &'static str {
        match self {
            Limit::WebhookEndpoints => "max_webhook_endpoints_per_organization",
            Limit::Policies => "max_policies_per_organization",
            Limit::PolicyTextBytes => "max_policy_text_bytes_per_organization",
            Limit::StateBytes => "state_cache_mib, half of which one organization may take (a sign-up a sixteenth)",
        }
    }
}

/// A change would leave an organization with more than a cap allows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "an organization may have at most {max} {} (it would have {count}; the enclave's {})",
    limit.what(),
    limit.setting()
)]
pub struct LimitExceeded {
    pub limit: Limit,
    pub max: usize,
    pub count: usize,
}

impl Limits {
    /// No cap (the import of states as the gateway's records have them).
    pub const UNBOUNDED: Limits = Limits {
        webhook_endpoints: usize::MAX,
        policies: usize::MAX,
        policy_text_bytes: usize::MAX,
        state_bytes: usize::MAX,
        signup_state_bytes: usize::MAX,
    };

    /// The caps of `organization`: a sign-up's state weighs at most
    /// [`Limits::signup_state_bytes`].
    pub fn of(&self, organization: &crate::model::Organization) -> Limits {
        match organization.auth_proxy_signup && organization.parent_id.is_some() {
            true => Limits { state_bytes: self.signup_state_bytes.min(self.state_bytes), ..*self },
            false => *self,
        }
    }

    /// Refuses the state a change leaves (counted `after`) when the change added to something
    /// (the state before it counted `before`) and leaves more of it than its cap. A change that
    /// adds nothing (an update, a delete) passes, so an organization above a lowered cap can
    /// still shrink and edit what it has.
    pub fn check(&self, before: &CapCounts, after: &CapCounts) -> Result<(), LimitExceeded> {
        let counts = [
            (Limit::WebhookEndpoints, self.webhook_endpoints, before.webhook_endpoints, after.webhook_endpoints),
            (Limit::Policies, self.policies, before.policies, after.policies),
            (Limit::PolicyTextBytes, self.policy_text_bytes, before.policy_text_bytes, after.policy_text_bytes),
            (Limit::StateBytes, self.state_bytes, before.weight(), after.weight()),
        ];
        for (limit, max, was, count) in counts {
            if count > was && count > max {
                return Err(LimitExceeded { limit, max, count });
            }
        }
        Ok(())
    }
}

/// What the caps count in one state, kept beside it so that a change is counted by what it
/// touched ([`CapCounts::after`]), not by reading the whole state again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CapCounts {
    pub webhook_endpoints: usize,
    pub policies: usize,
    pub policy_text_bytes: usize,
    /// Every record of the state ([`OrgState::record_count`]).
    pub records: usize,
    /// Bytes of every smart contract interface's body and address.
    pub interface_bytes: usize,
    /// Retired key ids ([`OrgState::retired_key_ids`]).
    pub retired_ids: usize,
}

fn interface_bytes(i: &crate::model::ContractInterface) -> usize {
    i.body.len() + i.address.len()
}

fn text_bytes(p: &crate::model::Policy) -> usize {
    p.name.len() + p.condition.len() + p.consensus.len() + p.time.len()
}

impl CapCounts {
    /// CapCounts `state` whole (on a load).
    pub fn of(state: &OrgState) -> Self {
        Self {
            webhook_endpoints: state.webhook_endpoints.len(),
            policies: state.policies.len(),
            policy_text_bytes: policy_text_bytes(state),
            records: state.record_count(),
            interface_bytes: state.contract_interfaces.values().map(interface_bytes).sum(),
            retired_ids: state.retired_key_ids.len(),
        }
    }

    /// The counts with `n` more records (none of them a policy or a webhook endpoint): what a
    /// key use that makes wallets, accounts or keys will leave, checked before it makes them.
    pub fn with_records(self, n: usize) -> Self {
        Self { records: self.records.saturating_add(n), ..self }
    }

    /// What the state counted weighs in the enclave's memory, loaded and its policies compiled,
    /// estimated (and over-estimated: 32 MiB by this measure took about 20 MiB of resident
    /// memory): the state cache is charged this, and [`Limits::state_bytes`] caps it.
    pub fn weight(&self) -> usize {
        STATE_BYTES
            .saturating_add(RECORD_BYTES.saturating_mul(self.records))
            .saturating_add(COMPILED_BYTES_PER_TEXT_BYTE.saturating_mul(self.policy_text_bytes))
            .saturating_add(INTERFACE_BYTES_PER_BYTE.saturating_mul(self.interface_bytes))
            .saturating_add(RETIRED_ID_BYTES.saturating_mul(self.retired_ids))
    }

    /// The counts of `after`, which a change of `before` (counted `self`) left, given the
    /// (kind, id) of the entries the change touched (put or deleted; repeats count once): the
    /// policies' text and the interfaces' bodies of those alone are read.
    pub fn after<'a>(
        &self,
        before: &OrgState,
        after: &OrgState,
        touched: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Self {
        use crate::model::kinds;
        let touched: std::collections::BTreeSet<(&str, &str)> = touched.into_iter().collect();
        let ids = |kind: &'static str| touched.iter().filter(move |(k, _)| *k == kind).map(|(_, id)| *id);
        let text =
            |s: &OrgState| -> usize { ids(kinds::POLICY).filter_map(|id| s.policies.get(id)).map(text_bytes).sum() };
        let bodies = |s: &OrgState| -> usize {
            ids(kinds::CONTRACT_INTERFACE).filter_map(|id| s.contract_interfaces.get(id)).map(interface_bytes).sum()
        };
        Self {
            webhook_endpoints: after.webhook_endpoints.len(),
            policies: after.policies.len(),
            policy_text_bytes: (self.policy_text_bytes + text(after)).saturating_sub(text(before)),
            records: after.record_count(),
            interface_bytes: (self.interface_bytes + bodies(after)).saturating_sub(bodies(before)),
            retired_ids: after.retired_key_ids.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::effect::Effect;
    use crate::model::{Named, Organization, Policy};

    fn endpoint(id: &str) -> Effect {
        Effect::PutWebhookEndpoint { endpoint: Named { id: id.into(), value: format!("https://x.test/{id}") } }
    }

    fn policy(id: &str) -> Effect {
        Effect::PutPolicy {
            policy: Policy {
                id: id.into(),
                name: id.into(),
                effect: "EFFECT_ALLOW".into(),
                condition: String::new(),
                consensus: String::new(),
                time: String::new(),
            },
        }
    }

    /// Applies `effects` to `s` as the enclave stages them: on a copy, kept only within limits.
    fn stage(s: &mut OrgState, limits: &Limits, effects: &[Effect]) -> Result<(), LimitExceeded> {
        let mut next = s.clone();
        next.apply_all(effects).unwrap();
        let touched: Vec<String> = effects
            .iter()
            .filter_map(|e| match e {
                Effect::PutPolicy { policy } => Some(vec![policy.id.clone()]),
                Effect::DeletePolicies { ids } => Some(ids.clone()),
                _ => None,
            })
            .flatten()
            .collect();
        let before = CapCounts::of(s);
        let after = before.after(s, &next, touched.iter().map(|id| (crate::model::kinds::POLICY, id.as_str())));
        // Counted by what the change touched, as counted whole.
        assert_eq!(after, CapCounts::of(&next));
        limits.check(&before, &after)?;
        *s = next;
        Ok(())
    }

    #[test]
    fn a_change_past_a_cap_is_refused_and_changes_nothing() {
        let limits = Limits { webhook_endpoints: 2, policies: 3, ..Limits::default() };
        let mut s = OrgState::new(Organization { id: "o".into(), ..Default::default() });
        stage(&mut s, &limits, &[endpoint("a")]).unwrap();
        stage(&mut s, &limits, &[endpoint("b")]).unwrap();
        let full = s.clone();
        let e = stage(&mut s, &limits, &[endpoint("c")]).unwrap_err();
        assert_eq!(e, LimitExceeded { limit: Limit::WebhookEndpoints, max: 2, count: 3 });
        assert!(e.to_string().contains("at most 2 webhook endpoints"), "{e}");
        assert!(e.to_string().contains("max_webhook_endpoints_per_organization"), "{e}");
        assert_eq!(s, full);
        // Replacing one (an update) adds nothing: allowed at the cap.
        stage(&mut s, &limits, &[endpoint("a")]).unwrap();
        // A delete and a create in one change stay at the cap.
        stage(&mut s, &limits, &[Effect::DeleteWebhookEndpoints { ids: vec!["a".into()] }, endpoint("c")]).unwrap();
        assert_eq!(s.webhook_endpoints.len(), 2);

        // Several at once count together: two policies fit, then two more do not.
        stage(&mut s, &limits, &[policy("1"), policy("2")]).unwrap();
        let e = stage(&mut s, &limits, &[policy("3"), policy("4")]).unwrap_err();
        assert_eq!(e, LimitExceeded { limit: Limit::Policies, max: 3, count: 4 });
        stage(&mut s, &limits, &[policy("3")]).unwrap();
    }

    #[test]
    fn above_a_lowered_cap_an_organization_may_shrink_and_edit_but_not_grow() {
        let mut s = OrgState::new(Organization { id: "o".into(), ..Default::default() });
        let wide = Limits { webhook_endpoints: 5, ..Limits::default() };
        stage(&mut s, &wide, &[endpoint("a"), endpoint("b"), endpoint("c")]).unwrap();
        let narrow = Limits { webhook_endpoints: 1, ..Limits::default() };
        stage(&mut s, &narrow, &[endpoint("b")]).unwrap();
        stage(&mut s, &narrow, &[Effect::DeleteWebhookEndpoints { ids: vec!["c".into()] }]).unwrap();
        assert!(stage(&mut s, &narrow, &[endpoint("d")]).is_err());
        assert_eq!(s.webhook_endpoints.len(), 2);
    }

    fn policy_of(id: &str, condition: &str) -> Effect {
        match policy(id) {
            Effect::PutPolicy { mut policy } => {
                policy.condition = condition.into();
                policy.consensus = "approvers.count() > 0".into();
                Effect::PutPolicy { policy }
            }
            _ => unreachable!(),
        }
    }

    #[test]
    fn an_organization_s_policy_text_is_capped_in_total() {
        // Issue 39: 96 policies of 9 MB of text grew the gateway to 1.43 GB.
        let limits = Limits { policy_text_bytes: 100, ..Limits::default() };
        let mut s = OrgState::new(Organization { id: "o".into(), ..Default::default() });
        // Each policy: its name (1 byte), its consensus (21) and a condition of 18: 40 bytes.
        let forty = "x".repeat(40 - 1 - "approvers.count() > 0".len());
        stage(&mut s, &limits, &[policy_of("1", &forty), policy_of("2", &forty)]).unwrap();
        assert_eq!(policy_text_bytes(&s), 80);
        let e = stage(&mut s, &limits, &[policy_of("3", &forty)]).unwrap_err();
        assert_eq!(e, LimitExceeded { limit: Limit::PolicyTextBytes, max: 100, count: 120 });
        assert!(e.to_string().contains("at most 100 bytes of policy text"), "{e}");
        assert!(e.to_string().contains("max_policy_text_bytes_per_organization"), "{e}");
        // Rewriting a policy shorter passes; longer past the cap does not.
        stage(&mut s, &limits, &[policy_of("1", "")]).unwrap();
        assert!(stage(&mut s, &limits, &[policy_of("2", &"y".repeat(200))]).is_err());
    }

    /// The helper's finding: a contract interface's body (up to 400 KiB each) was charged as any
    /// record, so a tenant could hold hundreds of MB in a state that weighed a few.
    #[test]
    fn an_interface_weighs_its_body_and_is_counted_by_what_a_change_touched() {
        use crate::model::{kinds, ContractInterface};
        let mut s = OrgState::new(Organization { id: "o".into(), ..Default::default() });
        let put = |id: &str, body: usize| Effect::PutContractInterface {
            interface: ContractInterface {
                id: id.into(),
                address: "0xabc".into(),
                interface_type: "SMART_CONTRACT_INTERFACE_TYPE_ETHEREUM".into(),
                body: "x".repeat(body),
            },
        };
        let before = CapCounts::of(&s);
        let mut next = s.clone();
        next.apply_all(&[put("a", 100_000)]).unwrap();
        let after = before.after(&s, &next, [(kinds::CONTRACT_INTERFACE, "a")]);
        assert_eq!(after, CapCounts::of(&next));
        assert!(after.weight() >= before.weight() + 400_000, "{} -> {}", before.weight(), after.weight());
        let limits = Limits { state_bytes: before.weight() + 100_000, ..Limits::default() };
        assert_eq!(limits.check(&before, &after).unwrap_err().limit, Limit::StateBytes);
        s = next;
        // Replaced by a smaller one: lighter, and counted so.
        let mut next = s.clone();
        next.apply_all(&[put("a", 10)]).unwrap();
        let smaller = after.after(&s, &next, [(kinds::CONTRACT_INTERFACE, "a")]);
        assert_eq!(smaller, CapCounts::of(&next));
        assert!(limits.check(&after, &smaller).is_ok());
    }

    #[test]
    fn a_signup_weighs_at_most_its_own_cap() {
        let limits = Limits::default();
        let mut organization = Organization { id: "s".into(), ..Default::default() };
        assert_eq!(limits.of(&organization), limits);
        organization.parent_id = Some("p".into());
        assert_eq!(limits.of(&organization), limits, "a sub-organization its parent made is not a sign-up");
        organization.auth_proxy_signup = true;
        assert_eq!(limits.of(&organization).state_bytes, 4 << 20);
        assert_eq!(Limits::UNBOUNDED.of(&organization), Limits::UNBOUNDED);
    }

    #[test]
    fn the_defaults_are_the_documented_ones() {
        assert_eq!(
            Limits::default(),
            Limits {
                webhook_endpoints: 10,
                policies: 100_000,
                policy_text_bytes: 256 * 1024,
                state_bytes: 32 << 20,
                signup_state_bytes: 4 << 20
            }
        );
    }
}
