//! Commits: activities with their writes, in one transaction per batch, and the dispatch of
//! each write to its feature's SQL.

use super::db::Dialect;
use super::{
    activities, approvals, credentials, email_events, organizations, records, suborgs, tags, users, wallets, webhooks,
};
use crate::store::error::StoreError;
use crate::store::model::{ActivityRecord, Committed};
use crate::store::write::Write;

/// Commits activities with their writes in one transaction. The activity row goes in first and
/// its fingerprint is unique: a second submission of the same request (through this gateway or
/// another one, at the same moment) finds the first one's record instead of applying its writes
/// again.
///
/// First optimistically, all activities as they come; if any fails, that transaction is rolled
/// back and the batch redone with a savepoint per activity, so one failure costs only its own
/// activity. (On PostgreSQL each savepoint is two more round trips per activity on the committer,
/// which a batch that fails nowhere — nearly every batch — need not pay.)
pub fn commit_batch<D: Dialect>(
    db: &mut D,
    batch: &[(&ActivityRecord, &[Write])],
) -> Vec<Result<Committed, StoreError>> {
    let fail_all = |e: &dyn std::fmt::Display| batch.iter().map(|_| Err(StoreError::Backend(e.to_string()))).collect();
    if let Err(e) = db.batch(D::BEGIN_WRITE) {
        return fail_all(&e);
    }
    let optimistic: Result<Vec<Committed>, StoreError> =
        batch.iter().map(|(activity, writes)| commit_one(db, activity, writes)).collect();
    let results: Vec<_> = match optimistic {
        Ok(done) => done.into_iter().map(Ok).collect(),
        Err(_) => {
            if let Err(e) = db.batch("ROLLBACK").and_then(|()| db.batch(D::BEGIN_WRITE)) {
                return fail_all(&e);
            }
            batch.iter().map(|(activity, writes)| db.savepoint(|db| commit_one(db, activity, writes))).collect()
        }
    };
    match db.batch("COMMIT") {
        Ok(()) => results,
        Err(e) => {
            let _ = db.batch("ROLLBACK");
            fail_all(&e)
        }
    }
}

fn commit_one<D: Dialect>(db: &mut D, activity: &ActivityRecord, writes: &[Write]) -> Result<Committed, StoreError> {
    // The record of a sub-organization's deletion goes to its parent's log.
    let organization_id = deletion_parent(writes, &activity.id).unwrap_or(&activity.organization_id);
    if activities::insert(db, activity, organization_id)? {
        for w in writes {
            apply_write(db, w)?;
        }
        Ok(Committed::New(activity.clone()))
    } else {
        Ok(Committed::Existing(activities::activity_by_fingerprint(db, &activity.fingerprint)?))
    }
}

/// The parent of the sub-organization `writes` delete, when `activity_id` is the deleting one.
fn deletion_parent<'a>(writes: &'a [Write], activity_id: &str) -> Option<&'a String> {
    writes.iter().find_map(|w| match w {
        Write::DeleteSubOrganization { activity_id: a, parent_id, .. } if a == activity_id => Some(parent_id),
        _ => None,
    })
}

