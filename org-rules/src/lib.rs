//! An organization's authority state — everything the enclave's decisions read — with the pure
//! transitions activities apply to it ([`transition`]) and the decision over it ([`decide`]).

pub mod decide;
pub mod effect;
pub mod facts;
pub mod fields;
pub mod limits;
pub mod model;
pub mod subjects;
pub mod transition;

pub use effect::{Change, Effect};
pub use limits::{Limit, LimitExceeded, Limits};
pub use model::{Credential, CredentialKind, OrgState, Organization, User};
