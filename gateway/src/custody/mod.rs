//! The seam between the gateway and its enclaves: every call for key material goes through
//! [`Custody`], which attaches the activity's stamped authorization itself and maps the enclave's
//! answers, typed refusals included, to [`ApiError`] in one place. Handlers never see tonic.

pub mod transport;

#[cfg(test)]
pub mod in_process;

use coffer_proto::v1 as pb;
use coffer_proto::v1::enclave_client::EnclaveClient;

use crate::error::{ApiError, Code};
use transport::{EnclaveEndpoint, Transport};

/// The largest answer taken from an enclave (an export, a batch of signatures).
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// The enclaves, as the gateway's operations reach them. Cheap to clone.
#[derive(Clone)]
pub struct Custody {
    client: EnclaveClient<Transport>,
}

/// The enclaves on behalf of one activity: every call carries the activity's [`pb::Authorization`]
/// (its stamped submission, and after consensus the approving vote), from which the enclave
/// derives what it may do.
pub struct Admitted<'a> {
    client: &'a EnclaveClient<Transport>,
    auth: &'a pb::Authorization,
    /// Where what the enclave returns beside each answer goes (for one activity).
    returned: Option<&'a Returned>,
}

/// What the enclave returned during one activity beside each call's answer: its app proofs, in
/// the order it made them, the policy outcomes it decided a key operation with, and the log link
/// a key operation made.
#[derive(Default)]
pub struct Returned {
    proofs: std::sync::Mutex<Vec<pb::AppProof>>,
    evaluation: std::sync::Mutex<Option<String>>,
    log_link: std::sync::Mutex<Option<pb::LogLink>>,
}

impl Returned {
    /// The app proofs returned so far, kept.
    pub fn proofs_so_far(&self) -> Vec<pb::AppProof> {
        self.proofs.lock().map(|p| p.clone()).unwrap_or_default()
    }

    /// The app proofs returned so far, taken.
    pub fn take_proofs(&self) -> Vec<pb::AppProof> {
        self.proofs.lock().map(|mut p| std::mem::take(&mut *p)).unwrap_or_default()
    }

    /// The policy outcomes (JSON text) of the last key operation the enclave decided, taken.
    pub fn take_evaluation(&self) -> Option<String> {
        self.evaluation.lock().ok().and_then(|mut e| e.take())
    }

    /// The log link a key operation made in its call (see `Authorization.log`), taken.
    pub fn take_log_link(&self) -> Option<pb::LogLink> {
        self.log_link.lock().ok().and_then(|mut l| l.take())
    }

    /// Keeps what `answer` carries beside itself.
    fn keep(&self, answer: &mut impl CarriesReturns) -> Result<(), ApiError> {
        let taken = answer.take_proofs();
        if !taken.is_empty() {
            self.proofs.lock().map_err(|_| ApiError::internal())?.extend(taken);
        }
        if let Some(evaluation) = answer.take_evaluation() {
            *self.evaluation.lock().map_err(|_| ApiError::internal())? = Some(evaluation);
        }
        if let Some(link) = answer.take_log_link() {
            *self.log_link.lock().map_err(|_| ApiError::internal())? = Some(link);
        }
        Ok(())
    }
}

/// An answer that may carry the enclave's app proofs and, for a key operation, its evaluation
/// and log link.
trait CarriesReturns {
    fn take_proofs(&mut self) -> Vec<pb::AppProof>;
    fn take_evaluation(&mut self) -> Option<String>;
    fn take_log_link(&mut self) -> Option<pb::LogLink> {
        None
    }
}

