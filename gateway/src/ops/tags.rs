//! User tags and private-key tags: create, update (atomically), delete, and list.
//!
//! A tag is a record of kind `user_tag` or `private_key_tag` (its name unique per organization
//! and kind, a database constraint). Memberships have one source of truth each: the `user_tags`
//! table for users, each private key's `tags` list for private keys.

use std::collections::HashSet;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};

use super::lookup::load_user;
use super::params::dedup;
use super::params::required;
use crate::activity::registry::{Ctx, Outcome, QueryCtx};
use crate::activity::render::timestamp;
use crate::error::ApiError;
use crate::record_kinds::{PRIVATE_KEY_TAG, USER_TAG};
use crate::state::AppState;
use crate::store::{Record, StoreError, Write};

fn label(kind: &str) -> &'static str {
    if kind == USER_TAG {
        "user tag"
    } else {
        "private key tag"
    }
}

/// The swagger `Tag` object.
pub fn tag_json(r: &Record) -> Value {
    json!({
        "tagId": r.id,
        "tagName": r.name,
        "tagType": if r.kind == USER_TAG { "TAG_TYPE_USER" } else { "TAG_TYPE_PRIVATE_KEY" },
        "createdAt": timestamp(r.created_at),
        "updatedAt": timestamp(r.updated_at),
    })
}

async fn tags_of_kind(state: &Arc<AppState>, org: &str, kind: &'static str) -> Result<Vec<Record>, ApiError> {
    let org = org.to_string();
    Ok(state.db(move |s| s.records(&org, kind)).await??)
}

/// 400 if another tag of the kind already has `name`.
fn check_name_free(tags: &[Record], kind: &str, name: &str, except: Option<&str>) -> Result<(), ApiError> {
    required(name, &format!("{}Name", if kind == USER_TAG { "userTag" } else { "privateKeyTag" }))?;
    if tags.iter().any(|t| t.name == name && Some(t.id.as_str()) != except) {
        return Err(ApiError::invalid(format!("{} name must be unique: {name:?}", label(kind))));
    }
    Ok(())
}

/// 404 unless every id is a member candidate (a user, or a private key) of the organization.
async fn check_members(state: &Arc<AppState>, org: &str, kind: &str, ids: &[String]) -> Result<(), ApiError> {
    for id in ids {
        if kind == USER_TAG {
            load_user(state, org, id).await?;
        } else {
            super::lookup::load_private_key(state, org, id).await?;
        }
    }
    Ok(())
}

async fn create_tag(ctx: Ctx, kind: &'static str, name: String, member_ids: &[String]) -> Result<Outcome, ApiError> {
    let existing = tags_of_kind(&ctx.state, &ctx.org.id, kind).await?;
    check_name_free(&existing, kind, &name, None)?;
    let members = dedup(member_ids);
    check_members(&ctx.state, &ctx.org.id, kind, &members).await?;
    let id = ctx.derived_id(coffer_org_rules::transition::TAG_ID, 0);
    let record = Record {
        organization_id: ctx.org.id.clone(),
        kind: kind.to_string(),
        id: id.clone(),
        name,
        data: json!({}),
        created_at: ctx.now,
        updated_at: ctx.now,
    };
    let writes = vec![
        Write::PutRecord(record),
        Write::UpdateTag {
            organization_id: ctx.org.id.clone(),
            kind: kind.to_string(),
            id: id.clone(),
            new_name: None,
            add: members.clone(),
            remove: Vec::new(),
            updated_at: ctx.now,
        },
    ];
    let result = if kind == USER_TAG {
        json!({ "userTagId": id, "userIds": members })
    } else {
        json!({ "privateKeyTagId": id, "privateKeyIds": members })
    };
    Ok(Outcome { result, writes })
}

