//! Coffer's gateway: the HTTP API, stamps, activities, records and queries. Holds no secrets.

pub mod activity;
pub mod auth;
pub mod auth_proxy;
pub mod config;
pub mod custody;
pub mod error;
pub mod http;
pub mod limits;
pub mod login_keys;
pub mod metrics;
pub mod ops;
pub mod orgs;
pub mod policy;
pub mod record_kinds;
pub mod serve;
pub mod state;
pub mod store;
pub mod tx_facts;
pub mod webhook_delivery;
pub mod webhook_endpoint;
