//! What many requests share: pagination, required fields, free names, ids without repeats, and
//! the empty request.

use std::collections::HashSet;

use serde::Deserialize;

use crate::error::ApiError;
use crate::store::Page;

/// `paginationOptions`: `limit` is a string "1".."100" (default 10); `before`/`after` are ids.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pagination {
    pub limit: Option<String>,
    pub before: Option<String>,
    pub after: Option<String>,
}

impl Pagination {
    /// The page size of the lists the SDK pages (default 10, at most 100).
    pub fn limit(&self) -> Result<usize, ApiError> {
        self.limit_within(10, 100)
    }

    fn limit_within(&self, default: usize, max: usize) -> Result<usize, ApiError> {
        match self.limit.as_deref().map(str::trim) {
            // The Rust client's default Pagination sends "" for an unset limit.
            None | Some("") => Ok(default),
            Some(s) => match s.parse::<usize>() {
                Ok(n) if (1..=max).contains(&n) => Ok(n),
                _ => Err(ApiError::invalid(format!(
                    "invalid pagination limit: must be a string from \"1\" to \"{max}\""
                ))),
            },
        }
    }

    /// The store page of a list the SDK pages.
    pub fn page(&self) -> Result<Page, ApiError> {
        Ok(Page { limit: self.limit()?, before: self.before.clone(), after: self.after.clone() })
    }
}

/// Most items a list the SDK does not page answers at once (see [`ListRequest`]).
pub const LIST_PAGE_MAX: usize = 1000;

/// The request of a list the SDK sends without paging (`list_wallets`, `list_users`,
/// `list_policies`, …). Coffer takes `paginationOptions` there too; without them a list answers
/// its first [`LIST_PAGE_MAX`] items, oldest first, so no request reads a whole organization.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListRequest {
    #[serde(default)]
    pub pagination_options: Pagination,
}

impl ListRequest {
    pub fn page(&self) -> Result<Page, ApiError> {
        let p = &self.pagination_options;
        Ok(Page {
            limit: p.limit_within(LIST_PAGE_MAX, LIST_PAGE_MAX)?,
            before: p.before.clone(),
            after: p.after.clone(),
        })
    }
}

/// 400 when a wallet or private key of the organization already has one of `names` (the store's
/// unique constraint stays the last word; this gives the caller the clear message first).
pub async fn ensure_names_free(
    state: &std::sync::Arc<crate::state::AppState>,
    org: &str,
    kind: crate::store::Named,
    names: &[&str],
) -> Result<(), ApiError> {
    let taken = state.db(|s| s.names_in_use(org, kind, names)).await??;
    match taken.first() {
        None => Ok(()),
        Some(name) => Err(ApiError::invalid(match kind {
            crate::store::Named::Wallet => format!("wallet name must be unique: {name:?}"),
            crate::store::Named::PrivateKey => format!("private key name must be unique: {name:?}"),
        })),
    }
}

/// Fails with 400 when a string field that must be present is empty.
pub fn required(value: &str, field: &str) -> Result<(), ApiError> {
    if value.trim().is_empty() {
        return Err(ApiError::invalid(format!("{field} is required")));
    }
    Ok(())
}

/// Keeps the first occurrence of each id.
pub fn dedup(ids: &[String]) -> Vec<String> {
    let mut seen = HashSet::new();
    ids.iter().filter(|id| seen.insert(id.as_str())).cloned().collect()
}

/// A request without parameters.
#[derive(Deserialize)]
pub struct Empty {}

/// The id of the `n`th credential of `kind` the stamped body (`fingerprint`) lists for `user_id`:
/// derived from the body, as the enclave derives it for its state.
pub fn credential_id(
    fingerprint: &str,
    kind: coffer_org_rules::model::CredentialKind,
    user_id: &str,
    n: usize,
) -> String {
    coffer_auth::envelope::derived_id(fingerprint, &coffer_org_rules::transition::credential_id_label(kind, user_id), n)
}
