//! KEK rotation: a new KEK made current in the token, blobs moved to it (re-sealed), an old KEK
//! destroyed once nothing the enclave keeps names it, and what each KEK still seals.

use std::sync::Mutex;

use cryptoki::object::ObjectClass;

use super::error::HsmError;
use super::key_labels::{kek_label, kek_version};
use super::seal::{self, BlobBinding, BlobKind};
use super::token::{objects_labelled, Hsm};

/// One rotation at a time in this process (another enclave on the store loses at the store).
static ROTATION: Mutex<()> = Mutex::new(());

/// The seal counter's name for the re-seals made under a KEK (`<label>/reseals`).
const RESEAL_COUNTER: &str = "/reseals";
/// Re-seals allowed past the seals counted under older KEKs: blobs sealed before enclaves
/// counted seals, and blobs of an older format moved on under the same KEK. About 1.6 % of a
/// KEK's 2³² seals: what re-sealing the same blobs over and over can spend of it at most.
const RESEAL_SPARE: u64 = 1 << 26;

/// The binding the rotation's check seals under: a service blob no other code names.
const ROTATION_CHECK: BlobBinding<'static> = BlobBinding {
    kind: BlobKind::ServiceKey,
    organization_id: "",
    resource_id: "coffer-kek-rotation-check",
    curve: "",
    address: "",
    public_key: "",
};

/// What one KEK is and holds, as [`Hsm::kek_states`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KekState {
    pub label: String,
    /// New seals use it.
    pub current: bool,
    /// Seals counted under it (an upper bound: blocks are reserved 1,024 at a time).
    pub seals: u64,
    /// When a rotation made it (0 for the first KEK).
    pub made_ms: i64,
    /// When it was destroyed.
    pub destroyed_ms: Option<i64>,
    /// Whether the token holds it.
    pub in_token: bool,
    /// Sealed service keys (the enclave's own blobs) that still name it.
    pub service_keys: u32,
}

impl Hsm {
    /// Makes the KEK after `from` (which must be the current one) and makes it current: created
    /// in the token (or found there, after a rotation that stopped before it was recorded), a
    /// value sealed under it and opened again, then recorded in the authority store, and the
    /// enclave's sealed service keys moved to it. Answers the new current label; a `from` that
    /// is no longer current is refused (the rotation happened already).
    pub fn rotate_kek(&self, from: &str, now_ms: i64) -> Result<String, HsmError> {
        let shelf = self.shelf.as_ref().ok_or(HsmError::NoShelf("the KEK rotation"))?;
        let _one = ROTATION.lock().map_err(|_| HsmError::Poisoned)?;
        let current = self.current_kek()?;
        if from != current {
            return Err(HsmError::KekNotCurrent { named: from.to_string(), current });
        }
        let version = kek_version(&current).ok_or_else(|| HsmError::UnknownKek(current.clone()))?;
        let next_version = version.checked_add(1).ok_or_else(|| HsmError::UnknownKek(current.clone()))?;
        let next = kek_label(next_version);
        // A new object every time, told apart by a random CKA_ID the store records: two
        // enclaves rotating at once (or a rotation that stopped before it was recorded) leave
        // objects under the label, and the recorded one is the KEK.
        let object_id = self.random(16)?.to_vec();
        let handle = self.make_rotated_kek(&next, &object_id)?;
        let made = (|| {
            let value = self.random(32)?;
            // Sealing re-opens the blob and compares (`Hsm::seal_under`).
            self.seal_under(&next, &ROTATION_CHECK, &value)?;
            shelf.add_kek(next_version, now_ms, &object_id)
        })();
        if !matches!(made, Ok(true)) {
            // Not this object: another rotation was recorded first, or the check failed.
            self.forget_kek(&next)?;
            if let Err(e) = self.destroy_object(handle) {
                tracing::warn!(error = %e, kek = %next, "a KEK object no rotation recorded was not destroyed");
            }
            made?;
            return Err(HsmError::KekNotCurrent { named: from.to_string(), current: self.current_kek()? });
        }
        tracing::warn!(from = %current, to = %next, "KEK rotated: new seals use the new KEK; re-seal stored blobs (coffer-gateway reseal)");
        // Recorded: the rotation stands. The enclave's sealed service keys move now, or at the
        // next start of any enclave if this fails.
        match self.reseal_service_keys() {
            Ok(moved) => tracing::info!(moved, "sealed service keys moved to the new KEK"),
            Err(e) => {
                tracing::warn!(error = %e, "sealed service keys not moved yet: every enclave moves them at start")
            }
        }
        Ok(next)
    }

    /// `blob` sealed again under the current KEK, in the current format, bound as before; `None`
    /// when it is sealed so already. Fails as opening it does (a wrong binding, a KEK the token
    /// does not hold).
    pub fn reseal(&self, binding: &BlobBinding<'_>, blob: &[u8]) -> Result<Option<Vec<u8>>, HsmError> {
        let current = self.current_kek()?;
        let parsed = seal::decode(blob)?;
        if parsed.kek_label == current && parsed.version == seal::VERSION {
            return Ok(None);
        }
        let opened = self.unseal(binding, blob)?;
        self.count_reseal(&current)?;
        self.seal_under(&current, binding, &opened).map(Some)
    }

