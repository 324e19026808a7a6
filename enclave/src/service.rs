//! The enclave's gRPC service: every call opens what it needs through the HSM and drops it.

use std::sync::Arc;

use coffer_crypto::bundle::{self, EnvelopeSigner};
use coffer_crypto::{address, keys, sign, CryptoError, Curve};
use coffer_proto::v1 as pb;
use coffer_proto::v1::enclave_server::Enclave;
use tonic::{Request, Response, Status};
use zeroize::Zeroizing;

use crate::hsm::{BlobBinding, BlobKind, Hsm};
use crate::EnclaveError;

/// The gRPC service over one logged-in HSM.
#[derive(Clone)]
pub struct EnclaveService {
    hsm: Arc<Hsm>,
}

impl EnclaveService {
    pub fn new(hsm: Arc<Hsm>) -> Self {
        Self { hsm }
    }
}

/// Runs blocking HSM and crypto work off the async executor.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, EnclaveError> + Send + 'static,
) -> Result<Response<T>, Status> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => Ok(Response::new(v)),
        Ok(Err(e)) => {
            if matches!(e, EnclaveError::Hsm(_) | EnclaveError::Internal(_)) {
                tracing::error!(error = %e, "enclave call failed");
            }
            Err(e.into())
        }
        Err(_) => Err(Status::internal("enclave worker panicked")),
    }
}

/// The HSM bundle signer seen through the crypto crate's envelope interface.
struct HsmSigner<'a> {
    hsm: &'a Hsm,
    public: [u8; 65],
}

impl<'a> HsmSigner<'a> {
    fn new(hsm: &'a Hsm) -> Result<Self, EnclaveError> {
        Ok(Self { hsm, public: hsm.signer_public_key()? })
    }
}

impl EnvelopeSigner for HsmSigner<'_> {
    fn public_key(&self) -> [u8; 65] {
        self.public
    }
    fn sign(&self, data: &[u8]) -> Result<Vec<u8>, CryptoError> {
        self.hsm.sign_with_bundle_signer(data).map_err(|e| CryptoError::Internal(e.to_string()))
    }
}

fn kind_of(kind: i32) -> Result<BlobKind, EnclaveError> {
    match pb::BlobKind::try_from(kind) {
        Ok(pb::BlobKind::WalletSeed) => Ok(BlobKind::WalletSeed),
        Ok(pb::BlobKind::WalletAccountKey) => Ok(BlobKind::WalletAccountKey),
        Ok(pb::BlobKind::PrivateKey) => Ok(BlobKind::PrivateKey),
        Ok(pb::BlobKind::ImportTarget) => Ok(BlobKind::ImportTarget),
        _ => Err(EnclaveError::invalid("unknown sealed blob kind")),
    }
}

fn open_ref(
    hsm: &Hsm,
    sealed: Option<pb::SealedRef>,
    expect: &[BlobKind],
) -> Result<(Zeroizing<Vec<u8>>, pb::SealedRef), EnclaveError> {
    let sealed = sealed.ok_or_else(|| EnclaveError::invalid("missing sealed reference"))?;
    let kind = kind_of(sealed.kind)?;
    if !expect.contains(&kind) {
        return Err(EnclaveError::invalid("sealed blob of the wrong kind"));
    }
    let binding = BlobBinding { kind, organization_id: &sealed.organization_id, resource_id: &sealed.resource_id };
    let plain = hsm.unseal(&binding, &sealed.blob)?;
    Ok((plain, sealed))
}

fn secret32(bytes: &[u8]) -> Result<Zeroizing<[u8; 32]>, EnclaveError> {
    let mut out = Zeroizing::new([0u8; 32]);
    if bytes.len() != 32 {
        return Err(EnclaveError::Internal("sealed key is not 32 bytes".into()));
    }
    out.copy_from_slice(bytes);
    Ok(out)
}

/// Derives, addresses and seals each requested account from one BIP-39 seed.
fn derive_accounts(
    hsm: &Hsm,
    organization_id: &str,
    seed: &[u8],
    specs: &[pb::AccountSpec],
) -> Result<Vec<pb::Account>, EnclaveError> {
    specs
        .iter()
        .map(|spec| {
            let curve = Curve::parse(&spec.curve)?;
            let secret = keys::derive(seed, curve, &spec.path)?;
            let public_key = keys::public_key(curve, &secret)?;
            let address = address::address(&spec.address_format, curve, &public_key)?;
            let sealed_key = hsm.seal(
                &BlobBinding { kind: BlobKind::WalletAccountKey, organization_id, resource_id: &spec.account_id },
                secret.as_slice(),
            )?;
            Ok(pb::Account { account_id: spec.account_id.clone(), public_key, address, sealed_key })
        })
        .collect()
}