/// All of it or none of it: the checks run first, and the one write applies the membership
/// changes and the rename in the activity's transaction (a clash there rolls everything back).
async fn update_tag(
    ctx: Ctx,
    kind: &'static str,
    id: String,
    new_name: Option<String>,
    add: &[String],
    remove: &[String],
) -> Result<Outcome, ApiError> {
    let existing = tags_of_kind(&ctx.state, &ctx.org.id, kind).await?;
    if !existing.iter().any(|t| t.id == id) {
        return Err(ApiError::not_found(format!("{} not found: {id}", label(kind))));
    }
    if let Some(name) = &new_name {
        check_name_free(&existing, kind, name, Some(&id))?;
    }
    let (add, remove) = (dedup(add), dedup(remove));
    if let Some(both) = add.iter().find(|a| remove.contains(a)) {
        return Err(ApiError::invalid(format!("{both} is both added to and removed from the {}", label(kind))));
    }
    check_members(&ctx.state, &ctx.org.id, kind, &add).await?;
    check_members(&ctx.state, &ctx.org.id, kind, &remove).await?;
    let result = if kind == USER_TAG { json!({ "userTagId": id }) } else { json!({ "privateKeyTagId": id }) };
    Ok(Outcome {
        result,
        writes: vec![Write::UpdateTag {
            organization_id: ctx.org.id.clone(),
            kind: kind.to_string(),
            id,
            new_name,
            add,
            remove,
            updated_at: ctx.now,
        }],
    })
}

