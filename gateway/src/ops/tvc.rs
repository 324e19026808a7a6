//! Turnkey Verifiable Cloud apps, operators, operator sets and deployments, recorded: Coffer keeps
//! what clients declare and answers reads of it, but builds, boots and runs no containers.
//!
//! Records: `tvc_app` (name unique per organization), `tvc_operator_set`, `tvc_operator` and
//! `tvc_deployment` (name `<appId>/<nonce>`, so a manifest nonce is unique per app). Apps, sets and
//! operators never change once created; deleting an app deletes its deployments in the same
//! transaction and leaves its operator sets, which other apps may share.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Value};

use super::params::required;
use crate::activity::registry::{Ctx, Outcome, QueryCtx};
use crate::activity::render::timestamp;
use crate::error::ApiError;
use crate::record_kinds::{TVC_APP, TVC_DEPLOYMENT, TVC_OPERATOR, TVC_OPERATOR_SET};
use crate::state::AppState;
use crate::store::{Nanos, Record, StoreError, Write};

const HEALTH_CHECK_TYPES: &[&str] = &["TVC_HEALTH_CHECK_TYPE_HTTP", "TVC_HEALTH_CHECK_TYPE_GRPC"];
/// Longest app, operator set or operator name accepted, in characters.
const MAX_NAME_CHARS: usize = 256;
/// Largest client-supplied QOS manifest accepted, in bytes.
const MAX_MANIFEST_BYTES: usize = 256 * 1024;
/// A QOS `P256Public`: an uncompressed encryption point then an uncompressed signing point.
const QOS_PUBLIC_KEY_BYTES: usize = 130;

fn text(r: &Record, key: &str) -> String {
    r.data.get(key).and_then(Value::as_str).unwrap_or_default().to_string()
}

fn flag(r: &Record, key: &str) -> bool {
    r.data.get(key).and_then(Value::as_bool).unwrap_or(false)
}

fn number(r: &Record, key: &str) -> u64 {
    r.data.get(key).and_then(Value::as_u64).unwrap_or(0)
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .unwrap_or_default()
}

fn name(value: &str, field: &str) -> Result<(), ApiError> {
    required(value, field)?;
    if value.chars().count() > MAX_NAME_CHARS {
        return Err(ApiError::invalid(format!("{field} must be at most {MAX_NAME_CHARS} characters")));
    }
    Ok(())
}

/// Checks a QOS P-256 public key (hex, `0x` optional): 130 bytes, two uncompressed points on the
/// curve. Returns it as lowercase hex without `0x`.
pub fn qos_public_key(value: &str, field: &str) -> Result<String, ApiError> {
    let bad = || {
        ApiError::invalid(format!(
            "invalid {field}: expected the hex of a QOS P-256 public key ({QOS_PUBLIC_KEY_BYTES} bytes: an \
             uncompressed encryption point followed by an uncompressed signing point)"
        ))
    };
    let hex_text = value.strip_prefix("0x").unwrap_or(value);
    let bytes = hex::decode(hex_text).map_err(|_| bad())?;
    if bytes.len() != QOS_PUBLIC_KEY_BYTES {
        return Err(bad());
    }
    for point in bytes.chunks(QOS_PUBLIC_KEY_BYTES / 2) {
        if point[0] != 0x04 || p256::PublicKey::from_sec1_bytes(point).is_err() {
            return Err(bad());
        }
    }
    Ok(hex::encode(bytes))
}

/// A SHA-256 digest as 64 hex characters (`sha256:` optional); returned lowercase without prefix.
fn sha256_digest(value: &str, field: &str) -> Result<String, ApiError> {
    let hex_text = value.strip_prefix("sha256:").unwrap_or(value);
    if hex_text.len() != 64 || !hex_text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::invalid(format!(
            "invalid {field}: expected a SHA-256 digest of the pivot binary (64 hex characters)"
        )));
    }
    Ok(hex_text.to_ascii_lowercase())
}

fn port(value: u32, field: &str) -> Result<u32, ApiError> {
    if !(1..=65_535).contains(&value) {
        return Err(ApiError::invalid(format!("invalid {field}: {value} (a port from 1 to 65535)")));
    }
    Ok(value)
}