fn addresses_for(curve: Curve, public_key: &[u8], formats: &[String]) -> Result<Vec<pb::Address>, EnclaveError> {
    formats
        .iter()
        .map(|f| Ok(pb::Address { format: f.clone(), address: address::address(f, curve, public_key)? }))
        .collect()
}

/// A wallet from its mnemonic: the requested accounts, and the phrase sealed to the wallet.
fn seal_wallet(
    hsm: &Hsm,
    organization_id: &str,
    wallet_id: &str,
    phrase: &str,
    specs: &[pb::AccountSpec],
) -> Result<pb::CreateWalletResponse, EnclaveError> {
    let seed = keys::seed_from_phrase(phrase)?;
    let accounts = derive_accounts(hsm, organization_id, seed.as_slice(), specs)?;
    let binding = BlobBinding { kind: BlobKind::WalletSeed, organization_id, resource_id: wallet_id };
    let sealed_seed = hsm.seal(&binding, phrase.as_bytes())?;
    Ok(pb::CreateWalletResponse { sealed_seed, accounts })
}

/// Checks a mnemonic and returns the phrase to keep: normalized whitespace, as given.
fn checked_phrase(plain: &[u8]) -> Result<Zeroizing<String>, EnclaveError> {
    let text = std::str::from_utf8(plain).map_err(|_| EnclaveError::invalid("invalid mnemonic"))?;
    let phrase = Zeroizing::new(text.split_whitespace().collect::<Vec<_>>().join(" "));
    keys::entropy_from_phrase(&phrase)?;
    Ok(phrase)
}

#[tonic::async_trait]
impl Enclave for EnclaveService {
    async fn get_signer_public_key(
        &self,
        _req: Request<pb::GetSignerPublicKeyRequest>,
    ) -> Result<Response<pb::GetSignerPublicKeyResponse>, Status> {
        let hsm = self.hsm.clone();
        blocking(move || Ok(pb::GetSignerPublicKeyResponse { public_key: hsm.signer_public_key()?.to_vec() })).await
    }

    async fn create_wallet(
        &self,
        req: Request<pb::CreateWalletRequest>,
    ) -> Result<Response<pb::CreateWalletResponse>, Status> {
        let hsm = self.hsm.clone();
        let req = req.into_inner();
        blocking(move || {
            let words = if req.mnemonic_length == 0 { 12 } else { req.mnemonic_length };
            let entropy = hsm.random(keys::entropy_len_for_words(words)?)?;
            let phrase = keys::mnemonic_phrase(&entropy, "")?;
            seal_wallet(&hsm, &req.organization_id, &req.wallet_id, &phrase, &req.accounts)
        })
        .await
    }

    async fn derive_accounts(
        &self,
        req: Request<pb::DeriveAccountsRequest>,
    ) -> Result<Response<pb::DeriveAccountsResponse>, Status> {
        let hsm = self.hsm.clone();
        let req = req.into_inner();
        blocking(move || {
            let (phrase, sealed) = open_ref(&hsm, req.seed, &[BlobKind::WalletSeed])?;
            let phrase = checked_phrase(&phrase)?;
            let seed = keys::seed_from_phrase(&phrase)?;
            let accounts = derive_accounts(&hsm, &sealed.organization_id, seed.as_slice(), &req.accounts)?;
            Ok(pb::DeriveAccountsResponse { accounts })
        })
        .await
    }

    async fn create_private_key(
        &self,
        req: Request<pb::CreatePrivateKeyRequest>,
    ) -> Result<Response<pb::KeyMaterial>, Status> {
        let hsm = self.hsm.clone();
        let req = req.into_inner();
        blocking(move || {
            let curve = Curve::parse(&req.curve)?;
            // Rejection-sample until the bytes are a valid scalar (always valid for Ed25519).
            let (secret, public_key) = loop {
                let bytes = hsm.random(32)?;
                let secret = secret32(&bytes)?;
                if let Ok(pk) = keys::public_key(curve, &secret) {
                    break (secret, pk);
                }
            };
            let addresses = addresses_for(curve, &public_key, &req.address_formats)?;
            let sealed_key = hsm.seal(
                &BlobBinding {
                    kind: BlobKind::PrivateKey,
                    organization_id: &req.organization_id,
                    resource_id: &req.private_key_id,
                },
                secret.as_slice(),
            )?;
            Ok(pb::KeyMaterial { public_key, addresses, sealed_key })
        })
        .await
    }

    async fn sign(&self, req: Request<pb::SignRequest>) -> Result<Response<pb::SignResponse>, Status> {
        let hsm = self.hsm.clone();
        let req = req.into_inner();
        blocking(move || {
            let curve = Curve::parse(&req.curve)?;
            let (plain, _) = open_ref(&hsm, req.key, &[BlobKind::WalletAccountKey, BlobKind::PrivateKey])?;
            let secret = secret32(&plain)?;
            let signatures = req
                .payloads
                .iter()
                .map(|p| {
                    let sig = sign::sign_payload(curve, &secret, p, &req.encoding, &req.hash_function)?;
                    Ok(pb::Signature { r: sig.r, s: sig.s, v: sig.v })
                })
                .collect::<Result<Vec<_>, EnclaveError>>()?;
            Ok(pb::SignResponse { signatures })
        })
        .await
    }

