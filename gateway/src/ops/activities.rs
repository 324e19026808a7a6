//! Who am I, and the activity log.

use serde::Deserialize;
use serde_json::{json, Value};

use super::params::Pagination;
use crate::activity::registry::QueryCtx;
use crate::activity::render;
use crate::error::ApiError;
use crate::store::{ActivityFilter, StoreError};

pub async fn whoami(ctx: QueryCtx, _req: super::params::Empty) -> Result<Value, ApiError> {
    // The caller's own organization: a parent credential reading a sub-org is still itself.
    let org = if ctx.caller.via_parent {
        let id = ctx.caller.credential.organization_id().to_string();
        ctx.state.db(move |s| s.organization(&id)).await??
    } else {
        ctx.org
    };
    Ok(json!({
        "organizationId": org.id,
        "organizationName": org.name,
        "userId": ctx.caller.user.id,
        "username": ctx.caller.user.name,
    }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GetActivityRequest {
    activity_id: String,
}

pub async fn get_activity(ctx: QueryCtx, req: GetActivityRequest) -> Result<Value, ApiError> {
    let (org, id) = (ctx.org.id.clone(), req.activity_id.clone());
    let a = ctx.state.db(move |s| s.activity(&org, &id)).await?.map_err(|e| match e {
        StoreError::NotFound => ApiError::not_found(format!("activity not found: {}", req.activity_id)),
        other => other.into(),
    })?;
    Ok(json!({ "activity": render::activity(&a, ctx.registry.can_vote(&ctx.org, &a, &ctx.caller)) }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListActivitiesRequest {
    #[serde(default)]
    filter_by_status: Vec<String>,
    #[serde(default)]
    filter_by_type: Vec<String>,
    #[serde(default)]
    pagination_options: Pagination,
}

pub async fn list_activities(ctx: QueryCtx, req: ListActivitiesRequest) -> Result<Value, ApiError> {
    let filter = ActivityFilter {
        statuses: req.filter_by_status,
        types: req.filter_by_type,
        limit: req.pagination_options.limit()?,
        before: req.pagination_options.before,
        after: req.pagination_options.after,
    };
    let org = ctx.org.id.clone();
    let items = ctx.state.db(move |s| s.activities(&org, &filter)).await??;
    Ok(
        json!({ "activities": items.iter().map(|a| render::activity(a, ctx.registry.can_vote(&ctx.org, a, &ctx.caller))).collect::<Vec<_>>() }),
    )
}
