//! The enclave's gRPC service: every key-using call is authorized by the stamped request it
//! carries, takes its parameters from that body, opens what it needs through the HSM and drops it.
//! This module is the tonic surface only; each family of calls lives in its own module.

mod bootstrap;
mod changes;
mod decisions;
mod invitations;
mod kek_admin;
mod key_facts;
mod keys;
mod login;
mod otp;
mod sealed_refs;
mod signing;
mod transfer;
mod webhooks;
mod worker;

use std::sync::Arc;

use coffer_proto::v1 as pb;
use coffer_proto::v1::enclave_server::Enclave;
use tonic::{Request, Response, Status};

use self::worker::blocking;
use crate::admission::Admission;
use crate::config::LoginSettings;
use crate::error::EnclaveError;
use crate::hsm::Hsm;
use crate::operator::Operators;

/// The gRPC service over one logged-in HSM.
#[derive(Clone)]
pub struct EnclaveService {
    hsm: Arc<Hsm>,
    admission: Arc<Admission>,
    login: Arc<LoginSettings>,
    otp: Arc<otp::OtpService>,
    operators: Arc<Operators>,
    /// What the boot proof states of this process (`with_boot_proof`), and the proof, signed on
    /// first request (hashing the binary is not start-up work).
    boot_facts: Option<Arc<crate::proofs::BootFacts>>,
    boot: Arc<std::sync::OnceLock<pb::BootProof>>,
}

/// Destroys the HSM-native keys counted more than `grace_ms` ago whose private key no
/// organization's authority state holds: those of a call that failed after making them, or of a
/// deletion whose destruction failed. Each is an object of the module nothing can use; answers
/// how many went.
pub fn remove_unheld_native_keys(hsm: &Hsm, admission: &Admission, grace_ms: i64) -> Result<usize, EnclaveError> {
    let mut removed = 0;
    for (private_key_id, organization_id) in hsm.native_keys_made_before(crate::admission::now_ms() - grace_ms)? {
        let loaded = admission.rules().load(&organization_id)?;
        if !loaded.is_some_and(|l| l.state.private_keys.contains_key(&private_key_id)) {
            // One that fails is logged and tried again at the next sweep; the rest go on.
            match hsm.destroy_native_key(&crate::hsm::native_label(&private_key_id)) {
                Ok(_) => removed += 1,
                Err(e) => {
                    tracing::warn!(error = %e, key = private_key_id.as_str(), "an HSM-native key nothing holds was not destroyed")
                }
            }
        }
    }
    Ok(removed)
}

/// A call whose whole work is blocking: HSM, authority and the request in, the answer out.
type BlockingCall<Q, T> = fn(&Hsm, &Admission, Q) -> Result<T, EnclaveError>;

impl EnclaveService {
    /// The service with no operator key (no organization can be bootstrapped): see
    /// [`EnclaveService::with_operators`].
    pub fn new(hsm: Arc<Hsm>, admission: Arc<Admission>, login: Arc<LoginSettings>) -> Self {
        let otp = Arc::new(otp::OtpService {
            settings: crate::config::OtpSettings::default(),
            mailer: crate::mail::Mailer::None,
            sms: crate::sms::SmsSender::None,
        });
        Self { hsm, admission, login, otp, operators: Arc::default(), boot_facts: None, boot: Arc::default() }
    }

    /// One-time codes under `settings`, sent through `mailer` and `sms`.
    pub fn with_otp(
        self,
        settings: crate::config::OtpSettings,
        mailer: crate::mail::Mailer,
        sms: crate::sms::SmsSender,
    ) -> Self {
        Self { otp: Arc::new(otp::OtpService { settings, mailer, sms }), ..self }
    }

    /// The boot proof states `facts` of this process; it is signed when first asked for. A
    /// token without a proof key (initialised before proofs existed) serves none until `init`
    /// runs again.
    pub fn with_boot_proof(self, facts: crate::proofs::BootFacts) -> Self {
        Self { boot_facts: Some(Arc::new(facts)), ..self }
    }

    /// The operator keys whose stamps `BootstrapOrganization` accepts.
    pub fn with_operators(self, operators: Operators) -> Self {
        Self { operators: Arc::new(operators), ..self }
    }

    /// Runs `call` on the request off the async executor.
    async fn run<Q: Send + 'static, T: Send + 'static>(
        &self,
        req: Request<Q>,
        call: BlockingCall<Q, T>,
    ) -> Result<Response<T>, Status> {
        let (hsm, admission) = (self.hsm.clone(), self.admission.clone());
        let req = req.into_inner();
        blocking(move || call(&hsm, &admission, req)).await
    }
}

