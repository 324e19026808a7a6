//! The one joined read a stamped request starts with: organization, API key, user and flags.

use super::credentials::{api_key_row, API_KEY_COLS};
use super::db::{args, Dialect, SqlRow, Value};
use super::organizations::{org_row, ORG_COLS};
use super::users::{user_row, USER_COLS};
use crate::store::error::StoreError;
use crate::store::model::StampContext;

/// The columns of a row from `offset` on, read as a row of their own (a joined statement reads
/// several records from one row).
struct Shifted<'a> {
    row: &'a dyn SqlRow,
    offset: usize,
}

impl SqlRow for Shifted<'_> {
    fn value(&self, i: usize) -> Result<Value, super::db::SqlError> {
        self.row.value(self.offset + i)
    }
}

/// `cols` of the table `alias` names.
fn qualified(alias: &str, cols: &str) -> String {
    cols.split(", ").map(|c| format!("{alias}.{c}")).collect::<Vec<_>>().join(", ")
}

/// See `Store::stamp_context`. The organization's own key sorts before its parent's.
pub fn stamp_context<D: Dialect>(
    db: &mut D,
    org: &str,
    public_key: &str,
    fingerprint: Option<&str>,
    record_kind: &str,
) -> Result<StampContext, StoreError> {
    // The statement, and where the key's and the user's columns start and the flags follow.
    static SQL: std::sync::LazyLock<(String, usize, usize, usize)> = std::sync::LazyLock::new(|| {
        let count = |cols: &str| cols.split(',').count();
        let key_at = count(ORG_COLS);
        let user_at = key_at + count(API_KEY_COLS);
        let statement = format!(
            "SELECT {}, {}, {},
                k.organization_id <> o.id AS via_parent,
                EXISTS (SELECT 1 FROM activities a WHERE a.fingerprint = ?3),
                EXISTS (SELECT 1 FROM records r WHERE r.kind = ?4 AND (r.organization_id = o.id OR r.organization_id = o.parent_id))
             FROM organizations o
             JOIN api_keys k ON k.public_key = ?2 AND (k.organization_id = o.id OR k.organization_id = o.parent_id)
             LEFT JOIN users u ON u.organization_id = k.organization_id AND u.id = k.user_id
             WHERE o.id = ?1 AND o.deleted_at IS NULL
             ORDER BY via_parent LIMIT 1",
            qualified("o", ORG_COLS),
            qualified("k", API_KEY_COLS),
            qualified("u", USER_COLS)
        );
        (statement, key_at, user_at, user_at + count(USER_COLS))
    });
    let (sql, key_at, user_at, flags) = (&SQL.0, SQL.1, SQL.2, SQL.3);
    db.query_one(sql, args![org, public_key, fingerprint, record_kind], |r| {
        let user = match r.value(user_at)? {
            Value::Null => None,
            _ => Some(user_row(&Shifted { row: r, offset: user_at })?),
        };
        Ok(StampContext {
            organization: org_row(r)?,
            api_key: api_key_row(&Shifted { row: r, offset: key_at })?,
            user,
            via_parent: r.int(flags)? != 0,
            fingerprint_taken: r.int(flags + 1)? != 0,
            has_records_of_kind: r.int(flags + 2)? != 0,
        })
    })
}
