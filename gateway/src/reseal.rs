//! The operator's KEK commands: what each KEK holds (`kek-status`), making a new one current
//! (`rotate-kek`), moving the blobs the gateway keeps to it (`reseal`, resumable: each run
//! re-seals what still names an older KEK) and destroying an old one (`destroy-kek`).

use std::collections::BTreeMap;

use coffer_proto::v1 as pb;
use serde::Serialize;

use crate::custody::Custody;
use crate::operator_key::OperatorKey;
use crate::store::{now_nanos, SealedBlobTable, Store, StoredBlob};

/// Blobs read from the store per page when counting.
const COUNT_PAGE: usize = 1000;
/// The sealed-blob format version every blob moves to (`coffer_enclave::hsm::seal`).
const CURRENT_BLOB_VERSION: u8 = 3;

/// The KEK a blob names, from its header (`"CS" ‖ version ‖ len ‖ label ‖ ...`).
pub fn kek_of(blob: &[u8]) -> Option<&str> {
    let [b'C', b'S', _, len, rest @ ..] = blob else { return None };
    std::str::from_utf8(rest.get(..*len as usize)?).ok()
}

/// Whether `blob` must be re-sealed to be under `current` in the current format.
fn needs_reseal(blob: &[u8], current: &str) -> bool {
    kek_of(blob) != Some(current) || blob.get(2) != Some(&CURRENT_BLOB_VERSION)
}

/// What `kek-status` prints: the enclave's view of each KEK, and how many blobs the gateway keeps
/// under each, by table.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KekReport {
    pub current: String,
    pub keks: Vec<KekLine>,
    /// Stored blobs by KEK label, then by table.
    pub stored_blobs: BTreeMap<String, BTreeMap<&'static str, u64>>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KekLine {
    pub label: String,
    pub current: bool,
    pub seals: u64,
    pub made_ms: i64,
    pub destroyed_ms: i64,
    pub in_token: bool,
    pub service_keys: u32,
    /// Blobs the gateway keeps that name it.
    pub stored_blobs: u64,
}

/// Calls every blob of every table, a page at a time.
fn each_blob(store: &dyn Store, mut f: impl FnMut(&StoredBlob)) -> anyhow::Result<()> {
    for table in SealedBlobTable::ALL {
        let mut after = String::new();
        loop {
            let page = store.sealed_blobs_page(table, &after, COUNT_PAGE)?;
            page.iter().for_each(&mut f);
            match page.last() {
                Some(last) if page.len() == COUNT_PAGE => after = last.key.clone(),
                _ => break,
            }
        }
    }
    Ok(())
}

/// Stored blobs by the KEK they name (`"unreadable"` for a blob with no KEK header), by table.
pub fn count_stored(store: &dyn Store) -> anyhow::Result<BTreeMap<String, BTreeMap<&'static str, u64>>> {
    let mut counts: BTreeMap<String, BTreeMap<&'static str, u64>> = BTreeMap::new();
    each_blob(store, |b| {
        let label = kek_of(&b.blob).unwrap_or("unreadable").to_string();
        *counts.entry(label).or_default().entry(b.table.name()).or_default() += 1;
    })?;
    Ok(counts)
}

/// The enclave's status of each KEK with the gateway's count of blobs under it.
pub async fn status(store: &dyn Store, custody: &Custody) -> anyhow::Result<KekReport> {
    let enclave = custody.kek_status().await.map_err(|e| anyhow::anyhow!("KEK status: {}", e.message))?;
    let stored_blobs = count_stored(store)?;
    let stored = |label: &str| stored_blobs.get(label).map_or(0, |t| t.values().sum());
    Ok(KekReport {
        keks: enclave
            .keks
            .into_iter()
            .map(|k| KekLine {
                stored_blobs: stored(&k.label),
                label: k.label,
                current: k.current,
                seals: k.seals,
                made_ms: k.made_ms,
                destroyed_ms: k.destroyed_ms,
                in_token: k.in_token,
                service_keys: k.service_keys,
            })
            .collect(),
        current: enclave.current,
        stored_blobs,
    })
}

fn operator_request(
    operator: &OperatorKey,
    kind: &str,
    kek_label: &str,
    blobs_naming_it: u64,
) -> pb::OperatorKekRequest {
    let parameters = coffer_auth::operator::KekParameters { kek_label: kek_label.into(), blobs_naming_it };
    let body = coffer_auth::operator::kek_body(kind, &parameters, (now_nanos() / 1_000_000) as i64);
    pb::OperatorKekRequest {
        operator: Some(pb::StampedRequest {
            stamp: operator.stamp(&body),
            body,
            stamp_header: "X-Stamp".into(),
            certificate: Vec::new(),
        }),
    }
}

/// Makes the KEK after the current one current (stamped by the operator's key); answers the new
/// current label. Stored blobs still name the old one until [`reseal`] moves them.
pub async fn rotate(custody: &Custody, operator: &OperatorKey) -> anyhow::Result<String> {
    let current = custody.kek_status().await.map_err(|e| anyhow::anyhow!("KEK status: {}", e.message))?.current;
    let rotated = custody
        .rotate_kek(operator_request(operator, coffer_auth::operator::ROTATE_KEK, &current, 0))
        .await
        .map_err(|e| anyhow::anyhow!("the enclave did not rotate the KEK: {}", e.message))?;
    Ok(rotated.current)
}

