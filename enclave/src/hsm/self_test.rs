//! The sealing self-test: before `serve` takes a request (and after `init` made its keys), a
//! value is sealed and opened under the KEK with the configured profile, and the blob's layout
//! is checked, so that a profile that does not fit the module is refused at start with one
//! message naming the likely profile, not found when a user signs.

use super::error::HsmError;
use super::profile::{IvSource, ModuleProfile};
use super::seal::{self, BlobBinding, BlobKind, TAG_BITS};
use super::token::Hsm;

/// The binding the self-test seals under: a service blob no other code names.
const SELF_TEST: BlobBinding<'static> = BlobBinding {
    kind: BlobKind::ServiceKey,
    organization_id: "",
    resource_id: "coffer-seal-self-test",
    curve: "",
    address: "",
    public_key: "",
};

/// What a failed self-test says to try, by the profile that failed.
fn hint(profile: &ModuleProfile) -> &'static str {
    match (profile.name, profile.iv_source) {
        ("luna", _) => "a Luna HSM in FIPS mode generates its own IVs: set hsm_profile = \"luna-fips\"",
        ("nshield", _) => {
            "an nShield in a FIPS 140 Level 3 Security World may refuse a caller's IV: set hsm_profile = \"nshield-fips\""
        }
        (_, IvSource::Caller) => {
            "a module that chooses its own IVs needs its vendor's profile (luna-fips, cloudhsm, gcp-kms), or \"kryoptic\" for the PKCS#11 3.0 message API"
        }
        (_, IvSource::WrittenBack) => {
            "the module does not write its IV back as this profile says: try hsm_profile = \"generic\" (caller IVs) or the vendor's profile"
        }
        (_, IvSource::Appended | IvSource::Prepended) => {
            "the module does not put its IV in the output as this profile says: try hsm_profile = \"generic\" (caller IVs) or the vendor's profile"
        }
        (_, IvSource::MessageApi) => {
            "the module's PKCS#11 3.0 message API does not seal as expected: try hsm_profile = \"generic\" (caller IVs)"
        }
    }
}

impl Hsm {
    /// Seals and opens a fresh random value under the KEK with this profile, twice, and checks
    /// what the module did: each blob records the profile's IV origin and length, the IVs are
    /// not zero and differ, the ciphertext is the plaintext's length and a 16-byte tag, each opens
    /// to the value sealed, and an altered or re-bound blob does not open. `Err` names what
    /// failed and the profile to try.
    pub(super) fn seal_round_trip(&self) -> Result<(), HsmError> {
        let profile = self.profile();
        let failed = |detail: String| HsmError::SelfTest { profile: profile.name, detail, hint: hint(profile) };
        let value = self.random(32)?;
        let kek = self.current_kek()?;
        // What says nothing of how the module seals (a KEK missing or held twice, the store, the
        // seal count) is reported as itself.
        let sealing = |e: HsmError| match e {
            HsmError::DuplicateLabel { .. }
            | HsmError::UnknownKek(_)
            | HsmError::Shelf(_)
            | HsmError::KekExhausted { .. }
            | HsmError::Poisoned => e,
            other => failed(format!("sealing failed: {other}")),
        };
        let first = self.seal(&SELF_TEST, &value).map_err(sealing)?;
        let second = self.seal(&SELF_TEST, &value).map_err(sealing)?;
        let (a, b) = (seal::decode(&first)?, seal::decode(&second)?);
        let layout_ok = |p: &seal::ParsedBlob<'_>| {
            p.version == seal::VERSION
                && p.kek_label == kek
                && p.iv_source == Some(profile.iv_source)
                && p.iv.len() == profile.iv_len
                && p.ciphertext.len() == value.len() + TAG_BITS / 8
        };
        if !layout_ok(&a) || !layout_ok(&b) {
            return Err(failed(format!(
                "a blob's layout is not the profile's ({} IV of {} bytes, a {}-byte tag)",
                format!("{:?}", profile.iv_source).to_lowercase(),
                profile.iv_len,
                TAG_BITS / 8
            )));
        }
        if a.iv.iter().all(|x| *x == 0) || b.iv.iter().all(|x| *x == 0) || a.iv == b.iv {
            return Err(failed("the module sealed two values under the same (or a zero) IV".into()));
        }
        for blob in [&first, &second] {
            match self.unseal(&SELF_TEST, blob) {
                Ok(opened) if opened.as_slice() == value.as_slice() => {}
                Ok(_) => return Err(failed("a blob it sealed opens to another value".into())),
                Err(e) => return Err(failed(format!("a blob it sealed does not open: {e}"))),
            }
        }
        let mut altered = first.clone();
        if let Some(last) = altered.last_mut() {
            *last ^= 1;
        }
        let elsewhere = BlobBinding { resource_id: "coffer-seal-self-test-elsewhere", ..SELF_TEST };
        // Refused by any error: modules report a failed tag check in their own ways (Cloud KMS
        // as CKR_DEVICE_ERROR); only opening is a failure.
        let refusals =
            [("an altered", self.unseal(&SELF_TEST, &altered)), ("a re-bound", self.unseal(&elsewhere, &first))];
        for (what, opened) in refusals {
            match opened {
                Ok(_) => return Err(failed(format!("{what} blob opened: the module does not check the GCM tag"))),
                Err(HsmError::SealAuthentication) => {}
                Err(e) => tracing::info!(error = %e, "the self-test's {what} blob was refused with this error"),
            }
        }
        Ok(())
    }

    /// The self-test `serve` and `init` run ([`Hsm::seal_round_trip`]). A module detected as a
    /// Luna or an nShield (`hsm_profile = "auto"`) whose round trip fails with caller IVs is tried
    /// again as one in FIPS mode ([`fips_variant`]: its own IVs), and runs as one if that
    /// round-trips.
    pub fn self_test(&mut self) -> Result<(), HsmError> {
        let first = self.seal_round_trip();
        let Err(failure) = first else { return Ok(()) };
        // Only a round trip that failed as sealing does (not a missing KEK, a store or a label
        // held twice) says something of how the module seals.
        let sealing_failed = matches!(failure, HsmError::SelfTest { .. } | HsmError::SealNotReopened(_));
        let Some(fips) = fips_variant(self.profile().name).filter(|_| sealing_failed && self.auto_detected()) else {
            return Err(failure);
        };
        let detected = self.profile().clone();
        self.set_sealing(ModuleProfile {
            name: fips.name,
            iv_source: fips.iv_source,
            iv_len: fips.iv_len,
            ..detected.clone()
        });
        match self.seal_round_trip() {
            Ok(()) => {
                tracing::warn!(
                    detected = detected.name,
                    running_as = fips.name,
                    "the module seals as one in FIPS mode: running under that profile (set hsm_profile to skip this test)"
                );
                Ok(())
            }
            Err(fips_failure) => {
                self.set_sealing(detected);
                tracing::info!(error = %fips_failure, profile = fips.name, "the round trip failed in FIPS mode too");
                Err(failure)
            }
        }
    }
}

/// The FIPS-mode profile of a vendor's profile, where the module chooses its own IVs in FIPS
/// mode: `luna` → `luna-fips`, `nshield` → `nshield-fips`.
fn fips_variant(profile: &str) -> Option<ModuleProfile> {
    match profile {
        "luna" => ModuleProfile::named("luna-fips"),
        "nshield" => ModuleProfile::named("nshield-fips"),
        _ => None,
    }
}
