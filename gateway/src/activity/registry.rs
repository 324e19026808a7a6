//! The operation registry's types: an activity is a path, its type, its intent and result keys,
//! its policy resource and action, and one handler over a typed intent.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use coffer_proto::v1 as pb;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::STATUS_CONSENSUS_NEEDED;
use crate::error::ApiError;
use crate::stamps::Caller;
use crate::state::AppState;
use crate::store::{ActivityRecord, Nanos, Organization, Write};

pub type BoxFut<T> = Pin<Box<dyn Future<Output = Result<T, ApiError>> + Send>>;

/// What an activity handler produced: the result body and the effects to commit with it.
pub struct Outcome {
    pub result: Value,
    pub writes: Vec<Write>,
}

/// Context of one activity being executed.
pub struct Ctx {
    pub state: Arc<AppState>,
    /// Every operation (what the pipeline runs).
    pub registry: &'static Registry,
    pub org: Organization,
    pub caller: Caller,
    pub activity_id: String,
    pub now: Nanos,
    /// What authorizes the activity in the enclave: the stamped submission (and, after
    /// consensus, the approving vote). Every enclave call carries it.
    pub auth: pb::Authorization,
    /// The activity's fingerprint (of the stamped submission).
    pub fingerprint: String,
    /// What the enclave returned for this activity so far beside its answers (app proofs, the
    /// evaluation of a key operation).
    pub returned: Arc<crate::custody::Returned>,
}

impl Ctx {
    /// The enclaves, on behalf of this activity (every call carries [`Ctx::auth`]).
    pub fn enclave(&self) -> crate::custody::Admitted<'_> {
        self.state.custody.authorized(&self.auth).collecting(&self.returned)
    }

    /// The id of the `index`th new record labelled `label` (`coffer_org_rules::transition`'s
    /// `*_ID` labels) this activity makes: derived from its stamped body, as the enclave's
    /// transition derives it (the gateway names no record a decision may read).
    pub fn derived_id(&self, label: &str, index: usize) -> String {
        coffer_auth::envelope::derived_id(&self.fingerprint, label, index)
    }
}

/// Context of one query.
pub struct QueryCtx {
    pub state: Arc<AppState>,
    pub registry: &'static Registry,
    pub org: Organization,
    pub caller: Caller,
}

pub type ActivityHandler = fn(Ctx, Value) -> BoxFut<Outcome>;
pub type QueryHandler = fn(QueryCtx, Value) -> BoxFut<Value>;

/// A check of an intent's parameters that runs before policies see them.
pub type IntentCheck = fn(&Value) -> Result<(), ApiError>;

/// One submit endpoint.
pub struct Operation {
    /// `/public/v1/submit/<path>`.
    pub path: &'static str,
    /// The latest versioned type, the one every official client sends.
    pub activity_type: &'static str,
    /// Key of the intent inside `activity.intent`.
    pub intent_key: &'static str,
    /// Key of the result inside `activity.result`.
    pub result_key: &'static str,
    /// Policy resource and action (spec 12.4), for the policy engine.
    pub resource: &'static str,
    pub action: &'static str,
    /// Root-quorum-only (spec 8.4 remarks, 12.2): only root users may submit it, and it runs
    /// only when the submitter's vote meets the root quorum threshold.
    pub root_quorum: bool,
    /// Checks the intent before policies see it, for a 400 that names the field instead of a
    /// policy error (sign_transaction: a transaction that does not parse).
    pub precheck: Option<IntentCheck>,
    /// A login activity (oauth_login, stamp_login, create_read_write_session): the parent
    /// organization's credentials may submit it for a sub-organization, under the parent's
    /// policies — the one exception to "parents read, not act".
    pub parent_may_act: bool,
    pub handler: ActivityHandler,
}

impl Operation {
    /// Parameters the activity record keeps only as `"<redacted>"` (otp_auth's typed code): they
    /// reach the enclave in the stamped body, and no stored or served copy of the activity
    /// (`coffer_org_rules::subjects::secret_parameters`, which the enclave reads too).
    pub fn secret_parameters(&self) -> &'static [&'static str] {
        coffer_org_rules::subjects::secret_parameters(self.activity_type)
    }

    /// The intent's parameters as the activity record keeps them: each of
    /// [`Operation::secret_parameters`] present is `"<redacted>"`.
    pub fn recorded_parameters(&self, kept: serde_json::Value) -> serde_json::Value {
        coffer_org_rules::subjects::recorded_parameters(self.activity_type, kept)
    }

    /// `votes` as the activity record keeps them: the stamped body each carries as `message`
    /// with [`Operation::secret_parameters`] redacted. Such a vote's signature then no longer
    /// verifies over its message; the enclave's log link still attests the stamp it verified.
    pub fn recorded_votes(&self, mut votes: serde_json::Value) -> serde_json::Value {
        if self.secret_parameters().is_empty() {
            return votes;
        }
        for vote in votes.as_array_mut().into_iter().flatten() {
            let Some(message) = vote.get("message").and_then(serde_json::Value::as_str) else { continue };
            let redacted = match serde_json::from_str::<serde_json::Value>(message) {
                Ok(mut body) => {
                    if let Some(p) = body.get_mut("parameters") {
                        *p = self.recorded_parameters(p.take());
                    }
                    body.to_string()
                }
                Err(_) => coffer_org_rules::subjects::REDACTED.to_string(),
            };
            vote["message"] = serde_json::Value::String(redacted);
        }
        votes
    }
}