fn positive(value: Option<u32>, field: &str) -> Result<Option<u32>, ApiError> {
    match value {
        Some(0) => Err(ApiError::invalid(format!("{field} must be at least 1"))),
        other => Ok(other),
    }
}

async fn load(state: &Arc<AppState>, org: &str, kind: &'static str, id: &str) -> Result<Record, ApiError> {
    let (org, id2) = (org.to_string(), id.to_string());
    state.db(move |s| s.record(&org, kind, &id2)).await?.map_err(|e| match e {
        StoreError::NotFound => ApiError::not_found(format!("{} not found: {id}", kind.replace('_', " "))),
        other => other.into(),
    })
}

async fn records(state: &Arc<AppState>, org: &str, kind: &'static str) -> Result<Vec<Record>, ApiError> {
    let org = org.to_string();
    Ok(state.db(move |s| s.records(&org, kind)).await??)
}

/// The organization's operator sets and operators, by id, for rendering and resolving.
struct Catalog {
    sets: HashMap<String, Record>,
    operators: HashMap<String, Record>,
}

impl Catalog {
    async fn load(state: &Arc<AppState>, org: &str) -> Result<Catalog, ApiError> {
        let org = org.to_string();
        let (sets, operators) = state
            .db(move |s| Ok::<_, StoreError>((s.records(&org, TVC_OPERATOR_SET)?, s.records(&org, TVC_OPERATOR)?)))
            .await??;
        Ok(Catalog {
            sets: sets.into_iter().map(|r| (r.id.clone(), r)).collect(),
            operators: operators.into_iter().map(|r| (r.id.clone(), r)).collect(),
        })
    }

    fn set_json(&self, id: &str) -> Value {
        match self.sets.get(id) {
            Some(set) => operator_set_json(set, &self.operators),
            None => Value::Null,
        }
    }
}

/// The `TvcOperator` object: `publicKey` is the QOS key, `encryptPublicKey` and `signPublicKey`
/// its two halves.
pub fn operator_json(r: &Record) -> Value {
    let key = text(r, "publicKey");
    let (encrypt, sign) = if key.len() == QOS_PUBLIC_KEY_BYTES * 2 { key.split_at(key.len() / 2) } else { ("", "") };
    json!({
        "id": r.id,
        "name": text(r, "name"),
        "publicKey": key,
        "encryptPublicKey": encrypt,
        "signPublicKey": sign,
        "createdAt": timestamp(r.created_at),
        "updatedAt": timestamp(r.updated_at),
    })
}

/// The `TvcOperatorSet` object, with its operators in set order.
fn operator_set_json(set: &Record, operators: &HashMap<String, Record>) -> Value {
    let members: Vec<Value> =
        strings(set.data.get("operatorIds")).iter().filter_map(|id| operators.get(id)).map(operator_json).collect();
    json!({
        "id": set.id,
        "name": text(set, "name"),
        "organizationId": set.organization_id,
        "operators": members,
        "threshold": number(set, "threshold"),
        "createdAt": timestamp(set.created_at),
        "updatedAt": timestamp(set.updated_at),
    })
}

/// The `TvcApp` object. Coffer serves no app, so `publicDomain` is empty and there is no live
/// deployment.
fn app_json(app: &Record, catalog: &Catalog) -> Value {
    json!({
        "id": app.id,
        "organizationId": app.organization_id,
        "name": app.name,
        "quorumPublicKey": text(app, "quorumPublicKey"),
        "manifestSet": catalog.set_json(&text(app, "manifestSetId")),
        "shareSet": catalog.set_json(&text(app, "shareSetId")),
        "enableEgress": flag(app, "enableEgress"),
        "createdAt": timestamp(app.created_at),
        "updatedAt": timestamp(app.updated_at),
        "publicDomain": "",
        "enableDebugModeDeployments": flag(app, "enableDebugModeDeployments"),
        "region": text(app, "region"),
    })
}