/// Applies one write inside a transaction, with the SQL of the write's feature. Preconditions
/// that fail return `Conflict` (the caller rolls back).
pub fn apply_write<D: Dialect>(db: &mut D, w: &Write) -> Result<(), StoreError> {
    match w {
        Write::InsertOrganization(o) => organizations::insert(db, o),
        Write::RenameOrganization { id, name, updated_at } => organizations::rename(db, id, name, *updated_at),
        Write::SetRootQuorum { organization_id, threshold, user_ids, updated_at } => {
            organizations::set_root_quorum(db, organization_id, *threshold, user_ids, *updated_at)
        }
        Write::DeleteSubOrganization { organization_id, parent_id, activity_id, require_exported, deleted_at } => {
            suborgs::delete_sub_organization(
                db,
                organization_id,
                parent_id,
                activity_id,
                *require_exported,
                *deleted_at,
            )
        }
        Write::InsertUser(u) => users::insert(db, u),
        Write::UpdateUser { organization_id, id, name, email, phone_number, tag_ids, updated_at } => users::update(
            db,
            organization_id,
            id,
            name.as_deref(),
            email.as_deref(),
            phone_number.as_deref(),
            tag_ids.as_deref(),
            *updated_at,
        ),
        Write::DeleteUsers { organization_id, ids } => users::delete(db, organization_id, ids),
        Write::InsertApiKey(k) => credentials::insert_api_key(db, k),
        Write::DeleteApiKeys { organization_id, user_id, ids } => {
            credentials::delete_api_keys(db, organization_id, user_id, ids)
        }
        Write::SetCertificate { kind, id, certificate } => credentials::set_certificate(db, *kind, id, certificate),
        Write::InsertAuthenticators(list) => credentials::insert_authenticators(db, list),
        Write::DeleteAuthenticators { organization_id, user_id, ids } => {
            credentials::delete_authenticators(db, organization_id, user_id, ids)
        }
        Write::InsertOauthProviders(list) => credentials::insert_oauth_providers(db, list),
        Write::DeleteOauthProviders { organization_id, user_id, ids } => {
            credentials::delete_oauth_providers(db, organization_id, user_id, ids)
        }
        Write::InsertWallet(wl) => wallets::insert_wallet(db, wl),
        Write::InsertAccounts(accounts) => wallets::insert_accounts(db, accounts),
        Write::InsertPrivateKeys(keys) => wallets::insert_private_keys(db, keys),
        Write::MarkWalletExported(id) => wallets::mark_wallet_exported(db, id),
        Write::MarkPrivateKeyExported(id) => wallets::mark_private_key_exported(db, id),
        Write::MarkAccountExported(id) => wallets::mark_account_exported(db, id),
        Write::DeleteWallets { ids, require_exported } => wallets::delete_wallets(db, ids, *require_exported),
        Write::MarkContactsVerified { organization_id, id } => users::mark_contacts_verified(db, organization_id, id),
        Write::RenameWallet { id, name, updated_at } => wallets::rename_wallet(db, id, name, *updated_at),
        Write::DeleteAccounts { organization_id, ids, require_exported } => {
            wallets::delete_accounts(db, organization_id, ids, *require_exported)
        }
        Write::DeletePrivateKeys { ids, require_exported } => wallets::delete_private_keys(db, ids, *require_exported),
        Write::PutImportTarget(t) => wallets::put_import_target(db, t),
        Write::TakeImportTarget { organization_id, user_id, sealed_key } => {
            wallets::take_import_target(db, organization_id, user_id, sealed_key)
        }
        Write::PutRecord(r) => records::put(db, r),
        Write::DeleteRecords { organization_id, kind, ids } => records::delete(db, organization_id, kind, ids),
        Write::InsertEmailEvents(events) => email_events::insert(db, events),
        Write::PruneEmailEvents { organization_id, created_before } => {
            email_events::prune(db, organization_id, *created_before)
        }
        Write::PruneRecords { organization_id, kind, created_before } => {
            records::prune(db, organization_id, kind, *created_before)
        }
        Write::PutRecordChecked { record, unique_message, must_exist } => {
            records::put_checked(db, record, unique_message, *must_exist)
        }
        Write::RequireRecordSet { organization_id, kind, key, value, ids } => {
            records::require_set(db, organization_id, kind, key, value, ids)
        }
        Write::UpdateTag { organization_id, kind, id, new_name, add, remove, updated_at } => {
            tags::update(db, organization_id, kind, id, new_name.as_deref(), add, remove, *updated_at)
        }
        Write::DeleteTags { organization_id, kind, ids } => tags::delete(db, organization_id, kind, ids),
        Write::UpdateConsensusActivity {
            organization_id,
            id,
            expected_votes,
            status,
            result,
            votes,
            failure,
            updated_at,
            app_proofs,
        } => approvals::update_consensus_activity(
            db,
            organization_id,
            id,
            *expected_votes,
            status,
            result,
            votes,
            failure.as_ref(),
            *updated_at,
            app_proofs,
        ),
        Write::InsertLogLink { organization_id, seq, activity_id, link } => {
            activities::insert_log_link(db, organization_id, *seq, activity_id, link)
        }
        Write::InsertPolicyEvaluation(e) => approvals::insert_policy_evaluation(db, e),
        Write::InsertIdempotencyKey { organization_id, key, intent_hash, activity_id, created_at } => {
            activities::insert_idempotency_key(db, organization_id, key, intent_hash, activity_id, *created_at)
        }
        Write::EnqueueWebhookDelivery(d) => webhooks::enqueue(db, d),
        Write::DropWebhookDeliveries { organization_id, endpoint_id } => {
            webhooks::drop_pending(db, organization_id, endpoint_id)
        }
    }
}