/// What one `reseal` run did.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResealReport {
    /// The KEK blobs were moved to.
    pub current: String,
    /// Blobs sealed again and replaced.
    pub moved: u64,
    /// Blobs already under the current KEK.
    pub current_already: u64,
    /// Blobs that changed in the store while being re-sealed (re-run to move them).
    pub changed_meanwhile: u64,
    /// Blobs the enclave did not open as bound: (table, key, why). They stay as they are.
    pub failed: Vec<(String, String, String)>,
}

/// Moves every blob the gateway keeps that names an older KEK (or an older format) to the current
/// KEK, `batch` blobs per enclave call, each replaced only if its row still holds the blob read.
/// Safe to stop at any point and run again (it starts over, and skips what is moved); blobs the
/// enclave seals meanwhile are under the current KEK already. `progress` hears each table's
/// running count.
pub async fn reseal(
    store: &dyn Store,
    custody: &Custody,
    batch: usize,
    mut progress: impl FnMut(&str, u64),
) -> anyhow::Result<ResealReport> {
    let batch = batch.clamp(1, 256);
    let mut report = ResealReport {
        current: custody.kek_status().await.map_err(|e| anyhow::anyhow!("KEK status: {}", e.message))?.current,
        ..Default::default()
    };
    for table in SealedBlobTable::ALL {
        let mut after = String::new();
        loop {
            let page = store.sealed_blobs_page(table, &after, batch)?;
            let (todo, done): (Vec<&StoredBlob>, Vec<&StoredBlob>) =
                page.iter().partition(|b| needs_reseal(&b.blob, &report.current));
            report.current_already += done.len() as u64;
            if !todo.is_empty() {
                let answer = custody
                    .reseal_blobs(todo.iter().map(|b| sealed_ref(b)).collect())
                    .await
                    .map_err(|e| anyhow::anyhow!("the enclave did not re-seal: {}", e.message))?;
                if answer.current != report.current {
                    anyhow::bail!(
                        "the KEK rotated again ({} is current now, not {}) while re-sealing: run reseal again",
                        answer.current,
                        report.current
                    );
                }
                for (stored, resealed) in todo.iter().zip(answer.blobs) {
                    if !resealed.error.is_empty() {
                        report.failed.push((table.name().into(), stored.key.clone(), resealed.error));
                    } else if resealed.blob.is_empty() {
                        report.current_already += 1;
                    } else if store.replace_sealed_blob(stored, &resealed.blob)? {
                        report.moved += 1;
                    } else {
                        report.changed_meanwhile += 1;
                    }
                }
                progress(table.name(), report.moved);
            }
            match page.last() {
                Some(last) if page.len() == batch => after = last.key.clone(),
                _ => break,
            }
        }
    }
    Ok(report)
}

/// The reference the enclave opens `b` under.
fn sealed_ref(b: &StoredBlob) -> pb::SealedRef {
    let kind = match b.table {
        SealedBlobTable::Wallets => pb::BlobKind::WalletSeed,
        SealedBlobTable::WalletAccounts => pb::BlobKind::WalletAccountKey,
        SealedBlobTable::PrivateKeys => pb::BlobKind::PrivateKey,
        SealedBlobTable::ImportTargets => pb::BlobKind::ImportTarget,
        SealedBlobTable::AuthProxyKeys => pb::BlobKind::AuthProxyKey,
        SealedBlobTable::OtpRecords => pb::BlobKind::OtpRecord,
    };
    pb::SealedRef {
        kind: kind as i32,
        organization_id: b.organization_id.clone(),
        resource_id: b.resource_id.clone(),
        blob: b.blob.clone(),
        curve: b.curve.clone(),
        address: b.address.clone(),
        public_key: b.public_key.clone(),
        address_format: b.address_format.clone(),
    }
}

/// Destroys the old KEK `label` in the HSM (stamped by the operator's key) once no stored blob
/// names it: refused here while the gateway's store has any, and by the enclave while it is
/// current or a sealed service key names it.
pub async fn destroy(store: &dyn Store, custody: &Custody, operator: &OperatorKey, label: &str) -> anyhow::Result<()> {
    let naming: u64 = count_stored(store)?.get(label).map_or(0, |t| t.values().sum());
    if naming > 0 {
        anyhow::bail!("{naming} stored blobs still name {label}: run `coffer-gateway reseal` first");
    }
    custody
        .destroy_kek(operator_request(operator, coffer_auth::operator::DESTROY_KEK, label, naming))
        .await
        .map_err(|e| anyhow::anyhow!("the enclave did not destroy {label}: {}", e.message))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blob_names_its_kek_in_its_header() {
        let blob = [b"CS\x03\x0dcoffer-kek-v2".as_slice(), &[1, 12], &[0; 40]].concat();
        assert_eq!(kek_of(&blob), Some("coffer-kek-v2"));
        assert!(!needs_reseal(&blob, "coffer-kek-v2"));
        assert!(needs_reseal(&blob, "coffer-kek-v3"));
        let mut v2 = blob.clone();
        v2[2] = 2;
        assert!(needs_reseal(&v2, "coffer-kek-v2"), "an older format moves on too");
        assert_eq!(kek_of(b"CS\x03\x20short"), None);
        assert_eq!(kek_of(b"XX\x03\x01a"), None);
        assert_eq!(kek_of(b""), None);
    }
}