/// The `TvcDeployment` object.
fn deployment_json(d: &Record, catalog: &Catalog) -> Value {
    json!({
        "id": d.id,
        "organizationId": d.organization_id,
        "appId": text(d, "appId"),
        "manifestSet": catalog.set_json(&text(d, "manifestSetId")),
        "shareSet": catalog.set_json(&text(d, "shareSetId")),
        "manifest": {
            "id": text(d, "manifestId"),
            "manifest": text(d, "manifest"),
            "createdAt": timestamp(d.created_at),
            "updatedAt": timestamp(d.created_at),
        },
        "manifestApprovals": [],
        "qosVersion": text(d, "qosVersion"),
        "pivotContainer": d.data.get("pivotContainer").cloned().unwrap_or_else(|| json!({})),
        "createdAt": timestamp(d.created_at),
        "updatedAt": timestamp(d.updated_at),
        "delete": false,
        "debugMode": flag(d, "debugMode"),
        "instanceSizeCpus": number(d, "instanceSizeCpus"),
        "instanceSizeRam": number(d, "instanceSizeRam"),
    })
}

/// `TvcOperatorParams`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperatorParams {
    name: String,
    public_key: String,
}

/// `TvcOperatorSetParams`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperatorSetParams {
    name: String,
    #[serde(default)]
    new_operators: Vec<OperatorParams>,
    #[serde(default)]
    existing_operator_ids: Vec<String>,
    #[serde(default)]
    threshold: u32,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateTvcAppIntent {
    name: String,
    quorum_public_key: String,
    manifest_set_id: Option<String>,
    manifest_set_params: Option<OperatorSetParams>,
    share_set_id: Option<String>,
    share_set_params: Option<OperatorSetParams>,
    enable_egress: Option<bool>,
    enable_debug_mode_deployments: Option<bool>,
    region: Option<String>,
}

/// An operator set an app will use: existing, or created by this activity.
struct ResolvedSet {
    id: String,
    operator_ids: Vec<String>,
    threshold: u32,
}

/// Builds the operator sets of one `create_tvc_app`, collecting the records to write.
struct SetBuilder<'a> {
    org: &'a str,
    now: Nanos,
    catalog: &'a Catalog,
    /// Operators created by this activity (id, name) by public key: both sets may name one.
    created: HashMap<String, (String, String)>,
    writes: Vec<Write>,
}

impl SetBuilder<'_> {
    fn resolve(
        &mut self,
        field: &str,
        id: Option<String>,
        params: Option<OperatorSetParams>,
    ) -> Result<ResolvedSet, ApiError> {
        let id = id.filter(|s| !s.trim().is_empty());
        match (id, params) {
            (Some(_), Some(_)) => Err(ApiError::invalid(format!("give either {field}Id or {field}Params, not both"))),
            (None, None) => Err(ApiError::invalid(format!("{field}Id or {field}Params is required"))),
            (Some(id), None) => {
                let set = self
                    .catalog
                    .sets
                    .get(&id)
                    .ok_or_else(|| ApiError::not_found(format!("tvc operator set not found: {id}")))?;
                Ok(ResolvedSet {
                    id,
                    operator_ids: strings(set.data.get("operatorIds")),
                    threshold: number(set, "threshold") as u32,
                })
            }
            (None, Some(p)) => self.create(field, p),
        }
    }

    fn create(&mut self, field: &str, p: OperatorSetParams) -> Result<ResolvedSet, ApiError> {
        let field = format!("{field}Params");
        name(&p.name, &format!("{field}.name"))?;
        let count = p.new_operators.len() + p.existing_operator_ids.len();
        if count == 0 {
            return Err(ApiError::invalid(format!("{field} needs at least one operator")));
        }
        if p.threshold == 0 || p.threshold as usize > count {
            return Err(ApiError::invalid(format!(
                "invalid {field}.threshold: {} (must be from 1 to the number of operators, {count})",
                p.threshold
            )));
        }
        let mut operator_ids = Vec::with_capacity(count);
        let mut keys = BTreeSet::new();
        for (i, op) in p.new_operators.iter().enumerate() {
            name(&op.name, &format!("{field}.newOperators.{i}.name"))?;
            let key = qos_public_key(&op.public_key, &format!("{field}.newOperators.{i}.publicKey"))?;
            if !keys.insert(key.clone()) {
                return Err(ApiError::invalid(format!("duplicate operator public key in {field}.newOperators")));
            }
            let id = match self.created.get(&key) {
                Some((id, first)) if *first == op.name => id.clone(),
                Some((_, first)) => {
                    return Err(ApiError::invalid(format!(
                        "{field}.newOperators.{i} has the public key of new operator {first:?} under another name"
                    )))
                }
                None => {
                    let id = uuid::Uuid::new_v4().to_string();
                    self.created.insert(key.clone(), (id.clone(), op.name.clone()));
                    self.writes.push(Write::PutRecord(Record {
                        organization_id: self.org.to_string(),
                        kind: TVC_OPERATOR.into(),
                        id: id.clone(),
                        name: id.clone(),
                        data: json!({ "name": op.name, "publicKey": key }),
                        created_at: self.now,
                        updated_at: self.now,
                    }));
                    id
                }
            };
            operator_ids.push(id);
        }
        for id in &p.existing_operator_ids {
            if !self.catalog.operators.contains_key(id) {
                return Err(ApiError::not_found(format!("tvc operator not found: {id}")));
            }
            if operator_ids.contains(id) {
                return Err(ApiError::invalid(format!("duplicate operator in {field}.existingOperatorIds: {id}")));
            }
            operator_ids.push(id.clone());
        }
        let id = uuid::Uuid::new_v4().to_string();
        self.writes.push(Write::PutRecord(Record {
            organization_id: self.org.to_string(),
            kind: TVC_OPERATOR_SET.into(),
            id: id.clone(),
            name: id.clone(),
            data: json!({ "name": p.name, "operatorIds": operator_ids, "threshold": p.threshold }),
            created_at: self.now,
            updated_at: self.now,
        }));
        Ok(ResolvedSet { id, operator_ids, threshold: p.threshold })
    }
}