/// Deletes tags; returns the ids of the users or private keys that carried one of them.
async fn delete_tags(ctx: &Ctx, kind: &'static str, ids: &[String]) -> Result<(Vec<String>, Write), ApiError> {
    let ids = dedup(ids);
    if ids.is_empty() {
        return Err(ApiError::invalid(format!(
            "{}Ids must not be empty",
            if kind == USER_TAG { "userTag" } else { "privateKeyTag" }
        )));
    }
    let existing: HashSet<String> =
        tags_of_kind(&ctx.state, &ctx.org.id, kind).await?.into_iter().map(|t| t.id).collect();
    if let Some(missing) = ids.iter().find(|id| !existing.contains(*id)) {
        return Err(ApiError::not_found(format!("{} not found: {missing}", label(kind))));
    }
    let org = ctx.org.id.clone();
    let wanted = ids.clone();
    let members = ctx
        .state
        .db(move |s| -> Result<Vec<String>, StoreError> {
            Ok(if kind == USER_TAG {
                dedup(
                    &s.user_tag_members(&org)?
                        .into_iter()
                        .filter(|(t, _)| wanted.contains(t))
                        .map(|(_, u)| u)
                        .collect::<Vec<_>>(),
                )
            } else {
                s.private_keys(&org)?
                    .into_iter()
                    .filter(|k| k.tags.iter().any(|t| wanted.contains(t)))
                    .map(|k| k.id)
                    .collect()
            })
        })
        .await??;
    Ok((members, Write::DeleteTags { organization_id: ctx.org.id.clone(), kind: kind.to_string(), ids }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateUserTagIntent {
    user_tag_name: String,
    #[serde(default)]
    user_ids: Vec<String>,
}

pub async fn create_user_tag(ctx: Ctx, intent: CreateUserTagIntent) -> Result<Outcome, ApiError> {
    create_tag(ctx, USER_TAG, intent.user_tag_name, &intent.user_ids).await
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdateUserTagIntent {
    user_tag_id: String,
    new_user_tag_name: Option<String>,
    #[serde(default)]
    add_user_ids: Vec<String>,
    #[serde(default)]
    remove_user_ids: Vec<String>,
}

pub async fn update_user_tag(ctx: Ctx, intent: UpdateUserTagIntent) -> Result<Outcome, ApiError> {
    update_tag(
        ctx,
        USER_TAG,
        intent.user_tag_id,
        intent.new_user_tag_name,
        &intent.add_user_ids,
        &intent.remove_user_ids,
    )
    .await
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteUserTagsIntent {
    #[serde(default)]
    user_tag_ids: Vec<String>,
}

pub async fn delete_user_tags(ctx: Ctx, intent: DeleteUserTagsIntent) -> Result<Outcome, ApiError> {
    let (users, write) = delete_tags(&ctx, USER_TAG, &intent.user_tag_ids).await?;
    Ok(Outcome { result: json!({ "userTagIds": dedup(&intent.user_tag_ids), "userIds": users }), writes: vec![write] })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreatePrivateKeyTagIntent {
    private_key_tag_name: String,
    #[serde(default)]
    private_key_ids: Vec<String>,
}

pub async fn create_private_key_tag(ctx: Ctx, intent: CreatePrivateKeyTagIntent) -> Result<Outcome, ApiError> {
    create_tag(ctx, PRIVATE_KEY_TAG, intent.private_key_tag_name, &intent.private_key_ids).await
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdatePrivateKeyTagIntent {
    private_key_tag_id: String,
    new_private_key_tag_name: Option<String>,
    #[serde(default)]
    add_private_key_ids: Vec<String>,
    #[serde(default)]
    remove_private_key_ids: Vec<String>,
}

pub async fn update_private_key_tag(ctx: Ctx, intent: UpdatePrivateKeyTagIntent) -> Result<Outcome, ApiError> {
    update_tag(
        ctx,
        PRIVATE_KEY_TAG,
        intent.private_key_tag_id,
        intent.new_private_key_tag_name,
        &intent.add_private_key_ids,
        &intent.remove_private_key_ids,
    )
    .await
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeletePrivateKeyTagsIntent {
    #[serde(default)]
    private_key_tag_ids: Vec<String>,
}

pub async fn delete_private_key_tags(ctx: Ctx, intent: DeletePrivateKeyTagsIntent) -> Result<Outcome, ApiError> {
    let (keys, write) = delete_tags(&ctx, PRIVATE_KEY_TAG, &intent.private_key_tag_ids).await?;
    Ok(Outcome {
        result: json!({ "privateKeyTagIds": dedup(&intent.private_key_tag_ids), "privateKeyIds": keys }),
        writes: vec![write],
    })
}

pub async fn list_user_tags(ctx: QueryCtx, req: super::params::ListRequest) -> Result<Value, ApiError> {
    let (org, page) = (ctx.org.id.clone(), req.page()?);
    let tags = ctx.state.db(move |s| s.records_page(&org, USER_TAG, &page)).await??;
    Ok(json!({ "userTags": tags.iter().map(tag_json).collect::<Vec<_>>() }))
}

pub async fn list_private_key_tags(ctx: QueryCtx, req: super::params::ListRequest) -> Result<Value, ApiError> {
    let (org, page) = (ctx.org.id.clone(), req.page()?);
    let tags = ctx.state.db(move |s| s.records_page(&org, PRIVATE_KEY_TAG, &page)).await??;
    Ok(json!({ "privateKeyTags": tags.iter().map(tag_json).collect::<Vec<_>>() }))
}

#[cfg(test)]
mod tests {
    //! The store's half of the atomicity rule, without the handlers' pre-checks.

    use super::*;
    use crate::store::{
        now_nanos, ActivityRecord, Organization, PrivateKey, SqliteStore, Store, StoreError, User, Write,
    };

    struct Db(std::path::PathBuf, SqliteStore);
    impl Drop for Db {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn db() -> Db {
        let dir = std::env::temp_dir().join(format!("coffer-tags-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let s = SqliteStore::open(&dir.join("t.db")).unwrap();
        let user = |id: &str| {
            Write::InsertUser(User {
                id: id.into(),
                organization_id: "o".into(),
                name: id.into(),
                email: None,
                phone_number: None,
                contacts_verified: false,
                created_at: 1,
                updated_at: 1,
            })
        };
        s.apply(&[
            Write::InsertOrganization(Organization {
                id: "o".into(),
                name: "o".into(),
                parent_id: None,
                root_quorum_threshold: 1,
                root_user_ids: vec!["root".into()],
                created_at: 1,
                updated_at: 1,
            }),
            user("root"),
            user("a"),
            user("b"),
            Write::InsertPrivateKeys(vec![PrivateKey {
                id: "k".into(),
                organization_id: "o".into(),
                name: "k".into(),
                curve: "CURVE_SECP256K1".into(),
                public_key: "02".into(),
                addresses: vec![],
                tags: vec![],
                exported: false,
                imported: false,
                sealed_key: vec![1],
                created_at: 1,
                updated_at: 1,
            }]),
        ])
        .unwrap();
        for (id, name, kind) in [("t1", "one", USER_TAG), ("t2", "two", USER_TAG), ("p1", "one", PRIVATE_KEY_TAG)] {
            s.apply(&[Write::PutRecord(Record {
                organization_id: "o".into(),
                kind: kind.into(),
                id: id.into(),
                name: name.into(),
                data: json!({}),
                created_at: 1,
                updated_at: 1,
            })])
            .unwrap();
        }
        Db(dir, s)
    }

    fn update(kind: &str, id: &str, name: Option<&str>, add: &[&str], remove: &[&str]) -> Write {
        Write::UpdateTag {
            organization_id: "o".into(),
            kind: kind.into(),
            id: id.into(),
            new_name: name.map(String::from),
            add: add.iter().map(|s| s.to_string()).collect(),
            remove: remove.iter().map(|s| s.to_string()).collect(),
            updated_at: 2,
        }
    }

    fn activity(fp: &str) -> ActivityRecord {
        ActivityRecord {
            id: fp.into(),
            organization_id: "o".into(),
            activity_type: "ACTIVITY_TYPE_UPDATE_USER_TAG".into(),
            status: "ACTIVITY_STATUS_COMPLETED".into(),
            fingerprint: fp.into(),
            intent: json!({}),
            result: json!({}),
            votes: json!([]),
            failure: None,
            created_at: now_nanos(),
            updated_at: now_nanos(),
            app_proofs: Vec::new(),
        }
    }

    fn members(s: &SqliteStore) -> Vec<(String, String)> {
        s.user_tag_members("o").unwrap()
    }

    #[test]
    fn update_tag_is_all_or_nothing() {
        let d = db();
        let s = &d.1;
        s.apply(&[update(USER_TAG, "t1", None, &["a"], &[])]).unwrap();
        let before = members(s);
        assert_eq!(before, vec![("t1".to_string(), "a".to_string())]);
        // Adding b, then a rename that clashes: b is not added, the name stays, no activity.
        let err = s.commit(&activity("sha256:1"), &[update(USER_TAG, "t1", Some("two"), &["b"], &["a"])]).unwrap_err();
        assert!(matches!(err, StoreError::Unique(ref m) if m == "user tag name must be unique: \"two\""), "{err:?}");
        assert_eq!(members(s), before);
        assert_eq!(s.record("o", USER_TAG, "t1").unwrap().name, "one");
        assert!(matches!(s.activity_by_fingerprint("sha256:1"), Err(StoreError::NotFound)));
        // An unknown user after a valid one: nothing applied.
        let err = s.apply(&[update(USER_TAG, "t1", Some("uno"), &["b", "ghost"], &[])]).unwrap_err();
        assert!(matches!(err, StoreError::Conflict(ref m) if m == "user not found: ghost"), "{err:?}");
        assert_eq!(members(s), before);
        assert_eq!(s.record("o", USER_TAG, "t1").unwrap().name, "one");
        // A tag name may repeat across kinds; a missing tag is refused.
        s.apply(&[update(PRIVATE_KEY_TAG, "p1", Some("two"), &["k"], &[])]).unwrap();
        assert_eq!(s.private_key("o", "k").unwrap().tags, vec!["p1".to_string()]);
        assert!(matches!(s.apply(&[update(USER_TAG, "p1", None, &[], &[])]), Err(StoreError::Conflict(_))));
    }

    #[test]
    fn deletes_take_memberships_with_them() {
        let d = db();
        let s = &d.1;
        s.apply(&[update(USER_TAG, "t1", None, &["a", "b"], &[]), update(PRIVATE_KEY_TAG, "p1", None, &["k"], &[])])
            .unwrap();
        // A root quorum member cannot go, and then nothing goes.
        let del = |ids: &[&str]| Write::DeleteUsers {
            organization_id: "o".into(),
            ids: ids.iter().map(|s| s.to_string()).collect(),
        };
        let err = s.apply(&[del(&["a", "root"])]).unwrap_err();
        assert!(matches!(err, StoreError::Conflict(ref m) if m.starts_with("cannot delete a root quorum member")));
        assert_eq!(s.users("o").unwrap().len(), 3);
        s.apply(&[del(&["a"])]).unwrap();
        assert_eq!(members(s), vec![("t1".to_string(), "b".to_string())]);
        let drop_tags = |kind: &str, ids: &[&str]| Write::DeleteTags {
            organization_id: "o".into(),
            kind: kind.into(),
            ids: ids.iter().map(|s| s.to_string()).collect(),
        };
        assert!(matches!(s.apply(&[drop_tags(USER_TAG, &["t1", "nope"])]), Err(StoreError::Conflict(_))));
        assert_eq!(members(s).len(), 1);
        s.apply(&[drop_tags(USER_TAG, &["t1"]), drop_tags(PRIVATE_KEY_TAG, &["p1"])]).unwrap();
        assert!(members(s).is_empty());
        assert!(s.private_key("o", "k").unwrap().tags.is_empty());
        assert!(matches!(s.record("o", USER_TAG, "t1"), Err(StoreError::NotFound)));
    }
}
