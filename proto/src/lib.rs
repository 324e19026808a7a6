//! Generated types and gRPC stubs for the gateway <-> enclave contract.
#![allow(clippy::all, missing_docs)]

pub mod v1 {
    tonic::include_proto!("coffer.enclave.v1");
}

/// The `Refusal` the enclave attaches as the details of every PERMISSION_DENIED and
/// RESOURCE_EXHAUSTED status it returns; `None` for another code, or a status that did not come
/// from the enclave (no decodable details).
fn refusal(status: &tonic::Status) -> Option<v1::Refusal> {
    use prost::Message;
    if !matches!(status.code(), tonic::Code::PermissionDenied | tonic::Code::ResourceExhausted) {
        return None;
    }
    let details = status.details();
    if details.is_empty() {
        return None;
    }
    v1::Refusal::decode(details).ok()
}

/// The typed reason of an enclave refusal ([`refusal`]). Decide on this, never on the wording of
/// the status message.
pub fn refusal_reason(status: &tonic::Status) -> Option<v1::RefusalReason> {
    v1::RefusalReason::try_from(refusal(status)?.reason).ok()
}

/// The policy outcomes of the decision that refused (CONSENSUS_NEEDED, POLICY_DENIED), as the
/// enclave sent them; `None` when the refusal carries none.
pub fn refusal_evaluation(status: &tonic::Status) -> Option<String> {
    Some(refusal(status)?.evaluation).filter(|e| !e.is_empty())
}

/// The `Status` details that carry `reason` (a prost-encoded `Refusal`) and, for a refusal of the
/// organization's rules, the `evaluation` it decided with (empty otherwise).
pub fn refusal_details(reason: v1::RefusalReason, evaluation: &str) -> Vec<u8> {
    use prost::Message;
    v1::Refusal { reason: reason as i32, evaluation: evaluation.to_string() }.encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_reasons_round_trip_through_status_details() {
        let reason = v1::RefusalReason::Replayed;
        let status = tonic::Status::with_details(
            tonic::Code::PermissionDenied,
            "enclave refused: x",
            refusal_details(reason, "[]").into(),
        );
        assert_eq!(refusal_reason(&status), Some(reason));
        assert_eq!(refusal_evaluation(&status).as_deref(), Some("[]"));
        assert_eq!(refusal_reason(&tonic::Status::permission_denied("no details")), None);
        let other = tonic::Status::with_details(tonic::Code::Internal, "x", refusal_details(reason, "").into());
        assert_eq!(refusal_reason(&other), None, "only refusal codes carry a refusal");
    }
}
