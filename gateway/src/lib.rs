//! Coffer's gateway: the HTTP API, stamps, activities, records and queries. Holds no secrets.

pub mod activity;
pub mod activity_log;
pub mod auth_proxy;
pub mod authority_proposal;
pub mod config;
pub mod custody;
pub mod error;
pub mod evaluation_share;
pub mod http;
pub mod limits;
pub mod login_public_keys;
pub mod metrics;
pub mod oidc_tokens;
pub mod operator_key;
pub mod ops;
pub mod orgs;
pub mod record_kinds;
pub mod serve;
pub mod stamps;
pub mod state;
pub mod state_diff;
pub mod state_rebuild;
pub mod store;
pub mod webhook_delivery;
pub mod webhook_endpoint;