pub async fn create_tvc_app(ctx: Ctx, intent: CreateTvcAppIntent) -> Result<Outcome, ApiError> {
    name(&intent.name, "name")?;
    let quorum_public_key = qos_public_key(&intent.quorum_public_key, "quorumPublicKey")?;
    let catalog = Catalog::load(&ctx.state, &ctx.org.id).await?;
    let mut builder =
        SetBuilder { org: &ctx.org.id, now: ctx.now, catalog: &catalog, created: HashMap::new(), writes: Vec::new() };
    let manifest_set = builder.resolve("manifestSet", intent.manifest_set_id, intent.manifest_set_params)?;
    let share_set = builder.resolve("shareSet", intent.share_set_id, intent.share_set_params)?;
    let unique_message = format!("tvc app name must be unique: {:?}", intent.name);
    if records(&ctx.state, &ctx.org.id, TVC_APP).await?.iter().any(|a| a.name == intent.name) {
        return Err(ApiError::invalid(unique_message));
    }
    let app_id = uuid::Uuid::new_v4().to_string();
    let mut writes = builder.writes;
    writes.push(Write::PutRecordChecked {
        record: Record {
            organization_id: ctx.org.id.clone(),
            kind: TVC_APP.into(),
            id: app_id.clone(),
            name: intent.name.clone(),
            data: json!({
                "quorumPublicKey": quorum_public_key,
                "manifestSetId": manifest_set.id,
                "shareSetId": share_set.id,
                "enableEgress": intent.enable_egress.unwrap_or(false),
                "enableDebugModeDeployments": intent.enable_debug_mode_deployments.unwrap_or(false),
                "region": intent.region.unwrap_or_default(),
            }),
            created_at: ctx.now,
            updated_at: ctx.now,
        },
        unique_message,
        must_exist: false,
    });
    Ok(Outcome {
        result: json!({
            "appId": app_id,
            "manifestSetId": manifest_set.id,
            "manifestSetOperatorIds": manifest_set.operator_ids,
            "manifestSetThreshold": manifest_set.threshold,
            "shareSetId": share_set.id,
            "shareSetOperatorIds": share_set.operator_ids,
            "shareSetThreshold": share_set.threshold,
        }),
        writes,
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateTvcDeploymentIntent {
    app_id: String,
    qos_version: String,
    pivot_container_image_url: String,
    pivot_path: String,
    #[serde(default)]
    pivot_args: Vec<String>,
    expected_pivot_digest: String,
    nonce: Option<u32>,
    pivot_container_encrypted_pull_secret: Option<String>,
    debug_mode: Option<bool>,
    health_check_type: String,
    #[serde(default)]
    health_check_port: u32,
    #[serde(default)]
    public_ingress_port: u32,
    replicas: Option<u32>,
    instance_size_cpus: Option<u32>,
    instance_size_ram: Option<u32>,
    /// Bytes: the Rust client sends an array of numbers, JSON clients a base64 string.
    qos_manifest: Option<Value>,
}

/// Decodes a client-supplied QOS manifest (an array of bytes or a base64 string).
fn manifest_bytes(v: &Value) -> Result<Vec<u8>, ApiError> {
    let bad = |why: &str| ApiError::invalid(format!("invalid qosManifest: {why}"));
    let bytes = match v {
        Value::Array(items) => items
            .iter()
            .map(|b| b.as_u64().filter(|n| *n <= 255).map(|n| n as u8))
            .collect::<Option<Vec<u8>>>()
            .ok_or_else(|| bad("expected bytes (numbers from 0 to 255)"))?,
        Value::String(s) => {
            base64::engine::general_purpose::STANDARD.decode(s).map_err(|_| bad("expected base64 bytes"))?
        }
        _ => return Err(bad("expected bytes")),
    };
    if bytes.is_empty() {
        return Err(bad("empty"));
    }
    if bytes.len() > MAX_MANIFEST_BYTES {
        return Err(bad(&format!("larger than {MAX_MANIFEST_BYTES} bytes")));
    }
    Ok(bytes)
}

/// The QOS-manifest-shaped description Coffer records when the client sends none: namespace,
/// pivot and the two operator sets. No enclave runs it, so it carries no PCRs.
fn describe_manifest(
    app: &Record,
    catalog: &Catalog,
    nonce: u32,
    qos_version: &str,
    digest: &str,
    args: &[String],
) -> Vec<u8> {
    let set = |id: &str| {
        let set = catalog.sets.get(id);
        let members: Vec<Value> = set
            .map(|s| strings(s.data.get("operatorIds")))
            .unwrap_or_default()
            .iter()
            .filter_map(|id| catalog.operators.get(id))
            .map(|op| json!({ "alias": text(op, "name"), "pubKey": text(op, "publicKey") }))
            .collect();
        json!({ "threshold": set.map(|s| number(s, "threshold")).unwrap_or(0), "members": members })
    };
    let manifest = json!({
        "namespace": { "name": app.name, "nonce": nonce, "quorumKey": text(app, "quorumPublicKey") },
        "pivot": { "hash": digest, "args": args },
        "manifestSet": set(&text(app, "manifestSetId")),
        "shareSet": set(&text(app, "shareSetId")),
        "qosVersion": qos_version,
    });
    serde_json::to_vec(&manifest).unwrap_or_default()
}

pub async fn create_tvc_deployment(ctx: Ctx, intent: CreateTvcDeploymentIntent) -> Result<Outcome, ApiError> {
    required(&intent.app_id, "appId")?;
    required(&intent.qos_version, "qosVersion")?;
    required(&intent.pivot_container_image_url, "pivotContainerImageUrl")?;
    required(&intent.pivot_path, "pivotPath")?;
    let digest = sha256_digest(&intent.expected_pivot_digest, "expectedPivotDigest")?;
    if !HEALTH_CHECK_TYPES.contains(&intent.health_check_type.as_str()) {
        return Err(ApiError::invalid(format!(
            "invalid healthCheckType: {:?} ({})",
            intent.health_check_type,
            HEALTH_CHECK_TYPES.join(" or ")
        )));
    }
    let health_check_port = port(intent.health_check_port, "healthCheckPort")?;
    let public_ingress_port = port(intent.public_ingress_port, "publicIngressPort")?;
    let replicas = positive(intent.replicas, "replicas")?;
    let cpus = positive(intent.instance_size_cpus, "instanceSizeCpus")?;
    let ram = positive(intent.instance_size_ram, "instanceSizeRam")?;
    let supplied_manifest = intent.qos_manifest.as_ref().map(manifest_bytes).transpose()?;

    let app = load(&ctx.state, &ctx.org.id, TVC_APP, &intent.app_id).await?;
    let debug_mode = intent.debug_mode.unwrap_or(false);
    if debug_mode && !flag(&app, "enableDebugModeDeployments") {
        return Err(ApiError::invalid(format!(
            "debug-mode deployments are not enabled for tvc app {} (enableDebugModeDeployments)",
            app.id
        )));
    }
    let siblings: Vec<Record> = records(&ctx.state, &ctx.org.id, TVC_DEPLOYMENT)
        .await?
        .into_iter()
        .filter(|d| text(d, "appId") == app.id)
        .collect();
    let nonce = match intent.nonce {
        Some(n) => {
            if siblings.iter().any(|d| number(d, "nonce") == u64::from(n)) {
                return Err(ApiError::invalid(format!(
                    "a deployment with nonce {n} already exists for tvc app {}",
                    app.id
                )));
            }
            n
        }
        // Turnkey's default is the current Unix time in seconds; past any nonce already used.
        None => {
            let now = u32::try_from(ctx.now / 1_000_000_000).unwrap_or(u32::MAX);
            let next = siblings.iter().map(|d| number(d, "nonce")).max().map_or(0, |n| n.saturating_add(1));
            u32::try_from(next).map_or(now, |next| now.max(next))
        }
    };
    let catalog = Catalog::load(&ctx.state, &ctx.org.id).await?;
    let manifest = supplied_manifest
        .unwrap_or_else(|| describe_manifest(&app, &catalog, nonce, &intent.qos_version, &digest, &intent.pivot_args));
    let has_pull_secret = intent.pivot_container_encrypted_pull_secret.is_some_and(|s| !s.trim().is_empty());
    let deployment_id = uuid::Uuid::new_v4().to_string();
    let manifest_id = uuid::Uuid::new_v4().to_string();
    let deployment = Record {
        organization_id: ctx.org.id.clone(),
        kind: TVC_DEPLOYMENT.into(),
        id: deployment_id.clone(),
        name: format!("{}/{nonce}", app.id),
        data: json!({
            "appId": app.id,
            "manifestSetId": text(&app, "manifestSetId"),
            "shareSetId": text(&app, "shareSetId"),
            "qosVersion": intent.qos_version,
            "nonce": nonce,
            "expectedPivotDigest": digest,
            "manifestId": manifest_id,
            "manifest": base64::engine::general_purpose::STANDARD.encode(&manifest),
            "pivotContainer": {
                "containerUrl": intent.pivot_container_image_url,
                "path": intent.pivot_path,
                "args": intent.pivot_args,
                "hasPullSecret": has_pull_secret,
                "healthCheckType": intent.health_check_type,
                "healthCheckPort": health_check_port,
                "publicIngressPort": public_ingress_port,
            },
            "debugMode": debug_mode,
            "replicas": replicas.unwrap_or(1),
            "instanceSizeCpus": cpus.unwrap_or(0),
            "instanceSizeRam": ram.unwrap_or(0),
        }),
        created_at: ctx.now,
        updated_at: ctx.now,
    };
    let app_unique = format!("tvc app name must be unique: {:?}", app.name);
    Ok(Outcome {
        result: json!({ "deploymentId": deployment_id, "manifestId": manifest_id }),
        writes: vec![
            // Rewrites the app unchanged: fails the transaction if a delete of the app committed
            // after it was read (apps never change, so this writes nothing else).
            Write::PutRecordChecked { record: app.clone(), unique_message: app_unique, must_exist: true },
            Write::PutRecordChecked {
                record: deployment,
                unique_message: format!("a deployment with nonce {nonce} already exists for tvc app {}", app.id),
                must_exist: false,
            },
        ],
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteTvcAppAndDeploymentsIntent {
    app_id: String,
}

pub async fn delete_tvc_app_and_deployments(
    ctx: Ctx,
    intent: DeleteTvcAppAndDeploymentsIntent,
) -> Result<Outcome, ApiError> {
    required(&intent.app_id, "appId")?;
    let app = load(&ctx.state, &ctx.org.id, TVC_APP, &intent.app_id).await?;
    let deployment_ids: Vec<String> = records(&ctx.state, &ctx.org.id, TVC_DEPLOYMENT)
        .await?
        .into_iter()
        .filter(|d| text(d, "appId") == app.id)
        .map(|d| d.id)
        .collect();
    Ok(Outcome {
        result: json!({ "appId": app.id }),
        writes: vec![
            // A deployment created after the read above fails the transaction instead of being
            // left behind without its app.
            Write::RequireRecordSet {
                organization_id: ctx.org.id.clone(),
                kind: TVC_DEPLOYMENT.into(),
                key: "appId".into(),
                value: app.id.clone(),
                ids: deployment_ids.clone(),
            },
            Write::DeleteRecords {
                organization_id: ctx.org.id.clone(),
                kind: TVC_DEPLOYMENT.into(),
                ids: deployment_ids,
            },
            Write::DeleteRecords { organization_id: ctx.org.id.clone(), kind: TVC_APP.into(), ids: vec![app.id] },
        ],
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GetTvcAppRequest {
    tvc_app_id: String,
}

pub async fn get_tvc_app(ctx: QueryCtx, req: GetTvcAppRequest) -> Result<Value, ApiError> {
    required(&req.tvc_app_id, "tvcAppId")?;
    let app = load(&ctx.state, &ctx.org.id, TVC_APP, &req.tvc_app_id).await?;
    let catalog = Catalog::load(&ctx.state, &ctx.org.id).await?;
    Ok(json!({ "tvcApp": app_json(&app, &catalog) }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GetTvcAppsRequest {
    is_live: Option<bool>,
}

/// Every app, oldest first. No app has a live deployment in Coffer, so `isLive: true` lists none.
pub async fn list_tvc_apps(ctx: QueryCtx, req: GetTvcAppsRequest) -> Result<Value, ApiError> {
    let apps = if req.is_live == Some(true) { Vec::new() } else { records(&ctx.state, &ctx.org.id, TVC_APP).await? };
    let catalog = Catalog::load(&ctx.state, &ctx.org.id).await?;
    Ok(json!({ "tvcApps": apps.iter().map(|a| app_json(a, &catalog)).collect::<Vec<_>>() }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GetTvcAppDeploymentsRequest {
    app_id: String,
}

/// An app's deployments, oldest first; an unknown app is a 404.
pub async fn list_tvc_app_deployments(ctx: QueryCtx, req: GetTvcAppDeploymentsRequest) -> Result<Value, ApiError> {
    required(&req.app_id, "appId")?;
    let app = load(&ctx.state, &ctx.org.id, TVC_APP, &req.app_id).await?;
    let deployments = records(&ctx.state, &ctx.org.id, TVC_DEPLOYMENT).await?;
    let catalog = Catalog::load(&ctx.state, &ctx.org.id).await?;
    let items: Vec<Value> =
        deployments.iter().filter(|d| text(d, "appId") == app.id).map(|d| deployment_json(d, &catalog)).collect();
    Ok(json!({ "tvcDeployments": items }))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GetTvcDeploymentRequest {
    deployment_id: String,
}

pub async fn get_tvc_deployment(ctx: QueryCtx, req: GetTvcDeploymentRequest) -> Result<Value, ApiError> {
    required(&req.deployment_id, "deploymentId")?;
    let deployment = load(&ctx.state, &ctx.org.id, TVC_DEPLOYMENT, &req.deployment_id).await?;
    let catalog = Catalog::load(&ctx.state, &ctx.org.id).await?;
    Ok(json!({ "tvcDeployment": deployment_json(&deployment, &catalog) }))
}

/// Every operator of the organization, newest first (as the client documents).
pub async fn list_tvc_operators(ctx: QueryCtx, _req: super::params::Empty) -> Result<Value, ApiError> {
    let mut operators = records(&ctx.state, &ctx.org.id, TVC_OPERATOR).await?;
    operators.reverse();
    Ok(json!({ "tvcOperators": operators.iter().map(operator_json).collect::<Vec<_>>() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(seed: u8) -> String {
        let sk = p256::SecretKey::from_slice(&[seed; 32]).unwrap();
        hex::encode(sk.public_key().to_sec1_bytes())
    }

    #[test]
    fn qos_public_keys() {
        let key = format!("{}{}", point(1), point(2));
        assert_eq!(qos_public_key(&key, "k").unwrap(), key);
        assert_eq!(qos_public_key(&format!("0x{}", key.to_uppercase()), "k").unwrap(), key);
        // One point alone.
        assert!(qos_public_key(&point(1), "k").is_err());
        // A half that is not an uncompressed point (tag 02), a point off the curve, not hex.
        assert!(qos_public_key(&format!("02{}", &key[2..]), "k").is_err());
        let mut off = key.clone();
        off.replace_range(128..130, if &key[128..130] == "00" { "01" } else { "00" });
        assert!(qos_public_key(&off, "k").is_err());
        assert!(qos_public_key("zz", "k").is_err());
    }

    /// The delete's precondition: a deployment the handler did not see fails the transaction.
    #[test]
    fn delete_fails_when_a_deployment_appeared_after_the_read() {
        use crate::store::{Organization, SqliteStore, Store};
        let dir = std::env::temp_dir().join(format!("coffer-tvc-{}", uuid::Uuid::new_v4()));
        let store = SqliteStore::open(&dir.join("t.db")).unwrap();
        let org = Organization {
            id: "o1".into(),
            name: "o1".into(),
            parent_id: None,
            root_quorum_threshold: 1,
            root_user_ids: vec![],
            created_at: 1,
            updated_at: 1,
        };
        let record = |kind: &str, id: &str, data: Value| Record {
            organization_id: "o1".into(),
            kind: kind.into(),
            id: id.into(),
            name: id.into(),
            data,
            created_at: 1,
            updated_at: 1,
        };
        store
            .apply(&[
                Write::InsertOrganization(org),
                Write::PutRecord(record(TVC_APP, "a1", json!({}))),
                Write::PutRecord(record(TVC_APP, "a2", json!({}))),
                Write::PutRecord(record(TVC_DEPLOYMENT, "d1", json!({ "appId": "a1" }))),
                Write::PutRecord(record(TVC_DEPLOYMENT, "d2", json!({ "appId": "a1" }))),
                Write::PutRecord(record(TVC_DEPLOYMENT, "d3", json!({ "appId": "a2" }))),
            ])
            .unwrap();
        let delete = |ids: Vec<String>| {
            vec![
                Write::RequireRecordSet {
                    organization_id: "o1".into(),
                    kind: TVC_DEPLOYMENT.into(),
                    key: "appId".into(),
                    value: "a1".into(),
                    ids: ids.clone(),
                },
                Write::DeleteRecords { organization_id: "o1".into(), kind: TVC_DEPLOYMENT.into(), ids },
                Write::DeleteRecords { organization_id: "o1".into(), kind: TVC_APP.into(), ids: vec!["a1".into()] },
            ]
        };
        let err = store.apply(&delete(vec!["d1".into()])).unwrap_err();
        assert!(matches!(err, StoreError::Conflict(ref m) if m.contains("changed")), "{err:?}");
        assert_eq!(store.records("o1", TVC_DEPLOYMENT).unwrap().len(), 3, "nothing deleted");
        assert_eq!(store.records("o1", TVC_APP).unwrap().len(), 2);
        store.apply(&delete(vec!["d2".into(), "d1".into()])).unwrap();
        let left: Vec<String> = store.records("o1", TVC_DEPLOYMENT).unwrap().into_iter().map(|r| r.id).collect();
        assert_eq!(left, vec!["d3"]);
        assert!(matches!(store.record("o1", TVC_APP, "a1"), Err(StoreError::NotFound)));
        drop(store);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn digests_ports_and_manifests() {
        let d = "AB".repeat(32);
        assert_eq!(sha256_digest(&d, "d").unwrap(), "ab".repeat(32));
        assert_eq!(sha256_digest(&format!("sha256:{d}"), "d").unwrap(), "ab".repeat(32));
        assert!(sha256_digest(&"ab".repeat(31), "d").is_err());
        assert!(sha256_digest(&"zz".repeat(32), "d").is_err());
        assert_eq!(port(1, "p").unwrap(), 1);
        assert_eq!(port(65_535, "p").unwrap(), 65_535);
        assert!(port(0, "p").is_err());
        assert!(port(65_536, "p").is_err());
        assert_eq!(manifest_bytes(&json!([1, 2, 255])).unwrap(), vec![1, 2, 255]);
        assert_eq!(manifest_bytes(&json!("AQL/")).unwrap(), vec![1, 2, 255]);
        assert!(manifest_bytes(&json!([256])).is_err());
        assert!(manifest_bytes(&json!([])).is_err());
        assert!(manifest_bytes(&json!("%%")).is_err());
    }
}