macro_rules! carries_returns {
    (decided: $($decided:ty),*; linked: $($linked:ty),*; own call: $($own:ty),*; evaluated: $($evaluated:ty),*;
     nothing: $($without:ty),* $(,)?) => {
        $(impl CarriesReturns for $decided {
            fn take_proofs(&mut self) -> Vec<pb::AppProof> {
                std::mem::take(&mut self.app_proofs)
            }
            fn take_evaluation(&mut self) -> Option<String> {
                Some(std::mem::take(&mut self.evaluation)).filter(|e| !e.is_empty())
            }
            fn take_log_link(&mut self) -> Option<pb::LogLink> {
                self.log_link.take()
            }
        })*
        $(impl CarriesReturns for $linked {
            fn take_proofs(&mut self) -> Vec<pb::AppProof> {
                std::mem::take(&mut self.app_proofs)
            }
            fn take_evaluation(&mut self) -> Option<String> {
                None
            }
            fn take_log_link(&mut self) -> Option<pb::LogLink> {
                self.log_link.take()
            }
        })*
        $(impl CarriesReturns for $own {
            fn take_proofs(&mut self) -> Vec<pb::AppProof> {
                std::mem::take(&mut self.app_proofs)
            }
            fn take_evaluation(&mut self) -> Option<String> {
                Some(std::mem::take(&mut self.evaluation)).filter(|e| !e.is_empty())
            }
        })*
        $(impl CarriesReturns for $evaluated {
            fn take_proofs(&mut self) -> Vec<pb::AppProof> {
                Vec::new()
            }
            fn take_evaluation(&mut self) -> Option<String> {
                Some(std::mem::take(&mut self.evaluation)).filter(|e| !e.is_empty())
            }
        })*
        $(impl CarriesReturns for $without {
            fn take_proofs(&mut self) -> Vec<pb::AppProof> {
                Vec::new()
            }
            fn take_evaluation(&mut self) -> Option<String> {
                None
            }
        })*
    };
}

carries_returns!(
    decided: pb::CreateWalletResponse, pb::DeriveAccountsResponse, pb::CreatePrivateKeysResponse, pb::SignResponse,
        pb::SignTransactionResponse, pb::ExportResponse, pb::InitImportResponse, pb::KeyMaterial;
    linked: pb::ApplyActivityResponse;
    own call: pb::CreateSessionResponse, pb::InitOtpResponse, pb::VerifyOtpResponse;
    evaluated: pb::Oauth2AuthenticateResponse, pb::DecideActivityResponse;
    nothing: pb::IssueCertificatesResponse, pb::Oauth2Credential, pb::EnableAuthProxyResponse,
);

impl<'a> Admitted<'a> {
    /// The same calls, keeping what their answers carry beside themselves in `returned`.
    pub fn collecting(self, returned: &'a Returned) -> Self {
        Self { returned: Some(returned), ..self }
    }
}

/// A request the enclave authorizes from a stamped body: it has an `auth` field.
trait NeedsAuthorization {
    fn authorize(&mut self, auth: pb::Authorization);
}

/// The requests the enclave authorizes from a stamped body.
macro_rules! needs_authorization {
    ($($request:ty),* $(,)?) => {
        $(impl NeedsAuthorization for $request {
            fn authorize(&mut self, auth: pb::Authorization) {
                self.auth = Some(auth);
            }
        })*
    };
}

needs_authorization!(
    pb::IssueCertificatesRequest,
    pb::CreateWalletRequest,
    pb::DeriveAccountsRequest,
    pb::CreatePrivateKeysRequest,
    pb::SignRequest,
    pb::ExportWalletRequest,
    pb::ExportKeyRequest,
    pb::InitImportRequest,
    pb::ImportWalletRequest,
    pb::ImportPrivateKeyRequest,
    pb::CertifyOauth2CredentialRequest,
    pb::Oauth2AuthenticateRequest,
    pb::CreateSessionRequest,
    pb::EnableAuthProxyRequest,
    pb::ApplyActivityRequest,
    pb::InitOtpRequest,
    pb::VerifyOtpRequest,
    pb::DecideActivityRequest,
);

