//! End to end: TVC apps with inline and reused operator sets, deployments, reads, refusals that
//! change nothing, and deleting an app with its deployments, through the official Rust client.

use base64::Engine;
use coffer_tests::{refused, Stack};
use serde_json::Value;
use turnkey_client::generated::external::data::v1::{TvcDeployment, TvcOperator, TvcOperatorSet};
use turnkey_client::generated::immutable::common::v1::TvcHealthCheckType;
use turnkey_client::generated::{
    CreateTvcAppIntent, CreateTvcDeploymentIntent, DeleteTvcAppAndDeploymentsIntent, GetTvcAppDeploymentsRequest,
    GetTvcAppRequest, GetTvcAppsRequest, GetTvcDeploymentRequest, GetTvcOperatorsRequest, TvcOperatorParams,
    TvcOperatorSetParams,
};
use turnkey_client::{TurnkeyClient, TurnkeyP256ApiKey};

type Client = TurnkeyClient<TurnkeyP256ApiKey>;

const UNKNOWN_ID: &str = "00000000-0000-4000-8000-000000000000";

/// An uncompressed P-256 public key, hex.
fn point(seed: u8) -> String {
    let sk = p256::SecretKey::from_slice(&[seed; 32]).unwrap();
    hex::encode(sk.public_key().to_sec1_bytes())
}

/// A QOS P-256 public key: encryption point then signing point (130 bytes), hex.
fn qos_key(seed: u8) -> String {
    format!("{}{}", point(seed), point(seed.wrapping_add(100)))
}

fn operator(name: &str, seed: u8) -> TvcOperatorParams {
    TvcOperatorParams { name: name.into(), public_key: qos_key(seed) }
}

fn set_params(name: &str, new: Vec<TvcOperatorParams>, existing: Vec<String>, threshold: u32) -> TvcOperatorSetParams {
    TvcOperatorSetParams { name: name.into(), new_operators: new, existing_operator_ids: existing, threshold }
}

fn app_intent(name: &str, manifest: TvcOperatorSetParams, share: TvcOperatorSetParams) -> CreateTvcAppIntent {
    CreateTvcAppIntent {
        name: name.into(),
        quorum_public_key: qos_key(9),
        manifest_set_id: None,
        manifest_set_params: Some(manifest),
        share_set_id: None,
        share_set_params: Some(share),
        enable_egress: Some(true),
        enable_debug_mode_deployments: None,
        region: Some("eu-west-1".into()),
    }
}

fn deployment_intent(app_id: &str) -> CreateTvcDeploymentIntent {
    CreateTvcDeploymentIntent {
        app_id: app_id.into(),
        qos_version: "0.5.0".into(),
        pivot_container_image_url: "ghcr.io/acme/pivot:1.2.3".into(),
        pivot_path: "/usr/local/bin/pivot".into(),
        pivot_args: vec!["--port".into(), "3000".into()],
        expected_pivot_digest: "ab".repeat(32),
        nonce: Some(7),
        pivot_container_encrypted_pull_secret: Some("c2VhbGVkIHNlY3JldA==".into()),
        debug_mode: None,
        health_check_type: TvcHealthCheckType::Http,
        health_check_port: 3001,
        public_ingress_port: 3000,
        replicas: Some(2),
        instance_size_cpus: Some(2),
        instance_size_ram: Some(4096),
        qos_manifest: None,
    }
}

/// (name, publicKey) of a set's operators, in set order.
fn members(set: &TvcOperatorSet) -> Vec<(String, String)> {
    set.operators.iter().map(|o| (o.name.clone(), o.public_key.clone())).collect()
}

#[track_caller]
fn check_operator(o: &TvcOperator, name: &str, seed: u8) {
    assert_eq!(o.name, name);
    assert_eq!(o.public_key, qos_key(seed));
    assert_eq!(o.encrypt_public_key, point(seed));
    assert_eq!(o.sign_public_key, point(seed.wrapping_add(100)));
    assert!(o.created_at.is_some() && o.updated_at.is_some());
}

async fn apps(c: &Client, org: &str) -> Vec<String> {
    let r = c.get_tvc_apps(GetTvcAppsRequest { organization_id: org.into(), is_live: None }).await.unwrap();
    r.tvc_apps.into_iter().map(|a| a.name).collect()
}