    /// Counts one re-seal under the current KEK `current`, refused past the seals counted under
    /// every older KEK (and a block to spare): no more blobs were ever sealed under them, so
    /// re-sealing the same blobs again and again cannot spend the current KEK's seals.
    fn count_reseal(&self, current: &str) -> Result<(), HsmError> {
        let Some(shelf) = &self.shelf else { return Ok(()) };
        let counter = format!("{current}{RESEAL_COUNTER}");
        let older: u64 = shelf
            .seals_reserved()?
            .iter()
            .filter(|(label, _)| label != current && !label.ends_with(RESEAL_COUNTER))
            .map(|(_, n)| *n)
            .sum();
        if shelf.reserve_seals(&counter, 1)? > older + RESEAL_SPARE {
            return Err(HsmError::ResealsSpent { label: current.to_string(), count: older });
        }
        Ok(())
    }

    /// Moves every sealed service key on the shelf to the current KEK (each replaced only if no
    /// other enclave replaced it first); answers how many it moved.
    pub fn reseal_service_keys(&self) -> Result<usize, HsmError> {
        let Some(shelf) = &self.shelf else { return Ok(0) };
        let mut moved = 0;
        for (label, blob) in shelf.sealed_service_keys()? {
            let binding = BlobBinding::plain(BlobKind::ServiceKey, "", &label);
            if let Some(new) = self.reseal(&binding, &blob)? {
                moved += usize::from(shelf.replace_sealed_service_key(&label, &blob, &new)?);
            }
        }
        self.sealed_blobs.0.lock().map_err(|_| HsmError::Poisoned)?.clear();
        Ok(moved)
    }

    /// Destroys the KEK `label` in the token and records it destroyed. Refused for the current
    /// KEK and for one a sealed service key still names; the blobs the gateway keeps are the
    /// operator's to count first (`coffer-gateway kek-status`): whatever names it never opens
    /// again.
    pub fn destroy_kek(&self, label: &str, now_ms: i64) -> Result<(), HsmError> {
        let shelf = self.shelf.as_ref().ok_or(HsmError::NoShelf("the KEK rotation"))?;
        let _one = ROTATION.lock().map_err(|_| HsmError::Poisoned)?;
        let version = kek_version(label).ok_or_else(|| HsmError::UnknownKek(label.to_string()))?;
        let current = self.current_kek()?;
        if label == current {
            return Err(HsmError::KekInUse { label: label.to_string(), by: "new seals (it is the current KEK)" });
        }
        // Only a KEK a rotation replaced: never one of a version not made yet (which would
        // become "current" once recorded).
        let states = self.kek_states()?;
        let Some(state) = states.iter().find(|k| k.label == label) else {
            return Err(HsmError::UnknownKek(label.to_string()));
        };
        if kek_version(&current).is_none_or(|c| version >= c) || state.destroyed_ms.is_some() {
            return Err(HsmError::UnknownKek(label.to_string()));
        }
        if state.service_keys > 0 {
            return Err(HsmError::KekInUse { label: label.to_string(), by: "a sealed service key" });
        }
        // Every object under the label: the KEK, and any a rotation made and did not record.
        let session = self.session()?;
        for handle in objects_labelled(&session, ObjectClass::SECRET_KEY, label)? {
            session.destroy_object(handle).map_err(|e| HsmError::call("C_DestroyObject (KEK)", e))?;
        }
        drop(session);
        self.forget_kek(label)?;
        shelf.kek_destroyed(version, now_ms)?;
        tracing::warn!(kek = label, "KEK destroyed: blobs that name it never open again");
        Ok(())
    }

    /// Every KEK from the first to the current one: whether it is current, its seals, whether
    /// the token holds it, and how many sealed service keys name it.
    pub fn kek_states(&self) -> Result<Vec<KekState>, HsmError> {
        let (recorded, seals, service_keys) = match &self.shelf {
            Some(shelf) => (shelf.keks()?, shelf.seals_reserved()?, shelf.sealed_service_keys()?),
            None => Default::default(),
        };
        let newest = recorded.iter().map(|k| k.version).max().unwrap_or(1).max(1);
        let session = self.session()?;
        (1..=newest)
            .map(|version| {
                let label = kek_label(version);
                let record = recorded.iter().find(|k| k.version == version);
                let naming = service_keys
                    .iter()
                    .filter(|(_, blob)| seal::decode(blob).is_ok_and(|p| p.kek_label == label))
                    .count();
                Ok(KekState {
                    current: version == newest,
                    seals: seals.iter().find(|(l, _)| *l == label).map_or(0, |(_, n)| *n),
                    made_ms: record.map_or(0, |k| k.made_ms),
                    destroyed_ms: record.and_then(|k| k.destroyed_ms),
                    in_token: !objects_labelled(&session, ObjectClass::SECRET_KEY, &label)?.is_empty(),
                    service_keys: naming as u32,
                    label,
                })
            })
            .collect()
    }
}