/// Each authorized call: its method on [`Admitted`] (the RPC's name), the request, the answer.
macro_rules! authorized_calls {
    ($($(#[$doc:meta])* $method:ident($request:ty) -> $answer:ty;)*) => {
        impl Admitted<'_> {
            $($(#[$doc])*
            pub async fn $method(&self, mut request: $request) -> Result<$answer, ApiError> {
                request.authorize(self.auth.clone());
                let mut answer = answer(self.client.clone().$method(request).await)?;
                if let Some(returned) = self.returned {
                    returned.keep(&mut answer)?;
                }
                Ok(answer)
            })*
        }
    };
}

authorized_calls! {
    /// Certifies the credentials an activity adds (API keys, passkeys, OAuth identities, a
    /// sub-organization's parent).
    issue_certificates(pb::IssueCertificatesRequest) -> pb::IssueCertificatesResponse;
    create_wallet(pb::CreateWalletRequest) -> pb::CreateWalletResponse;
    derive_accounts(pb::DeriveAccountsRequest) -> pb::DeriveAccountsResponse;
    create_private_keys(pb::CreatePrivateKeysRequest) -> pb::CreatePrivateKeysResponse;
    sign(pb::SignRequest) -> pb::SignResponse;
    sign_transaction(pb::SignRequest) -> pb::SignTransactionResponse;
    export_wallet(pb::ExportWalletRequest) -> pb::ExportResponse;
    export_key(pb::ExportKeyRequest) -> pb::ExportResponse;
    init_import(pb::InitImportRequest) -> pb::InitImportResponse;
    import_wallet(pb::ImportWalletRequest) -> pb::CreateWalletResponse;
    import_private_key(pb::ImportPrivateKeyRequest) -> pb::KeyMaterial;
    certify_oauth2_credential(pb::CertifyOauth2CredentialRequest) -> pb::Oauth2Credential;
    oauth2_authenticate(pb::Oauth2AuthenticateRequest) -> pb::Oauth2AuthenticateResponse;
    create_session(pb::CreateSessionRequest) -> pb::CreateSessionResponse;
    init_otp(pb::InitOtpRequest) -> pb::InitOtpResponse;
    verify_otp(pb::VerifyOtpRequest) -> pb::VerifyOtpResponse;
    enable_auth_proxy(pb::EnableAuthProxyRequest) -> pb::EnableAuthProxyResponse;
    /// Decides an activity that uses no key over the organization's authority state and applies
    /// the changes the gateway's records get.
    apply_activity(pb::ApplyActivityRequest) -> pb::ApplyActivityResponse;
    /// Decides the activity as its own call would, doing nothing (see `DecideActivity`).
    decide_activity(pb::DecideActivityRequest) -> pb::DecideActivityResponse;
}

/// A key use's result as the enclave made it (its answer's `result`): recorded as is, since the
/// enclave's log links the activity only with it.
pub fn made_by_enclave(result: &[u8]) -> Result<serde_json::Value, ApiError> {
    serde_json::from_slice(result).map_err(|_| ApiError::internal())
}

impl Custody {
    /// The enclaves behind `transport`.
    pub fn new(transport: Transport) -> Self {
        Self { client: EnclaveClient::new(transport).max_decoding_message_size(MAX_ANSWER_BYTES) }
    }

    /// Connects lazily to the enclaves at `endpoints` (see [`transport::connect_all`]).
    pub fn connect_all(endpoints: Vec<EnclaveEndpoint>) -> anyhow::Result<Self> {
        Ok(Self::new(transport::connect_all(endpoints)?))
    }

    /// The calls of the activity `auth` authorizes.
    pub fn authorized<'a>(&'a self, auth: &'a pb::Authorization) -> Admitted<'a> {
        Admitted { client: &self.client, auth, returned: None }
    }

    /// The policy dry run, decided by the enclave over its authority state.
    pub async fn dry_run_activity(
        &self,
        request: pb::DryRunActivityRequest,
    ) -> Result<pb::DryRunActivityResponse, ApiError> {
        answer(self.client.clone().dry_run_activity(request).await)
    }

    /// The enclave's boot proof.
    pub async fn boot_proof(&self) -> Result<pb::BootProof, ApiError> {
        answer(self.client.clone().get_boot_proof(pb::GetBootProofRequest {}).await)
    }

    /// Appends a finished activity to its organization's log: the signed link and its position.
    pub async fn record_activity(
        &self,
        request: pb::RecordActivityRequest,
    ) -> Result<pb::RecordActivityResponse, ApiError> {
        answer(self.client.clone().record_activity(request).await)
    }

    /// The organization's activity log head, signed now, for the verifier's `nonce` (empty: none).
    pub async fn log_head(&self, organization_id: &str, nonce: &str) -> Result<pb::GetLogHeadResponse, ApiError> {
        let request = pb::GetLogHeadRequest { organization_id: organization_id.to_string(), nonce: nonce.to_string() };
        answer(self.client.clone().get_log_head(request).await)
    }

    /// The activities the enclave allowed at or after `since_ms`, oldest first, at most `limit`.
    pub async fn list_allowed(&self, since_ms: i64, limit: u32) -> Result<pb::ListAllowedResponse, ApiError> {
        answer(self.client.clone().list_allowed(pb::ListAllowedRequest { since_ms, limit }).await)
    }

    /// The organization's state as the enclave holds it, signed now for the verifier's `nonce`.
    pub async fn organization_state(
        &self,
        organization_id: &str,
        nonce: &str,
    ) -> Result<pb::GetOrganizationStateResponse, ApiError> {
        let request =
            pb::GetOrganizationStateRequest { organization_id: organization_id.to_string(), nonce: nonce.to_string() };
        answer(self.client.clone().get_organization_state(request).await)
    }

    /// The bundle signer's public key (65-byte uncompressed SEC1).
    pub async fn signer_public_key(&self) -> Result<Vec<u8>, ApiError> {
        answer(self.client.clone().get_signer_public_key(pb::GetSignerPublicKeyRequest {}).await).map(|r| r.public_key)
    }

    /// The webhook signing key's public half and id.
    pub async fn webhook_signing_key(&self) -> Result<pb::GetWebhookSigningKeyResponse, ApiError> {
        answer(self.client.clone().get_webhook_signing_key(pb::GetWebhookSigningKeyRequest {}).await)
    }

    /// The public login keys (notarizer, OIDC issuer, TLS fetcher).
    pub async fn login_keys(&self) -> Result<pb::GetLoginKeysResponse, ApiError> {
        answer(self.client.clone().get_login_keys(pb::GetLoginKeysRequest {}).await)
    }

    /// Signs webhook deliveries (the enclave refuses, per delivery, what is not an event body).
    pub async fn sign_webhook_deliveries(
        &self,
        request: pb::SignWebhookDeliveriesRequest,
    ) -> Result<pb::SignWebhookDeliveriesResponse, ApiError> {
        answer(self.client.clone().sign_webhook_deliveries(request).await)
    }

    /// The auth proxy's stamp (an `X-Stamp` value) of a body the enclave checks itself.
    pub async fn stamp_auth_proxy_request(
        &self,
        request: pb::StampAuthProxyRequestRequest,
    ) -> Result<String, ApiError> {
        answer(self.client.clone().stamp_auth_proxy_request(request).await).map(|r| r.stamp)
    }

    /// Makes the next KEK current (an operator's stamped body names the current one).
    pub async fn rotate_kek(&self, request: pb::OperatorKekRequest) -> Result<pb::KekStatus, ApiError> {
        answer(self.client.clone().rotate_kek(request).await)
    }

    /// Destroys an old KEK (an operator's stamped body names it).
    pub async fn destroy_kek(&self, request: pb::OperatorKekRequest) -> Result<pb::KekStatus, ApiError> {
        answer(self.client.clone().destroy_kek(request).await)
    }

    /// What each KEK holds.
    pub async fn kek_status(&self) -> Result<pb::KekStatus, ApiError> {
        answer(self.client.clone().get_kek_status(pb::GetKekStatusRequest {}).await)
    }

    /// Stored blobs sealed again under the current KEK.
    pub async fn reseal_blobs(&self, blobs: Vec<pb::SealedRef>) -> Result<pb::ResealBlobsResponse, ApiError> {
        answer(self.client.clone().reseal_blobs(pb::ResealBlobsRequest { blobs }).await)
    }

    /// Operator bootstrap: a new organization with one root credential, ids chosen by the enclave.
    pub async fn bootstrap_organization(
        &self,
        request: pb::BootstrapOrganizationRequest,
    ) -> Result<pb::BootstrapOrganizationResponse, ApiError> {
        answer(self.client.clone().bootstrap_organization(request).await)
    }
}

/// An enclave's answer, or the [`ApiError`] its status means.
fn answer<T>(result: Result<tonic::Response<T>, tonic::Status>) -> Result<T, ApiError> {
    result.map(tonic::Response::into_inner).map_err(api_error)
}

/// The one mapping of enclave statuses to the gateway's errors.
fn api_error(s: tonic::Status) -> ApiError {
    let refusal = coffer_proto::refusal_reason(&s).filter(|r| *r != pb::RefusalReason::Unspecified);
    let error = match s.code() {
        tonic::Code::InvalidArgument => ApiError::invalid(s.message().to_string()),
        // A per-organization cap the enclave decides (webhook endpoints, policies): the request
        // asks for more than the organization may have, a 400 naming the limit.
        tonic::Code::PermissionDenied if refusal == Some(pb::RefusalReason::LimitExceeded) => {
            ApiError::invalid(s.message().to_string())
        }
        // The stamped body asks for a change its organization's state refuses (the enclave
        // computes it): bad input, a 400 with the enclave's words.
        tonic::Code::PermissionDenied if refusal == Some(pb::RefusalReason::TransitionRefused) => {
            ApiError::invalid(s.message().to_string())
        }
        // The organization's policies do not allow it: the words the API uses for every such
        // refusal (the enclave's reason is in its audit log and here).
        tonic::Code::PermissionDenied if refusal == Some(pb::RefusalReason::PolicyDenied) => {
            tracing::info!(error = %s.message(), "the enclave's decision denied a request");
            ApiError::forbidden(crate::evaluation_share::NOT_AUTHORIZED)
        }
        // The activity voted on was rejected (a vote the enclave keeps): nothing runs it.
        tonic::Code::PermissionDenied if refusal == Some(pb::RefusalReason::VoteRejected) => {
            ApiError::invalid(s.message().to_string())
        }
        tonic::Code::PermissionDenied if refusal == Some(pb::RefusalReason::RootQuorumOnly) => {
            ApiError::forbidden(crate::evaluation_share::ROOT_ONLY)
        }
        // The enclave's own authorization refused the request (see its audit log).
        tonic::Code::PermissionDenied => {
            tracing::warn!(error = %s.message(), reason = ?refusal, "enclave refused a request");
            ApiError::forbidden(s.message().to_string())
        }
        // A limit the enclave counts per contact or organization: 429, retry within the hour.
        tonic::Code::ResourceExhausted if refusal == Some(pb::RefusalReason::OtpRateLimited) => ApiError {
            retry_after: Some(60),
            ..ApiError::new(Code::ResourceExhausted, "RATE_LIMIT_EXCEEDED", s.message().to_string())
        },
        tonic::Code::ResourceExhausted => ApiError::unavailable(s.message().to_string()),
        // Something the enclave does not have (a boot proof on a token without a proof key).
        tonic::Code::NotFound => ApiError::not_found(s.message().to_string()),
        // An OAuth 2.0 provider failed the enclave's request: 502, naming the provider.
        tonic::Code::Aborted => ApiError {
            status: Some(axum::http::StatusCode::BAD_GATEWAY),
            ..ApiError::new(Code::Unavailable, "OAUTH2_PROVIDER_ERROR", s.message().to_string())
        },
        tonic::Code::FailedPrecondition => {
            tracing::error!(error = %s.message(), "enclave refused sealed material");
            ApiError::new(Code::Internal, "INTERNAL", "stored key material failed to open")
        }
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled | tonic::Code::DeadlineExceeded => {
            transport::note_unreachable();
            warn_enclave_unavailable(s.message());
            ApiError::unavailable("enclave unavailable: key operations are temporarily not possible, retry shortly")
        }
        _ => {
            tracing::error!(error = %s.message(), code = ?s.code(), "enclave error");
            ApiError::internal()
        }
    };
    ApiError { refusal, evaluation: coffer_proto::refusal_evaluation(&s), ..error }
}

/// Logs "enclave unavailable" at most once a second, with how many were left out: during an
/// outage every key request fails the same way, and one line per request floods the log.
fn warn_enclave_unavailable(message: &str) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST_SECOND: AtomicU64 = AtomicU64::new(0);
    static SUPPRESSED: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    if LAST_SECOND.swap(now, Ordering::Relaxed) == now {
        SUPPRESSED.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let suppressed = SUPPRESSED.swap(0, Ordering::Relaxed);
    tracing::warn!(error = %message, suppressed, "enclave unavailable");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(reason: pb::RefusalReason) -> tonic::Status {
        let details = coffer_proto::refusal_details(reason, "");
        tonic::Status::with_details(tonic::Code::PermissionDenied, "enclave refused: whatever it says", details.into())
    }

    #[test]
    fn a_refusal_keeps_its_typed_reason_whatever_its_wording() {
        let e = api_error(refused(pb::RefusalReason::Replayed));
        assert_eq!((e.code, e.refusal), (Code::PermissionDenied, Some(pb::RefusalReason::Replayed)));
        assert_eq!(e.message, "enclave refused: whatever it says");
        // The wording alone decides nothing.
        let e = api_error(tonic::Status::permission_denied("replayed request: this stamped body was already used"));
        assert_eq!(e.refusal, None);
        // Details that do not decode are no reason.
        let garbage = tonic::Status::with_details(tonic::Code::PermissionDenied, "x", vec![0xff, 0xff].into());
        assert_eq!(api_error(garbage).refusal, None);
        let busy = tonic::Status::with_details(
            tonic::Code::ResourceExhausted,
            "enclave busy",
            coffer_proto::refusal_details(pb::RefusalReason::ReplayWindowFull, "").into(),
        );
        let e = api_error(busy);
        assert_eq!((e.code, e.refusal), (Code::Unavailable, Some(pb::RefusalReason::ReplayWindowFull)));
        // A cap the enclave decides is the request's fault: 400, its reason kept.
        let e = api_error(refused(pb::RefusalReason::LimitExceeded));
        assert_eq!((e.code, e.refusal), (Code::InvalidArgument, Some(pb::RefusalReason::LimitExceeded)));
        let e = api_error(refused(pb::RefusalReason::TransitionRefused));
        assert_eq!((e.code, e.refusal), (Code::InvalidArgument, Some(pb::RefusalReason::TransitionRefused)));
    }

    #[test]
    fn statuses_map_to_the_documented_errors() {
        assert_eq!(api_error(tonic::Status::invalid_argument("bad curve")).code, Code::InvalidArgument);
        let e = api_error(tonic::Status::aborted("provider said no"));
        assert_eq!((e.turnkey_code, e.status), ("OAUTH2_PROVIDER_ERROR", Some(axum::http::StatusCode::BAD_GATEWAY)));
        let e = api_error(tonic::Status::failed_precondition("seal"));
        assert_eq!((e.code, e.message.as_str()), (Code::Internal, "stored key material failed to open"));
        let e = api_error(tonic::Status::not_found("no boot proof"));
        assert_eq!((e.code, e.message.as_str()), (Code::NotFound, "no boot proof"));
        let e = api_error(tonic::Status::unavailable("connection refused"));
        assert_eq!(e.code, Code::Unavailable);
        assert!(e.message.starts_with("enclave unavailable"), "{}", e.message);
    }
}
