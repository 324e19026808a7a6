//! Placeholder: replaced by the projection of writes onto authority effects.

use coffer_authority_state::Change;

use crate::store::Write;

pub fn proposal(_organization_id: &str, _writes: &[Write]) -> Vec<Change> {
    Vec::new()
}