type Answer<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl Enclave for EnclaveService {
    async fn bootstrap_organization(
        &self,
        req: Request<pb::BootstrapOrganizationRequest>,
    ) -> Answer<pb::BootstrapOrganizationResponse> {
        let (hsm, admission, operators) = (self.hsm.clone(), self.admission.clone(), self.operators.clone());
        let req = req.into_inner();
        blocking(move || bootstrap::bootstrap_organization(&hsm, &admission, &operators, req)).await
    }

    async fn rotate_kek(&self, req: Request<pb::OperatorKekRequest>) -> Answer<pb::KekStatus> {
        let (hsm, admission, operators) = (self.hsm.clone(), self.admission.clone(), self.operators.clone());
        let req = req.into_inner();
        blocking(move || kek_admin::rotate(&hsm, &admission, &operators, req)).await
    }

    async fn destroy_kek(&self, req: Request<pb::OperatorKekRequest>) -> Answer<pb::KekStatus> {
        let (hsm, admission, operators) = (self.hsm.clone(), self.admission.clone(), self.operators.clone());
        let req = req.into_inner();
        blocking(move || kek_admin::destroy(&hsm, &admission, &operators, req)).await
    }

    async fn get_kek_status(&self, req: Request<pb::GetKekStatusRequest>) -> Answer<pb::KekStatus> {
        self.run(req, |hsm, _, _| kek_admin::status(hsm)).await
    }

    async fn reseal_blobs(&self, req: Request<pb::ResealBlobsRequest>) -> Answer<pb::ResealBlobsResponse> {
        self.run(req, kek_admin::reseal_blobs).await
    }

    async fn issue_certificates(
        &self,
        req: Request<pb::IssueCertificatesRequest>,
    ) -> Answer<pb::IssueCertificatesResponse> {
        self.run(req, bootstrap::issue_certificates).await
    }

    async fn create_wallet(&self, req: Request<pb::CreateWalletRequest>) -> Answer<pb::CreateWalletResponse> {
        self.run(req, keys::create_wallet).await
    }

    async fn derive_accounts(&self, req: Request<pb::DeriveAccountsRequest>) -> Answer<pb::DeriveAccountsResponse> {
        self.run(req, keys::derive_accounts).await
    }

    async fn create_private_keys(
        &self,
        req: Request<pb::CreatePrivateKeysRequest>,
    ) -> Answer<pb::CreatePrivateKeysResponse> {
        self.run(req, keys::create_private_keys).await
    }

    async fn sign(&self, req: Request<pb::SignRequest>) -> Answer<pb::SignResponse> {
        self.run(req, signing::sign).await
    }

    async fn sign_transaction(&self, req: Request<pb::SignRequest>) -> Answer<pb::SignTransactionResponse> {
        self.run(req, signing::sign_transaction).await
    }

    async fn get_signer_public_key(
        &self,
        req: Request<pb::GetSignerPublicKeyRequest>,
    ) -> Answer<pb::GetSignerPublicKeyResponse> {
        self.run(req, |hsm, _, _| transfer::signer_public_key(hsm)).await
    }

    async fn export_wallet(&self, req: Request<pb::ExportWalletRequest>) -> Answer<pb::ExportResponse> {
        self.run(req, transfer::export_wallet).await
    }

    async fn export_key(&self, req: Request<pb::ExportKeyRequest>) -> Answer<pb::ExportResponse> {
        self.run(req, transfer::export_key).await
    }

    async fn init_import(&self, req: Request<pb::InitImportRequest>) -> Answer<pb::InitImportResponse> {
        self.run(req, transfer::init_import).await
    }

    async fn import_wallet(&self, req: Request<pb::ImportWalletRequest>) -> Answer<pb::CreateWalletResponse> {
        self.run(req, transfer::import_wallet).await
    }

    async fn import_private_key(&self, req: Request<pb::ImportPrivateKeyRequest>) -> Answer<pb::KeyMaterial> {
        self.run(req, transfer::import_private_key).await
    }

    async fn get_webhook_signing_key(
        &self,
        req: Request<pb::GetWebhookSigningKeyRequest>,
    ) -> Answer<pb::GetWebhookSigningKeyResponse> {
        self.run(req, |hsm, _, _| webhooks::signing_key(hsm)).await
    }

    async fn sign_webhook_deliveries(
        &self,
        req: Request<pb::SignWebhookDeliveriesRequest>,
    ) -> Answer<pb::SignWebhookDeliveriesResponse> {
        self.run(req, webhooks::sign_deliveries).await
    }

    async fn get_login_keys(&self, _req: Request<pb::GetLoginKeysRequest>) -> Answer<pb::GetLoginKeysResponse> {
        let (hsm, settings) = (self.hsm.clone(), self.login.clone());
        blocking(move || login::login_keys(&hsm, &settings)).await
    }

    async fn certify_oauth2_credential(
        &self,
        req: Request<pb::CertifyOauth2CredentialRequest>,
    ) -> Answer<pb::Oauth2Credential> {
        self.run(req, login::certify_oauth2_credential).await
    }

    async fn oauth2_authenticate(
        &self,
        req: Request<pb::Oauth2AuthenticateRequest>,
    ) -> Answer<pb::Oauth2AuthenticateResponse> {
        login::oauth2_authenticate(self.hsm.clone(), self.admission.clone(), self.login.clone(), req.into_inner()).await
    }

    async fn create_session(&self, req: Request<pb::CreateSessionRequest>) -> Answer<pb::CreateSessionResponse> {
        let (hsm, admission, login, otp) =
            (self.hsm.clone(), self.admission.clone(), self.login.clone(), self.otp.clone());
        login::create_session(hsm, admission, login, otp, req.into_inner()).await
    }

    async fn enable_auth_proxy(&self, req: Request<pb::EnableAuthProxyRequest>) -> Answer<pb::EnableAuthProxyResponse> {
        self.run(req, login::enable_auth_proxy).await
    }

    async fn apply_activity(&self, req: Request<pb::ApplyActivityRequest>) -> Answer<pb::ApplyActivityResponse> {
        let (hsm, admission, otp) = (self.hsm.clone(), self.admission.clone(), self.otp.clone());
        let req = req.into_inner();
        let o = otp.clone();
        let (mut response, mails) = blocking(move || {
            let mut mails = Vec::new();
            changes::apply_activity(&hsm, &admission, &o, req, &mut mails).map(|r| (r, mails))
        })
        .await?
        .into_inner();
        // Committed: a message that fails is recorded so (and logged), not the activity's failure.
        for (message, organization_id) in mails {
            let event = crate::mail::event_of(&message, &organization_id, crate::mail::SENT);
            let sent = otp.mailer.send(message).await;
            let event_type = if sent.is_ok() { crate::mail::SENT } else { crate::mail::SEND_FAILED };
            response.email_events.push(pb::EmailEvent { event_type: event_type.into(), ..event });
        }
        Ok(Response::new(response))
    }

    async fn get_boot_proof(&self, _req: Request<pb::GetBootProofRequest>) -> Answer<pb::BootProof> {
        if let Some(b) = self.boot.get() {
            return Ok(Response::new(b.clone()));
        }
        let missing = || {
            Status::not_found("this enclave has no boot proof: its token has no proof key (run `coffer-enclave init`)")
        };
        let facts = self.boot_facts.clone().ok_or_else(missing)?;
        let (hsm, boot) = (self.hsm.clone(), self.boot.clone());
        let signed = blocking(move || crate::proofs::boot_proof(&hsm, &facts)).await;
        match signed {
            Ok(proof) => Ok(Response::new(boot.get_or_init(|| proof.into_inner()).clone())),
            Err(e) => {
                tracing::warn!(error = %e, "no boot proof (run `coffer-enclave init` to add the proof key)");
                Err(missing())
            }
        }
    }

    async fn record_activity(&self, req: Request<pb::RecordActivityRequest>) -> Answer<pb::RecordActivityResponse> {
        self.run(req, crate::proofs::record_activity).await
    }

    async fn get_log_head(&self, req: Request<pb::GetLogHeadRequest>) -> Answer<pb::GetLogHeadResponse> {
        self.run(req, |hsm, admission, req| crate::proofs::log_head(hsm, admission, &req.organization_id, &req.nonce))
            .await
    }

    async fn get_organization_state(
        &self,
        req: Request<pb::GetOrganizationStateRequest>,
    ) -> Answer<pb::GetOrganizationStateResponse> {
        self.run(req, |hsm, admission, req| {
            crate::proofs::organization_state(hsm, admission, &req.organization_id, &req.nonce)
        })
        .await
    }

    async fn list_allowed(&self, req: Request<pb::ListAllowedRequest>) -> Answer<pb::ListAllowedResponse> {
        self.run(req, |_hsm, admission, req| decisions::list_allowed(admission, &req)).await
    }

    async fn init_otp(&self, req: Request<pb::InitOtpRequest>) -> Answer<pb::InitOtpResponse> {
        otp::init_otp(self.hsm.clone(), self.admission.clone(), self.otp.clone(), req.into_inner()).await
    }

    async fn verify_otp(&self, req: Request<pb::VerifyOtpRequest>) -> Answer<pb::VerifyOtpResponse> {
        let (hsm, admission, otp) = (self.hsm.clone(), self.admission.clone(), self.otp.clone());
        let req = req.into_inner();
        blocking(move || otp::verify_otp(&hsm, &admission, &otp, req)).await
    }

    async fn decide_activity(&self, req: Request<pb::DecideActivityRequest>) -> Answer<pb::DecideActivityResponse> {
        self.run(req, decisions::decide_activity).await
    }

    async fn dry_run_activity(&self, req: Request<pb::DryRunActivityRequest>) -> Answer<pb::DryRunActivityResponse> {
        self.run(req, decisions::dry_run_activity).await
    }

    async fn stamp_auth_proxy_request(
        &self,
        req: Request<pb::StampAuthProxyRequestRequest>,
    ) -> Answer<pb::StampAuthProxyRequestResponse> {
        self.run(req, login::stamp_auth_proxy_request).await
    }
}