    async fn export_wallet(
        &self,
        req: Request<pb::ExportWalletRequest>,
    ) -> Result<Response<pb::ExportResponse>, Status> {
        let hsm = self.hsm.clone();
        let req = req.into_inner();
        blocking(move || {
            let (plain, sealed) = open_ref(&hsm, req.seed, &[BlobKind::WalletSeed])?;
            let phrase = checked_phrase(&plain)?;
            let phrase = if req.language.is_empty() || req.language == "MNEMONIC_LANGUAGE_ENGLISH" {
                phrase
            } else {
                let entropy = keys::entropy_from_phrase(&phrase)?;
                keys::mnemonic_phrase(&entropy, &req.language)?
            };
            let signer = HsmSigner::new(&hsm)?;
            let seed = hsm.random_seed()?;
            let export_bundle = bundle::export_bundle(
                &signer,
                *seed,
                &req.target_public_key,
                &sealed.organization_id,
                phrase.as_bytes(),
            )?;
            Ok(pb::ExportResponse { export_bundle })
        })
        .await
    }

    async fn export_key(&self, req: Request<pb::ExportKeyRequest>) -> Result<Response<pb::ExportResponse>, Status> {
        let hsm = self.hsm.clone();
        let req = req.into_inner();
        blocking(move || {
            let (plain, sealed) = open_ref(&hsm, req.key, &[BlobKind::WalletAccountKey, BlobKind::PrivateKey])?;
            let secret = secret32(&plain)?;
            let signer = HsmSigner::new(&hsm)?;
            let seed = hsm.random_seed()?;
            let export_bundle = bundle::export_bundle(
                &signer,
                *seed,
                &req.target_public_key,
                &sealed.organization_id,
                secret.as_slice(),
            )?;
            Ok(pb::ExportResponse { export_bundle })
        })
        .await
    }

    async fn init_import(
        &self,
        req: Request<pb::InitImportRequest>,
    ) -> Result<Response<pb::InitImportResponse>, Status> {
        let hsm = self.hsm.clone();
        let req = req.into_inner();
        blocking(move || {
            let seed = hsm.random_seed()?;
            let target = bundle::new_import_target(*seed)?;
            let sealed_target_key = hsm.seal(
                &BlobBinding {
                    kind: BlobKind::ImportTarget,
                    organization_id: &req.organization_id,
                    resource_id: &req.user_id,
                },
                target.secret.as_slice(),
            )?;
            let signer = HsmSigner::new(&hsm)?;
            let import_bundle = bundle::import_bundle(&signer, &target.public, &req.organization_id, &req.user_id)?;
            Ok(pb::InitImportResponse { import_bundle, sealed_target_key })
        })
        .await
    }

    async fn import_wallet(
        &self,
        req: Request<pb::ImportWalletRequest>,
    ) -> Result<Response<pb::CreateWalletResponse>, Status> {
        let hsm = self.hsm.clone();
        let req = req.into_inner();
        blocking(move || {
            let (target, sealed) = open_ref(&hsm, req.target, &[BlobKind::ImportTarget])?;
            let target = secret32(&target)?;
            let plain = bundle::open_encrypted_bundle(&target, &req.encrypted_bundle)?;
            let phrase = checked_phrase(&plain)?;
            seal_wallet(&hsm, &sealed.organization_id, &req.wallet_id, &phrase, &req.accounts)
        })
        .await
    }

    async fn import_private_key(
        &self,
        req: Request<pb::ImportPrivateKeyRequest>,
    ) -> Result<Response<pb::KeyMaterial>, Status> {
        let hsm = self.hsm.clone();
        let req = req.into_inner();
        blocking(move || {
            let curve = Curve::parse(&req.curve)?;
            let (target, sealed) = open_ref(&hsm, req.target, &[BlobKind::ImportTarget])?;
            let target = secret32(&target)?;
            let plain = bundle::open_encrypted_bundle(&target, &req.encrypted_bundle)?;
            if plain.len() != 32 {
                return Err(EnclaveError::invalid("imported private key must be 32 bytes"));
            }
            let secret = secret32(&plain)?;
            let public_key = keys::public_key(curve, &secret)?;
            let addresses = addresses_for(curve, &public_key, &req.address_formats)?;
            let sealed_key = hsm.seal(
                &BlobBinding {
                    kind: BlobKind::PrivateKey,
                    organization_id: &sealed.organization_id,
                    resource_id: &req.private_key_id,
                },
                secret.as_slice(),
            )?;
            Ok(pb::KeyMaterial { public_key, addresses, sealed_key })
        })
        .await
    }
}
