//! Operator authorization: `BootstrapOrganization`, `RotateKek` and `DestroyKek` run only for a
//! body stamped, just now and once, by an operator key of the enclave's own configuration
//! (`operator_public_keys`), never on the gateway's word. Every refusal and allow writes its
//! `coffer_audit` line.

use coffer_auth::operator::{self, BootstrapBody, KekBody, OperatorBody};
use coffer_auth::stamp;
use coffer_proto::v1 as pb;

use crate::admission::Admission;
use crate::error::{EnclaveError, RefusalReason};

/// The operation name of a bootstrap in audit lines and the replay window.
pub const BOOTSTRAP_ORGANIZATION: &str = "bootstrap_organization";
/// The operation name of a KEK rotation in audit lines and the replay window.
pub const ROTATE_KEK: &str = "rotate_kek";
/// The operation name of a KEK's destruction in audit lines and the replay window.
pub const DESTROY_KEK: &str = "destroy_kek";

/// The operators' public keys (compressed P-256, lowercase hex), from the configuration.
#[derive(Debug, Clone, Default)]
pub struct Operators {
    keys: Vec<String>,
}

/// An operator body stamped by an operator, verified.
#[derive(Debug)]
pub struct Stamped<B> {
    pub body: B,
    /// The operator key that stamped it.
    pub operator: String,
}

/// A bootstrap an operator stamped, verified.
pub type OperatorBootstrap = Stamped<BootstrapBody>;

impl Operators {
    /// `keys` as `EnclaveConfig::operator_keys` checked them.
    pub fn new(keys: Vec<String>) -> Self {
        Self { keys: keys.into_iter().map(|k| k.to_ascii_lowercase()).collect() }
    }

    /// Verifies the operator's stamped bootstrap body: an `X-Stamp` over exactly the body by a
    /// configured operator key, a bootstrap body, fresh, and not used before.
    pub fn authorize_bootstrap(
        &self,
        admission: &Admission,
        request: Option<&pb::StampedRequest>,
    ) -> Result<OperatorBootstrap, EnclaveError> {
        self.authorize(admission, request, BOOTSTRAP_ORGANIZATION, operator::parse_bootstrap)
    }

    /// Verifies the operator's stamped KEK body of `operation` ([`ROTATE_KEK`] or
    /// [`DESTROY_KEK`]) as [`Operators::authorize_bootstrap`] does a bootstrap's.
    pub fn authorize_kek(
        &self,
        admission: &Admission,
        request: Option<&pb::StampedRequest>,
        operation: &'static str,
    ) -> Result<Stamped<KekBody>, EnclaveError> {
        let kind = match operation {
            ROTATE_KEK => operator::ROTATE_KEK,
            DESTROY_KEK => operator::DESTROY_KEK,
            other => return Err(EnclaveError::Internal(format!("{other} is not a KEK operation"))),
        };
        self.authorize(admission, request, operation, |body| operator::parse_kek(kind, body))
    }

