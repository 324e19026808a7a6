//! Organizations and their credentials: operator bootstrap of a new organization, and the
//! certificates of the credentials a stamped body adds.

use coffer_auth::grants::{self, granted_credentials};
use coffer_org_rules::model::{CredentialKind, Organization, User};
use coffer_org_rules::{Change, Credential, Effect};
use coffer_proto::v1 as pb;

use crate::admission::{refuse, Admission, BOOTSTRAP};
use crate::error::{EnclaveError, RefusalReason};
use crate::hsm::Hsm;
use crate::operator::{Operators, BOOTSTRAP_ORGANIZATION};

/// A new organization with one certified P-256 API key, for a body an operator key of the
/// enclave's configuration stamped (ids from the HSM): the key certified is the body's.
pub(super) fn bootstrap_organization(
    hsm: &Hsm,
    admission: &Admission,
    operators: &Operators,
    req: pb::BootstrapOrganizationRequest,
) -> Result<pb::BootstrapOrganizationResponse, EnclaveError> {
    let boot = operators.authorize_bootstrap(admission, req.operator.as_ref())?;
    let p = &boot.body.parameters;
    let (public_key, credential_type) = grants::api_public_key("API_KEY_CURVE_P256", &p.root_api_public_key)?;
    // The request's own fields, if the gateway sets them, must say the same as the stamped body.
    let named = |field: &str, value: &str| field.is_empty() || field.eq_ignore_ascii_case(value);
    if !named(&req.credential_type, credential_type) || !named(&req.public_key, &public_key) {
        return Err(EnclaveError::refused(
            RefusalReason::BindingMismatch,
            "the request's key is not the one the operator's body names",
        ));
    }
    // Fresh ids from the HSM: a bootstrap can only ever create a new organization, never
    // certify a key into an existing one.
    let uuid = |bytes: &[u8]| {
        let mut b = [0u8; 16];
        b.copy_from_slice(&bytes[..16]);
        uuid::Builder::from_random_bytes(b).into_uuid().to_string()
    };
    let random = hsm.random(48)?;
    let (organization_id, user_id, api_key_id) = (uuid(&random[..16]), uuid(&random[16..32]), uuid(&random[32..]));
    // The organization's first authority state: its root user alone, with this key.
    let org = |effect| Change { organization_id: organization_id.clone(), effect };
    admission.rules().commit(&[
        org(Effect::CreateOrganization {
            organization: Organization {
                id: organization_id.clone(),
                name: p.organization_name.clone(),
                root_quorum_threshold: 1,
                root_user_ids: vec![user_id.clone()],
                ..Default::default()
            },
        }),
        org(Effect::PutUser {
            user: User { id: user_id.clone(), name: p.root_user_name.clone(), ..Default::default() },
        }),
        org(Effect::AddCredential {
            credential: Credential {
                id: api_key_id.clone(),
                user_id: user_id.clone(),
                kind: CredentialKind::ApiKey,
                credential_type: credential_type.to_string(),
                public_key: public_key.clone(),
                expires_at_ms: 0,
            },
        }),
    ])?;
    tracing::info!(
        target: "coffer_audit",
        decision = "allow",
        operation = BOOTSTRAP_ORGANIZATION,
        organization = %organization_id,
        organization_name = %p.organization_name,
        user = %user_id,
        user_name = %p.root_user_name,
        credential = %public_key,
        operator = %boot.operator,
        fingerprint = %boot.body.fingerprint,
        "enclave decision"
    );
    crate::audit::record(crate::audit::Decision {
        operation: BOOTSTRAP_ORGANIZATION,
        organization: organization_id.clone(),
        credential: public_key.clone(),
        fingerprint: boot.body.fingerprint.clone(),
    });
    let certificate = admission.certify(pb::CredentialCertificate {
        organization_id: organization_id.clone(),
        user_id: user_id.clone(),
        credential_type: credential_type.to_string(),
        public_key,
        expires_at_ms: 0,
        issuing_fingerprint: format!("{BOOTSTRAP}{organization_id}"),
        mac: vec![],
        session_scope: String::new(),
    })?;
    Ok(pb::BootstrapOrganizationResponse { organization_id, user_id, certificate, api_key_id })
}

/// Certificates for exactly the credentials the stamped body adds.
pub(super) fn issue_certificates(
    hsm: &Hsm,
    admission: &Admission,
    req: pb::IssueCertificatesRequest,
) -> Result<pb::IssueCertificatesResponse, EnclaveError> {
    // An invitation's acceptance, stamped by the key it brings (its code checked here too).
    let attested = super::invitations::acceptance_identity(hsm, admission, req.auth.as_ref())?;
    let a = admission.authorize_for(
        "issue_certificates",
        req.auth.as_ref(),
        grants::GRANTING_TYPES,
        None,
        attested.as_ref(),
    )?;
    let granted = granted_credentials(&a.activity)?;
    let certificates = req
        .credentials
        .iter()
        .map(|c| {
            let grant = granted
                .iter()
                .find(|g| {
                    g.organization_id == c.organization_id
                        && g.user_id == c.user_id
                        && g.credential_type == c.credential_type
                        && g.public_key == c.public_key
                })
                .ok_or_else(|| {
                    refuse(
                        &a,
                        RefusalReason::BindingMismatch,
                        "a credential to certify is not one the stamped body adds",
                    )
                })?;
            admission.certify(pb::CredentialCertificate {
                organization_id: grant.organization_id.clone(),
                user_id: grant.user_id.clone(),
                credential_type: grant.credential_type.clone(),
                public_key: grant.public_key.clone(),
                expires_at_ms: admission.expiry(grant.expiration_seconds),
                issuing_fingerprint: a.activity.fingerprint.clone(),
                mac: vec![],
                session_scope: String::new(),
            })
        })
        .collect::<Result<Vec<_>, EnclaveError>>()?;
    Ok(pb::IssueCertificatesResponse { certificates })
}