async fn deployments(c: &Client, org: &str, app_id: &str) -> Vec<TvcDeployment> {
    c.get_tvc_app_deployments(GetTvcAppDeploymentsRequest { organization_id: org.into(), app_id: app_id.into() })
        .await
        .unwrap()
        .tvc_deployments
}

async fn operator_count(c: &Client, org: &str) -> usize {
    c.get_tvc_operators(GetTvcOperatorsRequest { organization_id: org.into() }).await.unwrap().tvc_operators.len()
}

#[tokio::test]
async fn tvc_apps_and_deployments_end_to_end() {
    let stack = Stack::start().await;
    let c = stack.client();
    let org = stack.organization_id.clone();
    let ts = || c.current_timestamp();

    // An app with two inline operator sets sharing operator "bob" (same public key).
    let created = c
        .create_tvc_app(
            org.clone(),
            ts(),
            app_intent(
                "app-one",
                set_params("approvers", vec![operator("alice", 1), operator("bob", 2)], vec![], 2),
                set_params("guardians", vec![operator("bob", 2), operator("carol", 3)], vec![], 1),
            ),
        )
        .await
        .unwrap()
        .result;
    let app_id = created.app_id.clone();
    assert_eq!(created.manifest_set_operator_ids.len(), 2);
    assert_eq!(created.manifest_set_threshold, 2);
    assert_eq!(created.share_set_operator_ids.len(), 2);
    assert_eq!(created.share_set_threshold, 1);
    assert_eq!(created.share_set_operator_ids[0], created.manifest_set_operator_ids[1], "bob is one operator");
    assert_ne!(created.manifest_set_id, created.share_set_id);
    let (alice_id, carol_id) =
        (created.manifest_set_operator_ids[0].clone(), created.share_set_operator_ids[1].clone());

    let app = c
        .get_tvc_app(GetTvcAppRequest { organization_id: org.clone(), tvc_app_id: app_id.clone() })
        .await
        .unwrap()
        .tvc_app
        .unwrap();
    assert_eq!(app.id, app_id);
    assert_eq!(app.organization_id, org);
    assert_eq!(app.name, "app-one");
    assert_eq!(app.quorum_public_key, qos_key(9));
    assert!(app.enable_egress);
    assert!(!app.enable_debug_mode_deployments);
    assert_eq!(app.region, "eu-west-1");
    assert_eq!(app.public_domain, "");
    assert_eq!(app.live_deployment_id, None);
    assert!(app.created_at.is_some() && app.updated_at.is_some());
    let manifest_set = app.manifest_set.clone().unwrap();
    assert_eq!(manifest_set.id, created.manifest_set_id);
    assert_eq!(manifest_set.name, "approvers");
    assert_eq!(manifest_set.organization_id, org);
    assert_eq!(manifest_set.threshold, 2);
    assert_eq!(
        manifest_set.operators.iter().map(|o| o.id.clone()).collect::<Vec<_>>(),
        created.manifest_set_operator_ids
    );
    check_operator(&manifest_set.operators[0], "alice", 1);
    check_operator(&manifest_set.operators[1], "bob", 2);
    let share_set = app.share_set.clone().unwrap();
    assert_eq!(share_set.id, created.share_set_id);
    assert_eq!(share_set.name, "guardians");
    assert_eq!(share_set.threshold, 1);
    check_operator(&share_set.operators[0], "bob", 2);
    check_operator(&share_set.operators[1], "carol", 3);
    assert_eq!(operator_count(&c, &org).await, 3);

    // A second app reusing the manifest set by id and carol by id in a new share set.
    let both = CreateTvcAppIntent {
        manifest_set_id: Some(created.manifest_set_id.clone()),
        ..app_intent(
            "app-two",
            set_params("x", vec![operator("x", 7)], vec![], 1),
            set_params("s", vec![], vec![carol_id.clone()], 1),
        )
    };
    refused(
        c.create_tvc_app(org.clone(), ts(), both).await,
        400,
        "REQUEST_INVALID",
        "either manifestSetId or manifestSetParams",
    );
    let neither = CreateTvcAppIntent {
        share_set_params: None,
        ..app_intent("app-two", set_params("x", vec![operator("x", 7)], vec![], 1), set_params("s", vec![], vec![], 1))
    };
    refused(
        c.create_tvc_app(org.clone(), ts(), neither).await,
        400,
        "REQUEST_INVALID",
        "shareSetId or shareSetParams is required",
    );
    let second = c
        .create_tvc_app(
            org.clone(),
            ts(),
            CreateTvcAppIntent {
                manifest_set_id: Some(created.manifest_set_id.clone()),
                manifest_set_params: None,
                enable_egress: None,
                enable_debug_mode_deployments: Some(true),
                region: None,
                ..app_intent(
                    "app-two",
                    set_params("unused", vec![], vec![], 1),
                    set_params("solo", vec![], vec![carol_id.clone()], 1),
                )
            },
        )
        .await
        .unwrap()
        .result;
    assert_eq!(second.manifest_set_id, created.manifest_set_id);
    assert_eq!(second.manifest_set_operator_ids, created.manifest_set_operator_ids);
    assert_eq!(second.manifest_set_threshold, 2);
    assert_eq!(second.share_set_operator_ids, vec![carol_id.clone()]);
    assert_eq!(second.share_set_threshold, 1);
    let app_two = c
        .get_tvc_app(GetTvcAppRequest { organization_id: org.clone(), tvc_app_id: second.app_id.clone() })
        .await
        .unwrap()
        .tvc_app
        .unwrap();
    assert!(!app_two.enable_egress);
    assert!(app_two.enable_debug_mode_deployments);
    assert_eq!(app_two.region, "");
    assert_eq!(members(app_two.share_set.as_ref().unwrap()), vec![("carol".to_string(), qos_key(3))]);
    assert_eq!(operator_count(&c, &org).await, 3, "no operator is created for existing ids");
    assert_eq!(apps(&c, &org).await, vec!["app-one", "app-two"]);
    let live = c.get_tvc_apps(GetTvcAppsRequest { organization_id: org.clone(), is_live: Some(true) }).await.unwrap();
    assert!(live.tvc_apps.is_empty(), "Coffer runs no deployment, so no app is live");

    // Two deployments of app-one: one described by Coffer, one with a client manifest.
    let d1 = c.create_tvc_deployment(org.clone(), ts(), deployment_intent(&app_id)).await.unwrap().result;
    let d2 = c
        .create_tvc_deployment(
            org.clone(),
            ts(),
            CreateTvcDeploymentIntent {
                nonce: None,
                pivot_args: vec![],
                pivot_container_encrypted_pull_secret: None,
                health_check_type: TvcHealthCheckType::Grpc,
                health_check_port: 50051,
                public_ingress_port: 443,
                replicas: None,
                instance_size_cpus: None,
                instance_size_ram: None,
                qos_manifest: Some(b"{\"client\":\"manifest\"}".to_vec()),
                ..deployment_intent(&app_id)
            },
        )
        .await
        .unwrap()
        .result;
    assert_ne!(d1.deployment_id, d2.deployment_id);
    assert_ne!(d1.manifest_id, d2.manifest_id);

    let got = c
        .get_tvc_deployment(GetTvcDeploymentRequest {
            organization_id: org.clone(),
            deployment_id: d1.deployment_id.clone(),
        })
        .await
        .unwrap()
        .tvc_deployment
        .unwrap();
    assert_eq!(got.id, d1.deployment_id);
    assert_eq!(got.organization_id, org);
    assert_eq!(got.app_id, app_id);
    assert_eq!(got.qos_version, "0.5.0");
    assert!(!got.delete);
    assert!(!got.debug_mode);
    assert_eq!((got.instance_size_cpus, got.instance_size_ram), (2, 4096));
    assert!(got.manifest_approvals.is_empty());
    assert_eq!(got.manifest_set.as_ref().unwrap().id, created.manifest_set_id);
    assert_eq!(got.share_set.as_ref().unwrap().id, created.share_set_id);
    let pivot = got.pivot_container.clone().unwrap();
    assert_eq!(pivot.container_url, "ghcr.io/acme/pivot:1.2.3");
    assert_eq!(pivot.path, "/usr/local/bin/pivot");
    assert_eq!(pivot.args, vec!["--port", "3000"]);
    assert!(pivot.has_pull_secret);
    assert_eq!(pivot.health_check_type, TvcHealthCheckType::Http);
    assert_eq!((pivot.health_check_port, pivot.public_ingress_port), (3001, 3000));
    let manifest = got.manifest.clone().unwrap();
    assert_eq!(manifest.id, d1.manifest_id);
    let described: Value = serde_json::from_slice(&manifest.manifest).unwrap();
    assert_eq!(described["namespace"]["name"], "app-one");
    assert_eq!(described["namespace"]["nonce"], 7);
    assert_eq!(described["namespace"]["quorumKey"], qos_key(9));
    assert_eq!(described["pivot"]["hash"], "ab".repeat(32));
    assert_eq!(described["manifestSet"]["threshold"], 2);
    assert_eq!(described["manifestSet"]["members"][0]["pubKey"], qos_key(1));
    assert_eq!(described["shareSet"]["members"][1]["alias"], "carol");

    let listed = deployments(&c, &org, &app_id).await;
    assert_eq!(
        listed.iter().map(|d| d.id.clone()).collect::<Vec<_>>(),
        vec![d1.deployment_id.clone(), d2.deployment_id.clone()]
    );
    assert_eq!(listed[0], got);
    let second_deployment = &listed[1];
    assert_eq!(second_deployment.manifest.as_ref().unwrap().manifest, b"{\"client\":\"manifest\"}".to_vec());
    let pivot = second_deployment.pivot_container.as_ref().unwrap();
    assert!(pivot.args.is_empty());
    assert!(!pivot.has_pull_secret);
    assert_eq!(pivot.health_check_type, TvcHealthCheckType::Grpc);
    assert_eq!((pivot.health_check_port, pivot.public_ingress_port), (50051, 443));
    assert_eq!((second_deployment.instance_size_cpus, second_deployment.instance_size_ram), (0, 0));
    assert!(deployments(&c, &org, &second.app_id).await.is_empty());

    // Refusals: each changes nothing.
    refused(
        c.create_tvc_deployment(org.clone(), ts(), deployment_intent(UNKNOWN_ID)).await,
        404,
        "REQUEST_INVALID",
        "tvc app not found",
    );
    for (hc, ingress, field) in
        [(3001, 0, "publicIngressPort"), (3001, 65_536, "publicIngressPort"), (0, 80, "healthCheckPort")]
    {
        let bad = CreateTvcDeploymentIntent {
            nonce: Some(8),
            health_check_port: hc,
            public_ingress_port: ingress,
            ..deployment_intent(&app_id)
        };
        refused(c.create_tvc_deployment(org.clone(), ts(), bad).await, 400, "REQUEST_INVALID", field);
    }
    refused(
        c.create_tvc_deployment(org.clone(), ts(), deployment_intent(&app_id)).await,
        400,
        "REQUEST_INVALID",
        "nonce 7 already exists",
    );
    let bad_digest =
        CreateTvcDeploymentIntent { nonce: Some(8), expected_pivot_digest: "abc".into(), ..deployment_intent(&app_id) };
    refused(
        c.create_tvc_deployment(org.clone(), ts(), bad_digest).await,
        400,
        "REQUEST_INVALID",
        "expectedPivotDigest",
    );
    let debug = CreateTvcDeploymentIntent { nonce: Some(8), debug_mode: Some(true), ..deployment_intent(&app_id) };
    refused(
        c.create_tvc_deployment(org.clone(), ts(), debug).await,
        400,
        "REQUEST_INVALID",
        "debug-mode deployments are not enabled",
    );
    let unspecified = CreateTvcDeploymentIntent {
        nonce: Some(8),
        health_check_type: TvcHealthCheckType::Unspecified,
        ..deployment_intent(&app_id)
    };
    refused(c.create_tvc_deployment(org.clone(), ts(), unspecified).await, 400, "REQUEST_INVALID", "healthCheckType");

    let ops = || vec![operator("dave", 4), operator("erin", 5)];
    for threshold in [0, 3] {
        let bad = app_intent("app-three", set_params("m", ops(), vec![], threshold), set_params("s", ops(), vec![], 1));
        refused(c.create_tvc_app(org.clone(), ts(), bad).await, 400, "REQUEST_INVALID", "manifestSetParams.threshold");
    }
    let bad = app_intent("app-three", set_params("m", ops(), vec![], 1), set_params("s", vec![], vec![], 1));
    refused(
        c.create_tvc_app(org.clone(), ts(), bad).await,
        400,
        "REQUEST_INVALID",
        "shareSetParams needs at least one operator",
    );
    let duplicate = app_intent("app-one", set_params("m", ops(), vec![], 1), set_params("s", ops(), vec![], 1));
    refused(
        c.create_tvc_app(org.clone(), ts(), duplicate).await,
        400,
        "REQUEST_INVALID",
        "tvc app name must be unique",
    );
    let bad_key = CreateTvcAppIntent {
        quorum_public_key: point(9),
        ..app_intent("app-three", set_params("m", ops(), vec![], 1), set_params("s", ops(), vec![], 1))
    };
    refused(c.create_tvc_app(org.clone(), ts(), bad_key).await, 400, "REQUEST_INVALID", "invalid quorumPublicKey");
    let bad_operator = app_intent(
        "app-three",
        set_params("m", vec![TvcOperatorParams { name: "x".into(), public_key: "04abcd".into() }], vec![], 1),
        set_params("s", ops(), vec![], 1),
    );
    refused(
        c.create_tvc_app(org.clone(), ts(), bad_operator).await,
        400,
        "REQUEST_INVALID",
        "manifestSetParams.newOperators.0.publicKey",
    );
    let unknown_set = CreateTvcAppIntent {
        share_set_id: Some(UNKNOWN_ID.into()),
        share_set_params: None,
        ..app_intent("app-three", set_params("m", ops(), vec![], 1), set_params("s", ops(), vec![], 1))
    };
    refused(
        c.create_tvc_app(org.clone(), ts(), unknown_set).await,
        404,
        "REQUEST_INVALID",
        "tvc operator set not found",
    );
    let unknown_operator =
        app_intent("app-three", set_params("m", ops(), vec![UNKNOWN_ID.into()], 1), set_params("s", ops(), vec![], 1));
    refused(
        c.create_tvc_app(org.clone(), ts(), unknown_operator).await,
        404,
        "REQUEST_INVALID",
        "tvc operator not found",
    );
    let twice = app_intent(
        "app-three",
        set_params("m", vec![], vec![alice_id.clone(), alice_id.clone()], 1),
        set_params("s", ops(), vec![], 1),
    );
    refused(c.create_tvc_app(org.clone(), ts(), twice).await, 400, "REQUEST_INVALID", "duplicate operator");
    let renamed = app_intent(
        "app-three",
        set_params("m", ops(), vec![], 1),
        set_params("s", vec![operator("mallory", 4)], vec![], 1),
    );
    refused(c.create_tvc_app(org.clone(), ts(), renamed).await, 400, "REQUEST_INVALID", "under another name");

    assert_eq!(apps(&c, &org).await, vec!["app-one", "app-two"]);
    assert_eq!(deployments(&c, &org, &app_id).await, listed);
    assert_eq!(operator_count(&c, &org).await, 3);

    // Deleting app-one removes it and both deployments; app-two keeps the shared sets.
    let deleted = c
        .delete_tvc_app_and_deployments(org.clone(), ts(), DeleteTvcAppAndDeploymentsIntent { app_id: app_id.clone() })
        .await
        .unwrap()
        .result;
    assert_eq!(deleted.app_id, app_id);
    refused(
        c.get_tvc_app(GetTvcAppRequest { organization_id: org.clone(), tvc_app_id: app_id.clone() }).await,
        404,
        "REQUEST_INVALID",
        "tvc app not found",
    );
    for d in [&d1.deployment_id, &d2.deployment_id] {
        refused(
            c.get_tvc_deployment(GetTvcDeploymentRequest { organization_id: org.clone(), deployment_id: d.clone() })
                .await,
            404,
            "REQUEST_INVALID",
            "tvc deployment not found",
        );
    }
    refused(
        c.get_tvc_app_deployments(GetTvcAppDeploymentsRequest { organization_id: org.clone(), app_id: app_id.clone() })
            .await,
        404,
        "REQUEST_INVALID",
        "tvc app not found",
    );
    refused(
        c.delete_tvc_app_and_deployments(
            org.clone(),
            ts(),
            DeleteTvcAppAndDeploymentsIntent { app_id: app_id.clone() },
        )
        .await,
        404,
        "REQUEST_INVALID",
        "tvc app not found",
    );
    assert_eq!(apps(&c, &org).await, vec!["app-two"]);
    let app_two_after = c
        .get_tvc_app(GetTvcAppRequest { organization_id: org.clone(), tvc_app_id: second.app_id.clone() })
        .await
        .unwrap()
        .tvc_app
        .unwrap();
    assert_eq!(app_two_after, app_two);
    assert_eq!(operator_count(&c, &org).await, 3);

    // The name is free again once its app is gone; deleting the last app empties the list.
    let again = app_intent("app-one", set_params("m", vec![], vec![alice_id], 1), set_params("s", ops(), vec![], 2));
    let again = c.create_tvc_app(org.clone(), ts(), again).await.unwrap().result;
    assert_eq!(apps(&c, &org).await, vec!["app-two", "app-one"]);
    for id in [second.app_id, again.app_id] {
        c.delete_tvc_app_and_deployments(org.clone(), ts(), DeleteTvcAppAndDeploymentsIntent { app_id: id })
            .await
            .unwrap();
    }
    assert!(apps(&c, &org).await.is_empty());
}