    fn authorize<P>(
        &self,
        admission: &Admission,
        request: Option<&pb::StampedRequest>,
        operation: &'static str,
        parse: impl Fn(&[u8]) -> Result<OperatorBody<P>, coffer_auth::AuthError>,
    ) -> Result<Stamped<OperatorBody<P>>, EnclaveError> {
        let refusal = |reason: RefusalReason, message: &str, fingerprint: &str, operator: &str| {
            tracing::warn!(
                target: "coffer_audit",
                decision = "refuse",
                operation,
                reason = message,
                reason_code = reason.as_str_name(),
                credential = operator,
                fingerprint,
                "enclave decision"
            );
            match reason {
                RefusalReason::ReplayWindowFull => EnclaveError::Busy { reason, message: message.into() },
                _ => EnclaveError::refused(reason, message),
            }
        };
        let Some(request) = request else {
            return Err(refusal(RefusalReason::NoAuthorization, "no operator stamp", "", ""));
        };
        let fingerprint = coffer_auth::envelope::fingerprint(&request.body);
        let refuse = |reason, message: &str, operator: &str| refusal(reason, message, &fingerprint, operator);
        if self.keys.is_empty() {
            return Err(refuse(
                RefusalReason::NotOperator,
                "no operator key is configured (operator_public_keys): operator calls are off",
                "",
            ));
        }
        if !request.stamp_header.eq_ignore_ascii_case("X-Stamp") {
            return Err(refuse(RefusalReason::StampInvalid, "an operator call carries an X-Stamp", ""));
        }
        let s = stamp::parse(&request.stamp).map_err(|e| refuse(RefusalReason::StampInvalid, &e.message, ""))?;
        if s.scheme != stamp::Scheme::P256 || !self.keys.contains(&s.public_key) {
            return Err(refuse(RefusalReason::NotOperator, "the stamp is not by an operator key", &s.public_key));
        }
        stamp::verify(&s, &request.body).map_err(|e| refuse(RefusalReason::NotOperator, &e.message, &s.public_key))?;
        let body =
            parse(&request.body).map_err(|e| refuse(RefusalReason::OperationMismatch, &e.message, &s.public_key))?;
        if !admission.is_fresh(body.timestamp_ms) {
            return Err(refuse(
                RefusalReason::Stale,
                "stale or future timestampMs: outside the enclave's freshness window",
                &s.public_key,
            ));
        }
        match admission.first_use(operation, &body.fingerprint, body.timestamp_ms) {
            Ok(true) => {}
            Ok(false) => {
                return Err(refuse(
                    RefusalReason::Replayed,
                    "replayed request: this operator body was already used",
                    &s.public_key,
                ))
            }
            Err(e) => return Err(refuse(RefusalReason::ReplayWindowFull, &e.to_string(), &s.public_key)),
        }
        Ok(Stamped { body, operator: s.public_key })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use coffer_auth::operator::{bootstrap_body, BootstrapParameters};

    fn now_ms() -> i64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
    }

    #[test]
    fn only_a_fresh_unused_body_stamped_by_a_configured_operator_key() {
        let admission = Admission::in_memory(crate::hsm::tests::hsm(), 300_000, 16).unwrap();
        let operator_key = p256::ecdsa::SigningKey::from_slice(&[5; 32]).unwrap();
        let other = p256::ecdsa::SigningKey::from_slice(&[6; 32]).unwrap();
        let ops = Operators::new(vec![operator::public_key_hex(&operator_key)]);
        let params = BootstrapParameters {
            organization_name: "o".into(),
            root_user_name: "root".into(),
            root_api_public_key: operator::public_key_hex(&other),
        };
        let request = |key: &p256::ecdsa::SigningKey, body: &[u8]| pb::StampedRequest {
            body: body.to_vec(),
            stamp_header: "X-Stamp".into(),
            stamp: operator::stamp(key, body),
            certificate: vec![],
        };
        let reason = |r: Result<OperatorBootstrap, EnclaveError>| r.unwrap_err().refusal_reason();
        let body = bootstrap_body(&params, now_ms());
        assert_eq!(reason(ops.authorize_bootstrap(&admission, None)), Some(RefusalReason::NoAuthorization));
        assert_eq!(
            reason(ops.authorize_bootstrap(&admission, Some(&request(&other, &body)))),
            Some(RefusalReason::NotOperator)
        );
        let mut forged = request(&operator_key, &body);
        forged.body = bootstrap_body(&params, now_ms() + 1);
        assert_eq!(reason(ops.authorize_bootstrap(&admission, Some(&forged))), Some(RefusalReason::NotOperator));
        let stale = bootstrap_body(&params, now_ms() - 301_000);
        assert_eq!(
            reason(ops.authorize_bootstrap(&admission, Some(&request(&operator_key, &stale)))),
            Some(RefusalReason::Stale)
        );
        assert_eq!(
            reason(Operators::default().authorize_bootstrap(&admission, Some(&request(&operator_key, &body)))),
            Some(RefusalReason::NotOperator),
            "no operator configured: nothing is bootstrapped"
        );
        let ok = ops.authorize_bootstrap(&admission, Some(&request(&operator_key, &body))).unwrap();
        assert_eq!(ok.body.parameters, params);
        assert_eq!(
            reason(ops.authorize_bootstrap(&admission, Some(&request(&operator_key, &body)))),
            Some(RefusalReason::Replayed)
        );
    }
}
