//! Activities: the submission envelope, the operation registry, the pipeline that runs one,
//! and the JSON the clients read back.

pub mod pipeline;
pub mod registry;
pub mod render;
pub mod submission;

/// Activity statuses and the vote activity types, as the wire names them.
pub const STATUS_COMPLETED: &str = "ACTIVITY_STATUS_COMPLETED";
pub const STATUS_CONSENSUS_NEEDED: &str = "ACTIVITY_STATUS_CONSENSUS_NEEDED";
pub const STATUS_REJECTED: &str = "ACTIVITY_STATUS_REJECTED";
pub const STATUS_FAILED: &str = "ACTIVITY_STATUS_FAILED";
pub const TYPE_APPROVE: &str = "ACTIVITY_TYPE_APPROVE_ACTIVITY";
pub const TYPE_REJECT: &str = "ACTIVITY_TYPE_REJECT_ACTIVITY";