/// A JSON client sends `qosManifest` as base64; the Rust client as an array of bytes (above).
#[tokio::test]
async fn tvc_deployment_manifest_as_base64_over_raw_http() {
    let stack = Stack::start().await;
    let c = stack.client();
    let org = stack.organization_id.clone();
    let app = c
        .create_tvc_app(
            org.clone(),
            c.current_timestamp(),
            app_intent(
                "raw",
                set_params("m", vec![operator("a", 1)], vec![], 1),
                set_params("s", vec![operator("b", 2)], vec![], 1),
            ),
        )
        .await
        .unwrap()
        .result;
    let manifest = b"qos manifest bytes".to_vec();
    let body = serde_json::json!({
        "type": "ACTIVITY_TYPE_CREATE_TVC_DEPLOYMENT",
        "timestampMs": Stack::now_ms().to_string(),
        "organizationId": org,
        "parameters": {
            "appId": app.app_id,
            "qosVersion": "0.5.0",
            "pivotContainerImageUrl": "ghcr.io/acme/pivot:1",
            "pivotPath": "/pivot",
            "pivotArgs": [],
            "expectedPivotDigest": format!("sha256:{}", "CD".repeat(32)),
            "healthCheckType": "TVC_HEALTH_CHECK_TYPE_HTTP",
            "healthCheckPort": 8080,
            "publicIngressPort": 8443,
            "qosManifest": base64::engine::general_purpose::STANDARD.encode(&manifest),
        },
    });
    let body = serde_json::to_vec(&body).unwrap();
    let r = stack.post_raw("/public/v1/submit/create_tvc_deployment", &body, Some(&stack.api_key())).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let result = &r.json["activity"]["result"]["createTvcDeploymentResult"];
    let deployment_id = result["deploymentId"].as_str().unwrap().to_string();
    let got = c
        .get_tvc_deployment(GetTvcDeploymentRequest { organization_id: org.clone(), deployment_id })
        .await
        .unwrap()
        .tvc_deployment
        .unwrap();
    let m = got.manifest.unwrap();
    assert_eq!(m.id, result["manifestId"].as_str().unwrap());
    assert_eq!(m.manifest, manifest);

    // Not base64, and a port past u32 in raw JSON: both 400 with nothing recorded.
    for (key, value) in [("qosManifest", serde_json::json!("%%%")), ("publicIngressPort", serde_json::json!(-1))] {
        let mut bad: Value = serde_json::from_slice(&body).unwrap();
        bad["parameters"][key] = value;
        bad["parameters"]["nonce"] = serde_json::json!(99);
        let r = stack
            .post_raw(
                "/public/v1/submit/create_tvc_deployment",
                &serde_json::to_vec(&bad).unwrap(),
                Some(&stack.api_key()),
            )
            .await;
        assert_eq!(r.status, 400, "{}", r.text);
        let message = r.json["message"].as_str().unwrap();
        assert!(message.contains(key) || message.starts_with("invalid parameters"), "{}", r.text);
    }
    assert_eq!(deployments(&c, &org, &app.app_id).await.len(), 1);
}
