//! Activities: the submission envelope, the operation registry, the pipeline that runs one,
//! and the JSON the clients read back.

pub mod envelope;
pub mod pipeline;
pub mod registry;
pub mod render;