/// One query endpoint.
pub struct Query {
    /// `/public/v1/query/<path>`.
    pub path: &'static str,
    pub handler: QueryHandler,
}

/// Every operation, by path and by type: the pipeline receives it (in [`AppState`]) instead of
/// knowing the handlers.
pub struct Registry {
    pub activities: &'static [Operation],
    pub queries: &'static [Query],
}

impl Registry {
    /// The activity submitted at `submit/<path>`.
    pub fn activity(&self, path: &str) -> Option<&'static Operation> {
        self.activities.iter().find(|o| o.path == path)
    }

    /// The operation `activity_type` asks for at `submit/<path>`: the current version, or an
    /// older version a current client still sends (`subjects::OLDER_VERSIONS`), registered at the
    /// same path with its own intent and result keys.
    pub fn activity_version(&self, path: &str, activity_type: &str) -> Option<&'static Operation> {
        self.activities.iter().find(|o| o.path == path && o.activity_type == activity_type)
    }

    /// The query at `query/<path>`.
    pub fn query(&self, path: &str) -> Option<&'static Query> {
        self.queries.iter().find(|q| q.path == path)
    }

    /// The registered operation of an activity type (the current version, or an older one).
    pub fn activity_by_type(&self, activity_type: &str) -> Option<&'static Operation> {
        self.activities.iter().find(|o| o.activity_type == activity_type)
    }

    /// Whether `caller` may still vote on `a`: it awaits consensus, the caller acts in its
    /// organization and has not voted, and (root-quorum-only activities) is a root user.
    pub fn can_vote(&self, org: &Organization, a: &ActivityRecord, caller: &Caller) -> bool {
        if a.status != STATUS_CONSENSUS_NEEDED || caller.via_parent || a.organization_id != org.id {
            return false;
        }
        let voted = a.votes.as_array().is_some_and(|v| v.iter().any(|v| v["userId"] == caller.user.id.as_str()));
        let root_only = self.activity_by_type(&a.activity_type).is_some_and(|op| op.root_quorum);
        !voted && (!root_only || org.root_user_ids.contains(&caller.user.id))
    }
}

/// Decodes a typed intent or request; a mismatch is a 400 naming the field.
pub fn decode<T: DeserializeOwned>(params: Value) -> Result<T, ApiError> {
    serde_json::from_value(params).map_err(|e| ApiError::invalid(format!("invalid parameters: {e}")))
}

/// Wraps `async fn(Ctx, Intent) -> Result<Outcome, ApiError>` into an [`ActivityHandler`].
#[macro_export]
macro_rules! activity_handler {
    ($f:path) => {
        |ctx, params| {
            Box::pin(async move {
                let intent = $crate::activity::registry::decode(params)?;
                $f(ctx, intent).await
            })
        }
    };
}

/// Wraps `async fn(QueryCtx, Request) -> Result<Value, ApiError>` into a [`QueryHandler`].
#[macro_export]
macro_rules! query_handler {
    ($f:path) => {
        |ctx, params| {
            Box::pin(async move {
                let request = $crate::activity::registry::decode(params)?;
                $f(ctx, request).await
            })
        }
    };
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn secret_parameters_are_kept_redacted_in_the_intent_and_the_votes_body() {
        let op = crate::ops::ACTIVITIES.iter().find(|o| o.path == "otp_auth").unwrap();
        let params = json!({ "otpId": "o", "otpCode": "123456", "targetPublicKey": "04ab" });
        let kept = op.recorded_parameters(params.clone());
        assert_eq!(kept, json!({ "otpId": "o", "otpCode": "<redacted>", "targetPublicKey": "04ab" }));
        let body = json!({ "type": "ACTIVITY_TYPE_OTP_AUTH", "parameters": params }).to_string();
        let votes = op.recorded_votes(json!([{ "message": body, "signature": "s" }]));
        let message = votes[0]["message"].as_str().unwrap();
        assert!(!message.contains("123456") && message.contains("<redacted>"), "{message}");
        // Other operations keep their bodies as signed.
        let other = crate::ops::ACTIVITIES.iter().find(|o| o.path == "init_otp").unwrap();
        let votes = json!([{ "message": "{\"parameters\":{\"otpCode\":\"1\"}}" }]);
        assert_eq!(other.recorded_votes(votes.clone()), votes);
    }
}
