//! Sealing, service keys, sessions and profiles against real PKCS#11 modules: SoftHSM 2, and
//! kryoptic (`deploy/build-kryoptic.sh`, found through `COFFER_KRYOPTIC_MODULE`) where it is
//! built. Every test runs on each module; `COFFER_REQUIRE_KRYOPTIC=1` (`make test`) makes a
//! missing kryoptic a failure instead of a skip. A module is loaded once per test process.

use std::sync::{Arc, Mutex, OnceLock};

use cryptoki::object::{Attribute, AttributeType, ObjectClass};
use cryptoki::types::AuthPin;

use super::error::HsmError;
use super::key_labels::*;
use super::native_keys::native_label;
use super::profile::{IvSource, KeyHome, ModuleProfile};
use super::seal::{self, is_legacy, BlobBinding, BlobKind, LEGACY_VERSION, V2};
use super::token::*;

const SOFTHSM: &str = "/usr/lib/softhsm/libsofthsm2.so";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Module {
    SoftHsm,
    Kryoptic,
}

/// A module's test directory (its token store and the authority store of sealed service keys),
/// prepared once per process before the module is loaded.
struct Prepared {
    path: std::path::PathBuf,
    dir: std::path::PathBuf,
}

fn prepared(module: Module) -> Option<&'static Prepared> {
    static SOFT: OnceLock<Prepared> = OnceLock::new();
    static KRY: OnceLock<Option<Prepared>> = OnceLock::new();
    let dir = |name: &str| {
        let dir = std::env::temp_dir().join(format!("coffer-hsm-test-{name}-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("tokens")).unwrap();
        dir
    };
    match module {
        Module::SoftHsm => Some(SOFT.get_or_init(|| {
            let dir = dir("softhsm");
            let conf = dir.join("softhsm2.conf");
            std::fs::write(
                &conf,
                format!(
                    "directories.tokendir = {}\nobjectstore.backend = file\nlog.level = ERROR\n",
                    dir.join("tokens").display()
                ),
            )
            .unwrap();
            // Set before the module is loaded (C_Initialize reads it).
            std::env::set_var("SOFTHSM2_CONF", &conf);
            Prepared { path: SOFTHSM.into(), dir }
        })),
        Module::Kryoptic => KRY
            .get_or_init(|| {
                let Some(path) = std::env::var_os("COFFER_KRYOPTIC_MODULE").filter(|p| !p.is_empty()) else {
                    assert!(
                        std::env::var_os("COFFER_REQUIRE_KRYOPTIC").is_none(),
                        "COFFER_REQUIRE_KRYOPTIC is set but COFFER_KRYOPTIC_MODULE is not (deploy/build-kryoptic.sh)"
                    );
                    eprintln!(
                        "kryoptic not built (COFFER_KRYOPTIC_MODULE unset): its half of the HSM tests is skipped"
                    );
                    return None;
                };
                let dir = dir("kryoptic");
                let conf = dir.join("token.conf");
                // One slot per token the tests make (kryoptic has only the slots it is given).
                let slots: String = (0..8)
                    .map(|n| {
                        let db = dir.join(format!("tokens/token{n}.sql"));
                        format!("[[slots]]\nslot = {n}\ndbtype = \"sqlite\"\ndbargs = \"{}\"\n", db.display())
                    })
                    .collect();
                std::fs::write(&conf, slots).unwrap();
                std::env::set_var("KRYOPTIC_CONF", &conf);
                Some(Prepared { path: path.into(), dir })
            })
            .as_ref(),
    }
}

fn pin() -> AuthPin {
    AuthPin::new("unit-test-pin".to_string().into())
}

/// Opens `label` on `module` (initialising the token if needed) under `profile` (`None`:
/// detected), with an SQLite authority store of its own as the shelf for sealed service keys.
pub(crate) fn open(module: Module, label: &str, profile: Option<ModuleProfile>, pool_size: usize) -> Option<Hsm> {
    try_open(module, label, profile, pool_size, pin()).map(Result::unwrap)
}

fn try_open(
    module: Module,
    label: &str,
    profile: Option<ModuleProfile>,
    pool_size: usize,
    user_pin: AuthPin,
) -> Option<Result<Hsm, HsmError>> {
    try_open_as(module, label, profile, pool_size, user_pin, label, 0, true)
}

/// [`try_open`] with the authority store `store` (a file of the module's test directory), which
/// has `seals_before` seals reserved under the KEK before the token is opened, as `serve` opens a
/// token (`creates_keys` false) or as `init` does.
#[allow(clippy::too_many_arguments)]
fn try_open_as(
    module: Module,
    label: &str,
    profile: Option<ModuleProfile>,
    pool_size: usize,
    user_pin: AuthPin,
    store: &str,
    seals_before: u64,
    creates_keys: bool,
) -> Option<Result<Hsm, HsmError>> {
    // Token creation and profile checks from parallel tests go one at a time.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let prepared = prepared(module)?;
    let so_pin = AuthPin::new("unit-so-pin".to_string().into());
    init_token(&prepared.path, label, &so_pin, &pin()).unwrap();
    let store_url = format!("sqlite://{}", prepared.dir.join(format!("{store}.authority.sqlite")).display());
    let store = crate::store::open(&crate::store::StoreSettings { url: store_url, ..Default::default() }).unwrap();
    if seals_before > 0 {
        store.reserve_seals(KEK_LABEL, seals_before).unwrap();
    }
    Some(Hsm::open(HsmSettings {
        module: prepared.path.clone(),
        token_label: label.into(),
        pin: user_pin,
        pool_size,
        profile,
        shelf: Some(Arc::new(crate::service_key_shelf::ServiceKeyShelf(store))),
        creates_keys,
        native_keys: NativeKeyBounds { total: 8, per_organization: 6 },
    }))
}

/// The shared token of `module`, its service keys made once (detected profile).
pub(crate) fn hsm_on(module: Module) -> Option<Arc<Hsm>> {
    static SOFT: OnceLock<Arc<Hsm>> = OnceLock::new();
    static KRY: OnceLock<Option<Arc<Hsm>>> = OnceLock::new();
    let make = || {
        let hsm = open(module, "unit", None, 4)?;
        assert_eq!(
            hsm.init_service_keys().unwrap(),
            vec![
                KEK_LABEL,
                SIGNER_LABEL,
                CERT_MAC_LABEL,
                WEBHOOK_SIGNER_LABEL,
                NOTARIZER_LABEL,
                OIDC_ISSUER_LABEL,
                PROOF_LABEL,
                TLS_FETCHER_LABEL
            ]
        );
        assert!(hsm.init_service_keys().unwrap().is_empty(), "second init must create nothing");
        Some(Arc::new(hsm))
    };
    match module {
        Module::SoftHsm => Some(SOFT.get_or_init(|| make().expect("SoftHSM")).clone()),
        Module::Kryoptic => KRY.get_or_init(make).clone(),
    }
}

/// The SoftHSM token other modules' unit tests use.
pub(crate) fn hsm() -> Arc<Hsm> {
    hsm_on(Module::SoftHsm).expect("SoftHSM")
}

/// Runs each named test (`fn(&Arc<Hsm>, Module)`) on SoftHSM and on kryoptic.
macro_rules! on_both_modules {
    ($($name:ident),* $(,)?) => {
        mod softhsm {
            $(#[test]
            fn $name() {
                super::$name(&super::hsm_on(super::Module::SoftHsm).unwrap(), super::Module::SoftHsm);
            })*
        }
        mod kryoptic {
            $(#[test]
            fn $name() {
                if let Some(hsm) = super::hsm_on(super::Module::Kryoptic) {
                    super::$name(&hsm, super::Module::Kryoptic);
                }
            })*
        }
    };
}

fn binding<'a>(kind: BlobKind, org: &'a str, resource: &'a str) -> BlobBinding<'a> {
    BlobBinding::plain(kind, org, resource)
}

fn account_blob_under_another_curve_or_address_fails_to_open(hsm: &Arc<Hsm>, _module: Module) {
    let right =
        BlobBinding { curve: "CURVE_SECP256K1", address: "0xabc", ..binding(BlobKind::WalletAccountKey, "o", "a") };
    let blob = hsm.seal(&right, &[5u8; 32]).unwrap();
    assert_eq!(hsm.unseal(&right, &blob).unwrap().as_slice(), &[5u8; 32]);
    for wrong in [
        BlobBinding { curve: "CURVE_ED25519", ..right },
        BlobBinding { address: "0xabd", ..right },
        BlobBinding { address: "", public_key: "0xabc", ..right },
    ] {
        assert!(matches!(hsm.unseal(&wrong, &blob), Err(HsmError::SealAuthentication)), "{wrong:?}");
    }
}

fn legacy_blobs_open_under_their_version_1_binding(hsm: &Arc<Hsm>, _module: Module) {
    let legacy = binding(BlobKind::PrivateKey, "o", "k");
    let blob = hsm.seal_as_version(&legacy, &[6u8; 32], LEGACY_VERSION).unwrap();
    assert!(is_legacy(&blob));
    // Version 1 binds kind, organization and resource only: curve and public key are not in it.
    let claimed = BlobBinding { curve: "CURVE_P256", public_key: "02ab", ..legacy };
    assert_eq!(hsm.unseal(&claimed, &blob).unwrap().as_slice(), &[6u8; 32]);
    assert!(matches!(hsm.unseal(&binding(BlobKind::PrivateKey, "o", "k2"), &blob), Err(HsmError::SealAuthentication)));
}

fn certificate_mac_is_computed_and_checked_in_the_hsm(hsm: &Arc<Hsm>, _module: Module) {
    let mac = hsm.certificate_mac(b"fields").unwrap();
    assert_eq!(mac.len(), 32);
    assert_eq!(hsm.certificate_mac(b"fields").unwrap(), mac, "deterministic");
    assert!(hsm.certificate_mac_valid(b"fields", &mac).unwrap());
    // Remembered as valid, it is the exact fields and MAC that are: other fields, another MAC or
    // a truncated one are checked in the HSM, and refused.
    assert!(hsm.certificate_mac_valid(b"fields", &mac).unwrap());
    assert!(!hsm.certificate_mac_valid(b"fieldz", &mac).unwrap());
    let mut forged = mac.clone();
    forged[0] ^= 1;
    assert!(!hsm.certificate_mac_valid(b"fields", &forged).unwrap());
    assert!(!hsm.certificate_mac_valid(b"fields", &mac[..31]).unwrap());
    // A refused MAC did not wedge the pool.
    assert!(hsm.certificate_mac_valid(b"fields", &mac).unwrap());
}

fn seal_round_trip_with_fresh_ivs(hsm: &Arc<Hsm>, _module: Module) {
    let b = binding(BlobKind::PrivateKey, "org-a", "key-1");
    let secret = [42u8; 32];
    let blob1 = hsm.seal(&b, &secret).unwrap();
    let blob2 = hsm.seal(&b, &secret).unwrap();
    assert_ne!(blob1, blob2, "every seal uses a fresh IV");
    assert!(!blob1.windows(32).any(|w| w == secret), "plaintext must not appear in the blob");
    assert_eq!(hsm.unseal(&b, &blob1).unwrap().as_slice(), &secret);
    assert_eq!(hsm.unseal(&b, &blob2).unwrap().as_slice(), &secret);
}

fn blob_moved_to_another_org_resource_or_kind_fails_to_open(hsm: &Arc<Hsm>, _module: Module) {
    let blob = hsm.seal(&binding(BlobKind::WalletSeed, "org-a", "wallet-1"), b"seed words").unwrap();
    for wrong in [
        binding(BlobKind::WalletSeed, "org-b", "wallet-1"),
        binding(BlobKind::WalletSeed, "org-a", "wallet-2"),
        binding(BlobKind::PrivateKey, "org-a", "wallet-1"),
    ] {
        assert!(matches!(hsm.unseal(&wrong, &blob), Err(HsmError::SealAuthentication)), "{wrong:?}");
    }
    let mut tampered = blob.clone();
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    let right = binding(BlobKind::WalletSeed, "org-a", "wallet-1");
    assert!(matches!(hsm.unseal(&right, &tampered), Err(HsmError::SealAuthentication)));
    assert!(matches!(hsm.unseal(&right, b"garbage"), Err(HsmError::Malformed(_))));
    // The failures did not wedge the pool: the right binding still opens.
    assert_eq!(hsm.unseal(&right, &blob).unwrap().as_slice(), b"seed words");
}

fn bundle_signer_signs_verifiably_and_randomness_differs(hsm: &Arc<Hsm>, _module: Module) {
    use p256::ecdsa::signature::Verifier;
    let pk = hsm.signer_public_key().unwrap();
    assert_eq!(pk[0], 0x04);
    let der = hsm.sign_with_bundle_signer(b"envelope data").unwrap();
    let vk = p256::ecdsa::VerifyingKey::from_sec1_bytes(&pk).unwrap();
    let sig = p256::ecdsa::Signature::from_der(&der).unwrap();
    vk.verify(b"envelope data", &sig).unwrap();
    assert!(vk.verify(b"other data", &sig).is_err());
    let (a, b) = (hsm.random(32).unwrap(), hsm.random(32).unwrap());
    assert_ne!(a.as_slice(), b.as_slice());
}

fn concurrent_seal_and_unseal_share_the_pool(hsm: &Arc<Hsm>, _module: Module) {
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let hsm = hsm.clone();
            std::thread::spawn(move || {
                for j in 0..25 {
                    let res = format!("r-{i}-{j}");
                    let b = binding(BlobKind::WalletAccountKey, "org", &res);
                    let blob = hsm.seal(&b, res.as_bytes()).unwrap();
                    assert_eq!(hsm.unseal(&b, &blob).unwrap().as_slice(), res.as_bytes());
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

fn webhook_signatures_come_from_the_hsm_key_and_verify_independently(hsm: &Arc<Hsm>, _module: Module) {
    let public = hsm.webhook_public_key().unwrap();
    let messages: Vec<Vec<u8>> =
        (0..3).map(|n| format!("v1.ed25519.kid.1700000000000.evt-{n}.{{\"id\":\"a\"}}").into_bytes()).collect();
    let signatures = hsm.sign_webhooks(&messages).unwrap();
    assert_eq!(signatures.len(), 3, "one signature per message, in order");
    // ed25519-dalek, not the HSM, decides whether they verify.
    let key = ed25519_dalek::VerifyingKey::from_bytes(&public).unwrap();
    for (message, signature) in messages.iter().zip(&signatures) {
        key.verify_strict(message, &ed25519_dalek::Signature::from_bytes(signature)).unwrap();
    }
    assert!(key.verify_strict(&messages[1], &ed25519_dalek::Signature::from_bytes(&signatures[0])).is_err());
    assert!(hsm.sign_webhooks(&[]).unwrap().is_empty());
    let session = hsm.session().unwrap();
    let handle = find_key(&session, ObjectClass::PRIVATE_KEY, WEBHOOK_SIGNER_LABEL).unwrap();
    match hsm.profile().webhook_signer {
        // The private half stays in the token: sensitive and not extractable.
        KeyHome::Hsm => {
            let attrs = session
                .get_attributes(handle.unwrap(), &[AttributeType::Sensitive, AttributeType::Extractable])
                .unwrap();
            assert!(
                attrs.contains(&Attribute::Sensitive(true)) && attrs.contains(&Attribute::Extractable(false)),
                "{attrs:?}"
            );
        }
        // A module without Ed25519 (kryoptic on OpenSSL 3.0): a sealed seed, no token object.
        _ => assert!(handle.is_none() && hsm.has_sealed_key(WEBHOOK_SIGNER_LABEL).unwrap()),
    }
}

fn proofs_are_signed_by_the_hsm_proof_key_and_verify_as_app_proofs(hsm: &Arc<Hsm>, _module: Module) {
    let point = hsm.proof_public_key().unwrap();
    assert_eq!(point[0], 0x04);
    let payload = coffer_auth::proof::payload("T", 1, "body", serde_json::json!({ "a": 1 }));
    let signature = hsm.sign_proof(&payload).unwrap();
    let proof = coffer_auth::proof::app_proof(&point, payload.clone(), &signature);
    assert_eq!(coffer_auth::proof::verify(&proof, Some(&point)).unwrap()["body"]["a"], 1);
    // p256 (not the HSM) decides: r || s over SHA-256 of the payload, by the published key.
    use p256::ecdsa::signature::Verifier;
    let key = p256::ecdsa::VerifyingKey::from_sec1_bytes(&point).unwrap();
    let sig = p256::ecdsa::Signature::from_slice(&signature).unwrap();
    key.verify(payload.as_bytes(), &sig).unwrap();
    assert!(key.verify(b"another payload", &sig).is_err());
    let session = hsm.session().unwrap();
    let handle = find_key(&session, ObjectClass::PRIVATE_KEY, PROOF_LABEL).unwrap().unwrap();
    let attrs = session.get_attributes(handle, &[AttributeType::Sensitive, AttributeType::Extractable]).unwrap();
    assert!(attrs.contains(&Attribute::Sensitive(true)) && attrs.contains(&Attribute::Extractable(false)), "{attrs:?}");
}

/// The profile the shared token of `module` was detected under, as configured (before `check`).
fn detected(module: Module) -> ModuleProfile {
    ModuleProfile::named(match module {
        Module::SoftHsm => "softhsm",
        Module::Kryoptic => "kryoptic",
    })
    .unwrap()
}

fn seals_record_their_iv_and_open_under_the_other_iv_mode(hsm: &Arc<Hsm>, module: Module) {
    let b = binding(BlobKind::WalletSeed, "org", "w");
    let blob = hsm.seal(&b, b"seed").unwrap();
    let (version, _, source, iv, _) = super::fuzzing::decode(&blob).unwrap();
    assert_eq!((version, source, iv.len()), (3, hsm.profile().iv_source.code(), 12));
    assert_eq!(
        hsm.profile().iv_source,
        if module == Module::Kryoptic { IvSource::MessageApi } else { IvSource::Caller }
    );
    // Blobs of the earlier formats (12-byte caller IVs) keep opening.
    for version in [V2, LEGACY_VERSION] {
        let old = hsm.seal_as_version(&b, b"old seed", version).unwrap();
        assert_eq!(super::fuzzing::decode(&old).unwrap().0, version);
        assert_eq!(hsm.unseal(&b, &old).unwrap().as_slice(), b"old seed");
    }
    // The same token under the other IV mode: caller IVs where the module generates them, and
    // module-generated IVs (the message API) where the module offers it.
    let other = ModuleProfile {
        iv_source: if module == Module::Kryoptic { IvSource::Caller } else { IvSource::MessageApi },
        ..detected(module)
    };
    let Some(opened) = open(module, "unit", None, 2) else { return };
    match try_open(module, "unit", Some(other.clone()), 2, pin()).unwrap() {
        Ok(twin) => {
            let theirs = twin.seal(&b, b"their seed").unwrap();
            assert_eq!(super::fuzzing::decode(&theirs).unwrap().2, other.iv_source.code());
            assert_eq!(hsm.unseal(&b, &theirs).unwrap().as_slice(), b"their seed");
            assert_eq!(twin.unseal(&b, &blob).unwrap().as_slice(), b"seed");
        }
        // SoftHSM 2.6 is a PKCS#11 2.40 module: no message API, and the start-up check says so.
        Err(e) => {
            assert_eq!(module, Module::SoftHsm);
            assert!(e.to_string().contains("C_MessageEncryptInit"), "{e}");
        }
    }
    assert_eq!(opened.unseal(&b, &blob).unwrap().as_slice(), b"seed");
    // A module that is said to write its IV back and does not (neither does) is caught: sealing
    // under IV 0 again and again would break GCM.
    let said = ModuleProfile { iv_source: IvSource::WrittenBack, ..detected(module) };
    let written = open(module, "unit", Some(said), 2).unwrap();
    let err = written.seal(&b, b"seed").expect_err("refused");
    assert!(err.to_string().contains("wrote no GCM IV back"), "{err}");
}

fn the_session_pool_never_exceeds_its_bound_under_64_signers(_hsm: &Arc<Hsm>, module: Module) {
    let bounded = Arc::new(open(module, "unit", None, 4).unwrap());
    let signers: Vec<_> = (0..64)
        .map(|i| {
            let hsm = bounded.clone();
            std::thread::spawn(move || {
                for j in 0..4 {
                    let message = format!("message {i}.{j}");
                    let der = hsm.sign_with_bundle_signer(message.as_bytes()).unwrap();
                    let sig = p256::ecdsa::Signature::from_der(&der).unwrap();
                    let key = p256::ecdsa::VerifyingKey::from_sec1_bytes(&hsm.signer_public_key().unwrap()).unwrap();
                    p256::ecdsa::signature::Verifier::verify(&key, message.as_bytes(), &sig).unwrap();
                }
            })
        })
        .collect();
    for s in signers {
        s.join().unwrap();
    }
    // Reached, never passed.
    assert_eq!(bounded.session_bound_and_peak(), (4, 4));
    // A module's own limit caps the configured pool, the anchor session included.
    let capped = ModuleProfile { max_sessions: Some(3), ..detected(module) };
    assert_eq!(open(module, "unit", Some(capped), 16).unwrap().session_bound_and_peak().0, 2);
}

fn the_start_up_check_refuses_a_profile_whose_mechanism_is_missing(_hsm: &Arc<Hsm>, module: Module) {
    let refusal = |profile: ModuleProfile| match try_open(module, "unit", Some(profile), 2, pin()).unwrap() {
        Err(HsmError::ProfileUnsupported { missing, .. }) => Some(missing),
        Err(e) => panic!("{e}"),
        Ok(_) => None,
    };
    let native_k1 = ModuleProfile { native_secp256k1: true, ..detected(module) };
    let vendor_gcm = ModuleProfile::named("gcp-kms").unwrap();
    match module {
        // kryoptic has no secp256k1; SoftHSM takes any curve OpenSSL knows.
        Module::Kryoptic => {
            assert!(refusal(native_k1).unwrap().contains("secp256k1"));
            // kryoptic has no Ed25519 without OpenSSL 3.2: a profile that needs it in the HSM is refused.
            if hsm_on(module).unwrap().profile().webhook_signer == KeyHome::Sealed {
                let ed = ModuleProfile { webhook_signer: KeyHome::Hsm, ..detected(module) };
                assert!(refusal(ed).unwrap().contains("CKM_EDDSA"));
            }
        }
        Module::SoftHsm => {
            assert!(detected(module).native_secp256k1, "SoftHSM makes secp256k1 keys");
            assert_eq!(refusal(native_k1), None)
        }
    }
    let missing = refusal(vendor_gcm).unwrap();
    assert!(missing.contains("vendor mechanism 0x8001e101"), "names the vendor GCM: {missing}");
    // Unknown names are refused with the list of known ones.
    let err = ModuleProfile::configured("thales").err().unwrap().to_string();
    assert!(err.contains("luna-fips") && err.contains("\"thales\""), "{err}");
}

fn service_keys_are_sealed_where_the_module_cannot_hold_them(_hsm: &Arc<Hsm>, module: Module) {
    use ed25519_dalek::Verifier;
    let all_sealed = ModuleProfile {
        webhook_signer: KeyHome::Sealed,
        tls_fetcher: KeyHome::Sealed,
        cert_mac: KeyHome::Sealed,
        ..detected(module)
    };
    // A pool of one session: sealing while initialising must not wait for itself.
    let first = open(module, "sealed", Some(all_sealed.clone()), 1).unwrap();
    first.init_service_keys().unwrap();
    let session = first.session().unwrap();
    for (class, label) in [
        (ObjectClass::PRIVATE_KEY, WEBHOOK_SIGNER_LABEL),
        (ObjectClass::PRIVATE_KEY, TLS_FETCHER_LABEL),
        (ObjectClass::SECRET_KEY, CERT_MAC_LABEL),
    ] {
        assert!(find_key(&session, class, label).unwrap().is_none(), "{label} is not a token object");
        assert!(first.has_sealed_key(label).unwrap(), "{label} is sealed in the authority store");
    }
    drop(session);
    // Webhook signatures verify with ed25519-dalek under the published key.
    let public = first.webhook_public_key().unwrap();
    let signatures = first.sign_webhooks(&[b"delivery".to_vec()]).unwrap();
    let key = ed25519_dalek::VerifyingKey::from_bytes(&public).unwrap();
    key.verify(b"delivery", &ed25519_dalek::Signature::from_bytes(&signatures[0])).unwrap();
    // ECDH equals the peer's side computed in software.
    let peer = p256::SecretKey::from_slice(&[5u8; 32]).unwrap();
    let peer_point: [u8; 65] = peer.public_key().to_sec1_bytes().as_ref().try_into().unwrap();
    let fetcher = first.login_public_keys().unwrap().tls_fetcher;
    let expected = p256::ecdh::diffie_hellman(
        peer.to_nonzero_scalar(),
        p256::PublicKey::from_sec1_bytes(&fetcher).unwrap().as_affine(),
    );
    assert_eq!(first.tls_fetcher_ecdh(&peer_point).unwrap().as_slice(), expected.raw_secret_bytes().as_slice());
    // Certificate MACs: RFC 2104 HMAC-SHA256, checked in constant time.
    let mac = first.certificate_mac(b"fields").unwrap();
    assert!(first.certificate_mac_valid(b"fields", &mac).unwrap());
    assert!(!first.certificate_mac_valid(b"fieldz", &mac).unwrap());
    // A restarted enclave finds the same keys: same public halves, same MACs, and what the first
    // sealed opens.
    let blob = first.seal(&binding(BlobKind::PrivateKey, "o", "k"), &[3u8; 32]).unwrap();
    drop(first);
    let restarted = open(module, "sealed", Some(all_sealed), 2).unwrap();
    assert!(restarted.init_service_keys().unwrap().is_empty(), "nothing to create again");
    assert_eq!(restarted.webhook_public_key().unwrap(), public);
    assert_eq!(restarted.login_public_keys().unwrap().tls_fetcher, fetcher);
    assert_eq!(restarted.certificate_mac(b"fields").unwrap(), mac);
    assert_eq!(restarted.unseal(&binding(BlobKind::PrivateKey, "o", "k"), &blob).unwrap().as_slice(), &[3u8; 32]);
}

fn login_with_a_wrong_pin_is_refused(_hsm: &Arc<Hsm>, module: Module) {
    // A token nobody in this process has logged in to (a login is per application and token).
    let label = "pin-check";
    let prepared = prepared(module).unwrap();
    init_token(&prepared.path, label, &AuthPin::new("unit-so-pin".to_string().into()), &pin()).unwrap();
    match try_open(module, label, None, 2, AuthPin::new("not-the-pin".to_string().into())).unwrap() {
        Err(HsmError::Pkcs11 { call: "C_Login", rv }) => {
            assert_eq!(rv, cryptoki::error::RvError::PinIncorrect)
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a wrong PIN logged in"),
    }
    assert!(try_open(module, label, None, 2, pin()).unwrap().is_ok());
}

fn login_keys_sign_verifiably_and_ecdh_matches_software(hsm: &Arc<Hsm>, _module: Module) {
    use p256::ecdsa::signature::hazmat::PrehashVerifier;
    let keys = hsm.login_public_keys().unwrap();
    assert_ne!(keys.notarizer, keys.oidc_issuer);
    assert_ne!(keys.oidc_issuer, keys.tls_fetcher);
    let digest = [7u8; 32];
    for (key, point) in [(LoginKey::Notarizer, keys.notarizer), (LoginKey::OidcIssuer, keys.oidc_issuer)] {
        let sig = hsm.sign_digest_with(key, &digest).unwrap();
        let vk = p256::ecdsa::VerifyingKey::from_sec1_bytes(&point).unwrap();
        let sig = p256::ecdsa::Signature::from_slice(&sig).unwrap();
        vk.verify_prehash(&digest, &sig).unwrap();
        assert!(sig.normalize_s().is_none(), "low-S");
    }
    // ECDH in the HSM equals ECDH in software with the peer's secret.
    let peer = p256::SecretKey::from_slice(&[9u8; 32]).unwrap();
    let peer_point: [u8; 65] = peer.public_key().to_sec1_bytes().as_ref().try_into().unwrap();
    let shared = hsm.tls_fetcher_ecdh(&peer_point).unwrap();
    let fetcher = p256::PublicKey::from_sec1_bytes(&keys.tls_fetcher).unwrap();
    let expected = p256::ecdh::diffie_hellman(peer.to_nonzero_scalar(), fetcher.as_affine());
    assert_eq!(shared.as_slice(), expected.raw_secret_bytes().as_slice());
    // Not a point: refused before the HSM sees it.
    assert!(hsm.tls_fetcher_ecdh(&[4u8; 65]).is_err());
}

fn the_sealing_self_test_passes_under_the_module_s_profile_and_names_one_to_try_otherwise(
    _hsm: &Arc<Hsm>,
    module: Module,
) {
    // The module's own profile, detected and configured, opened as `init` and as `serve` does:
    // seals and opens.
    for (profile, creates_keys) in [(None, true), (Some(detected(module)), true), (None, false)] {
        let opened = try_open_as(module, "unit", profile, 2, pin(), "unit", 0, creates_keys);
        let mut fitting = opened.unwrap().unwrap_or_else(|e| panic!("{e}"));
        fitting.self_test().unwrap_or_else(|e| panic!("{e}"));
    }
    // A profile that does not fit the module is refused at start with the advice to change it:
    // the module neither writes its IV back nor puts it in the output.
    for iv_source in [IvSource::WrittenBack, IvSource::Appended, IvSource::Prepended] {
        let wrong = ModuleProfile { iv_source, iv_len: 16, ..detected(module) };
        let mut unfit = open(module, "unit", Some(wrong), 2).unwrap();
        match unfit.self_test() {
            Err(e @ HsmError::SelfTest { .. }) => {
                let said = e.to_string();
                assert!(said.contains("hsm_profile") && said.contains("try"), "{said}");
            }
            other => panic!("{iv_source:?}: {other:?}"),
        }
    }
    // Detected as a Luna or an nShield whose round trip fails, the module is tried as one in
    // FIPS mode; where that fails too (neither SoftHSM nor kryoptic choose their IVs), the
    // first failure is reported and the detected profile kept.
    for vendor in ["luna", "nshield"] {
        let failing = ModuleProfile { name: vendor, iv_source: IvSource::WrittenBack, ..detected(module) };
        let mut tried = open(module, "unit", Some(failing), 2).unwrap();
        tried.as_if_detected();
        match tried.self_test() {
            Err(HsmError::SelfTest { profile, .. }) => assert_eq!(profile, vendor),
            other => panic!("{vendor}: {other:?}"),
        }
        assert_eq!((tried.profile().name, tried.profile().iv_source), (vendor, IvSource::WrittenBack));
    }
    assert_eq!(
        ModuleProfile::named("nshield-fips").map(|p| (p.iv_source, p.iv_len)),
        Some((IvSource::WrittenBack, 12))
    );
}

fn a_label_held_twice_is_refused_by_init_and_serve(_hsm: &Arc<Hsm>, module: Module) {
    let first = open(module, "dups", None, 2).unwrap();
    first.init_service_keys().unwrap();
    // A second KEK, as two `init` runs at once can make: which one a search finds first is the
    // module's choice, so neither is used.
    let usage = [Attribute::Encrypt(true), Attribute::Decrypt(true)];
    let session = first.session().unwrap();
    generate_secret(
        &session,
        cryptoki::mechanism::Mechanism::AesKeyGen,
        cryptoki::object::KeyType::AES,
        KEK_LABEL,
        usage,
    )
    .unwrap();
    drop(session);
    drop(first);
    let mut again = open(module, "dups", None, 2).unwrap();
    for refused in [again.init_service_keys().map(|_| ()), again.self_test()] {
        match refused {
            Err(HsmError::DuplicateLabel { label, count }) => assert_eq!((label.as_str(), count), (KEK_LABEL, 2)),
            other => panic!("{other:?}"),
        }
    }
}

fn a_kek_seals_at_most_2_to_the_32_blobs_counted_in_the_store(_hsm: &Arc<Hsm>, module: Module) {
    let b = binding(BlobKind::PrivateKey, "o", "k");
    let counted =
        |store: &str, before: u64| try_open_as(module, "unit", None, 2, pin(), store, before, true).unwrap().unwrap();
    // Counted in blocks reserved from the store: one seal reserves 1,024.
    let fresh = counted("seals-fresh", 0);
    fresh.seal(&b, &[1u8; 32]).unwrap();
    fresh.seal(&b, &[2u8; 32]).unwrap();
    let store = |name: &str| {
        let url =
            format!("sqlite://{}", prepared(module).unwrap().dir.join(format!("{name}.authority.sqlite")).display());
        crate::store::open(&crate::store::StoreSettings { url, ..Default::default() }).unwrap()
    };
    assert_eq!(store("seals-fresh").reserve_seals(KEK_LABEL, 0).unwrap(), 1024);
    // Two seals short of 2³²: two more, then none (rotation is the way out).
    let full = counted("seals-full", (1u64 << 32) - 2);
    full.seal(&b, &[3u8; 32]).unwrap();
    full.seal(&b, &[4u8; 32]).unwrap();
    match full.seal(&b, &[5u8; 32]) {
        Err(HsmError::KekExhausted { label, count }) => assert_eq!((label.as_str(), count), (KEK_LABEL, 1u64 << 32)),
        other => panic!("{other:?}"),
    }
    // What was sealed before still opens.
    let blob = fresh.seal(&b, &[6u8; 32]).unwrap();
    assert_eq!(full.unseal(&b, &blob).unwrap().as_slice(), &[6u8; 32]);
}

fn a_rotated_kek_seals_what_comes_next_and_old_blobs_move_to_it(_hsm: &Arc<Hsm>, module: Module) {
    let all_sealed = ModuleProfile {
        webhook_signer: KeyHome::Sealed,
        tls_fetcher: KeyHome::Sealed,
        cert_mac: KeyHome::Sealed,
        ..detected(module)
    };
    let open_on = |creates_keys| {
        try_open_as(module, "rotate", Some(all_sealed.clone()), 2, pin(), "rotate", 0, creates_keys).unwrap().unwrap()
    };
    let hsm = open_on(true);
    hsm.init_service_keys().unwrap();
    let mac = hsm.certificate_mac(b"certificate").unwrap();
    let b = binding(BlobKind::PrivateKey, "o", "k");
    let old = hsm.seal(&b, &[7u8; 32]).unwrap();
    let kek_of = |blob: &[u8]| seal::decode(blob).unwrap().kek_label.to_string();
    assert_eq!(kek_of(&old), KEK_LABEL);
    // A rotation names the KEK it rotates from: a stale one, or the same body again, rotates nothing.
    assert!(matches!(hsm.rotate_kek("coffer-kek-v2", 1), Err(HsmError::KekNotCurrent { .. })));
    // A rotation that stopped before it was recorded (or lost to another enclave's) left an
    // object under the next label: the recorded one is the KEK, in every process.
    hsm.make_rotated_kek("coffer-kek-v2", b"left-over").unwrap();
    hsm.forget_kek("coffer-kek-v2").unwrap();
    assert_eq!(hsm.rotate_kek(KEK_LABEL, 1).unwrap(), "coffer-kek-v2");
    assert!(matches!(hsm.rotate_kek(KEK_LABEL, 2), Err(HsmError::KekNotCurrent { .. })));
    // New seals name the new KEK, in this process and in another on the same store.
    assert_eq!(kek_of(&hsm.seal(&b, &[8u8; 32]).unwrap()), "coffer-kek-v2");
    assert_eq!(kek_of(&open_on(false).seal(&b, &[8u8; 32]).unwrap()), "coffer-kek-v2");
    // The old blob still opens; a re-seal moves it, once, and only under its own binding.
    assert_eq!(hsm.unseal(&b, &old).unwrap().as_slice(), &[7u8; 32]);
    assert!(matches!(
        hsm.reseal(&binding(BlobKind::PrivateKey, "o", "other"), &old),
        Err(HsmError::SealAuthentication)
    ));
    let moved = hsm.reseal(&b, &old).unwrap().expect("moved");
    assert_eq!(kek_of(&moved), "coffer-kek-v2");
    assert_eq!(hsm.unseal(&b, &moved).unwrap().as_slice(), &[7u8; 32]);
    assert!(hsm.reseal(&b, &moved).unwrap().is_none(), "under the current KEK already");
    // The sealed service keys moved at rotation, and work as before.
    let states = hsm.kek_states().unwrap();
    let summary: Vec<_> = states.iter().map(|k| (k.label.as_str(), k.current, k.in_token, k.service_keys)).collect();
    assert_eq!(summary, vec![(KEK_LABEL, false, true, 0), ("coffer-kek-v2", true, true, 3)]);
    assert!(states[1].seals >= 1024, "seals are counted under the new KEK");
    assert_eq!(open_on(false).certificate_mac(b"certificate").unwrap(), mac);
    // The current KEK is never destroyed; an old one is, and what names it opens no more.
    assert!(matches!(hsm.destroy_kek("coffer-kek-v2", 3), Err(HsmError::KekInUse { .. })));
    // Nor one not made yet (recorded, it would become current) or malformed.
    for never in ["coffer-kek-v9", "coffer-kek-v4294967295", "coffer-kek-v02", "coffer-cert-mac-v1"] {
        assert!(matches!(hsm.destroy_kek(never, 3), Err(HsmError::UnknownKek(_))), "{never}");
    }
    assert_eq!(hsm.current_kek().unwrap(), "coffer-kek-v2");
    hsm.destroy_kek(KEK_LABEL, 3).unwrap();
    assert!(matches!(hsm.unseal(&b, &old), Err(HsmError::UnknownKek(_))));
    assert_eq!(hsm.unseal(&b, &moved).unwrap().as_slice(), &[7u8; 32]);
    let first = &hsm.kek_states().unwrap()[0];
    assert_eq!((first.in_token, first.destroyed_ms), (false, Some(3)));
    // Only `coffer-kek-v<n>` labels are KEKs: a blob naming another key of the token is refused.
    let forged = seal::encode(seal::VERSION, CERT_MAC_LABEL, 1, &[1u8; 12], &[0u8; 48]);
    assert!(matches!(hsm.unseal(&b, &forged), Err(HsmError::UnknownKek(_))));
}

fn native_keys_are_made_and_used_in_the_module_and_never_leave_it(_hsm: &Arc<Hsm>, module: Module) {
    use coffer_crypto::{sign, Curve};
    let hsm = try_open_as(module, "native", None, 2, pin(), "native", 0, true).unwrap().unwrap();
    hsm.init_service_keys().unwrap();
    let digest = [0x5au8; 32];
    let mut made = Vec::new();
    for curve in [Curve::P256, Curve::Secp256k1] {
        let id = format!("key-{curve:?}");
        let (label, public) = match hsm.make_native_key(curve, "o", "top-a", &id, 1) {
            Err(HsmError::NativeCurveUnsupported(name)) if module == Module::Kryoptic && curve == Curve::Secp256k1 => {
                assert_eq!(name, "CURVE_SECP256K1");
                continue;
            }
            other => other.unwrap_or_else(|e| panic!("{curve:?}: {e:?}")),
        };
        assert_eq!((label.as_str(), public.len()), (native_label(&id).as_str(), 33));
        // The private half is sensitive and never extractable: its value is not readable.
        let session = hsm.session().unwrap();
        let key = find_key(&session, ObjectClass::PRIVATE_KEY, &label).unwrap().unwrap();
        let attrs = session.get_attributes(key, &[AttributeType::Sensitive, AttributeType::Extractable]).unwrap();
        assert!(attrs.contains(&Attribute::Sensitive(true)) && attrs.contains(&Attribute::Extractable(false)));
        assert!(session.get_attributes(key, &[AttributeType::Value]).map_or(true, |v| v.is_empty()));
        drop(session);
        // Signatures verify under the public key with the RustCrypto crates, low-S, and the
        // recovery id recovers the key.
        for _ in 0..4 {
            let raw = hsm.sign_native(&label, &digest).unwrap();
            let sig = sign::ecdsa_from_raw(curve, &public, &digest, &raw).unwrap();
            match curve {
                Curve::Secp256k1 => {
                    use k256::ecdsa::{RecoveryId, Signature, VerifyingKey};
                    let s = Signature::from_scalars(sig.r, sig.s).unwrap();
                    assert!(s.normalize_s().is_none(), "low-S");
                    let id = RecoveryId::from_byte(sig.recovery_id).unwrap();
                    let recovered = VerifyingKey::recover_from_prehash(&digest, &s, id).unwrap();
                    assert_eq!(recovered, VerifyingKey::from_sec1_bytes(&public).unwrap());
                }
                _ => {
                    use p256::ecdsa::signature::hazmat::PrehashVerifier;
                    let s = p256::ecdsa::Signature::from_scalars(sig.r, sig.s).unwrap();
                    assert!(s.normalize_s().is_none(), "low-S");
                    p256::ecdsa::VerifyingKey::from_sec1_bytes(&public).unwrap().verify_prehash(&digest, &s).unwrap();
                }
            }
        }
        made.push(label);
    }
    // The same key again (a request's retry while its first attempt left the key) is refused as
    // pending, not made twice.
    assert!(matches!(hsm.make_native_key(Curve::P256, "o", "top-a", "key-P256", 1), Err(HsmError::NativeKeyPending)));
    // Counted against one top-level organization's bound (6 here), then the token's (8).
    let mut n = made.len();
    while n < 6 {
        made.push(hsm.make_native_key(Curve::P256, "sub-of-a", "top-a", &format!("fill-{n}"), 1).unwrap().0);
        n += 1;
    }
    assert!(matches!(
        hsm.make_native_key(Curve::P256, "o", "top-a", "one-more", 1),
        Err(HsmError::NativeKeysFullForOrganization(6))
    ));
    while n < 8 {
        made.push(hsm.make_native_key(Curve::P256, "b", "top-b", &format!("fill-{n}"), 1).unwrap().0);
        n += 1;
    }
    assert!(matches!(hsm.make_native_key(Curve::P256, "c", "top-c", "one-more", 1), Err(HsmError::NativeKeysFull)));
    assert!(matches!(
        hsm.make_native_key(Curve::Ed25519, "o", "top-a", "ed", 1),
        Err(HsmError::NativeCurveUnsupported("CURVE_ED25519"))
    ));
    // Destroyed, a key signs no more and its place is free again.
    assert!(hsm.destroy_native_key(&made[0]).unwrap());
    assert!(!hsm.destroy_native_key(&made[0]).unwrap(), "gone");
    assert!(matches!(hsm.sign_native(&made[0], &digest), Err(HsmError::NativeKeyMissing(_))));
    hsm.make_native_key(Curve::P256, "o", "top-a", "one-more", 1).unwrap();
    // An organization's keys go with it; the sweep lists what was made before a time.
    assert_eq!(hsm.destroy_native_keys_of("b").unwrap(), 8 - 6);
    let listed = hsm.native_keys_made_before(2).unwrap();
    assert_eq!(listed.len(), 6, "{listed:?}");
    assert!(listed.contains(&("one-more".to_string(), "o".to_string())));
    assert!(hsm.native_keys_made_before(1).unwrap().is_empty());
    for (id, _) in listed {
        hsm.destroy_native_key(&native_label(&id)).unwrap();
    }
}

on_both_modules!(
    native_keys_are_made_and_used_in_the_module_and_never_leave_it,
    a_rotated_kek_seals_what_comes_next_and_old_blobs_move_to_it,
    login_keys_sign_verifiably_and_ecdh_matches_software,
    account_blob_under_another_curve_or_address_fails_to_open,
    legacy_blobs_open_under_their_version_1_binding,
    certificate_mac_is_computed_and_checked_in_the_hsm,
    seal_round_trip_with_fresh_ivs,
    blob_moved_to_another_org_resource_or_kind_fails_to_open,
    bundle_signer_signs_verifiably_and_randomness_differs,
    concurrent_seal_and_unseal_share_the_pool,
    webhook_signatures_come_from_the_hsm_key_and_verify_independently,
    proofs_are_signed_by_the_hsm_proof_key_and_verify_as_app_proofs,
    seals_record_their_iv_and_open_under_the_other_iv_mode,
    the_session_pool_never_exceeds_its_bound_under_64_signers,
    the_start_up_check_refuses_a_profile_whose_mechanism_is_missing,
    service_keys_are_sealed_where_the_module_cannot_hold_them,
    login_with_a_wrong_pin_is_refused,
    the_sealing_self_test_passes_under_the_module_s_profile_and_names_one_to_try_otherwise,
    a_label_held_twice_is_refused_by_init_and_serve,
    a_kek_seals_at_most_2_to_the_32_blobs_counted_in_the_store,
);
