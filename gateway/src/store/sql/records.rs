//! Records: rows without a table of their own (policies, tags, contract interfaces, features, TVC
//! apps, ...), unique by name per organization and kind.

use super::db::{args, json_text, parse_json, unique_as, Dialect, SqlError, SqlRow};
use super::page::{keyset_page, Listing};
use crate::store::error::{Constraint, StoreError, Unique};
use crate::store::model::{Page, Record};

const RECORD_COLS: &str = "organization_id, kind, id, name, data, created_at, updated_at";
fn record_row(r: &dyn SqlRow) -> Result<Record, StoreError> {
    Ok(Record {
        organization_id: r.text(0)?,
        kind: r.text(1)?,
        id: r.text(2)?,
        name: r.text(3)?,
        data: parse_json(r.text(4)?),
        created_at: r.int(5)?,
        updated_at: r.int(6)?,
    })
}

/// Counts a change to `org`'s records of `kind` (`added`: how many more there are now, negative
/// for deletions) in `record_counts`, which [`records_version`] reads.
pub fn counted<D: Dialect>(db: &mut D, org: &str, kind: &str, added: i64) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO record_counts (organization_id, kind, count, version) VALUES (?1, ?2, ?3, 1)
                 ON CONFLICT (organization_id, kind) DO UPDATE
                 SET count = record_counts.count + excluded.count, version = record_counts.version + 1",
        args![org, kind, added],
    )?;
    Ok(())
}

fn exists<D: Dialect>(db: &mut D, r: &Record) -> Result<bool, StoreError> {
    let found = db.query(
        "SELECT 1 FROM records WHERE organization_id = ?1 AND kind = ?2 AND id = ?3",
        args![r.organization_id, r.kind, r.id],
        |row| row.int(0),
    )?;
    Ok(!found.is_empty())
}

pub fn put<D: Dialect>(db: &mut D, r: &Record) -> Result<(), StoreError> {
    let added = if exists(db, r)? { 0 } else { 1 };
    db.execute(
        "INSERT INTO records (organization_id, kind, id, name, data, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT (organization_id, kind, id) DO UPDATE SET name = excluded.name, data = excluded.data, updated_at = excluded.updated_at",
        args![r.organization_id, r.kind, r.id, r.name, json_text(&r.data), r.created_at, r.updated_at],
    )
    .map_err(unique_as(format!("{} name must be unique: {:?}", r.kind, r.name)))?;
    counted(db, &r.organization_id, &r.kind, added)
}

/// See `Write::DeleteRecords`.
pub fn delete<D: Dialect>(db: &mut D, organization_id: &str, kind: &str, ids: &[String]) -> Result<(), StoreError> {
    for id in ids {
        let n = db.execute(
            "DELETE FROM records WHERE organization_id = ?1 AND kind = ?2 AND id = ?3",
            args![organization_id, kind, id],
        )?;
        if n != 1 {
            return Err(StoreError::conflict(format!("{kind} not found: {id}")));
        }
    }
    counted(db, organization_id, kind, -(ids.len() as i64))
}

/// See `Write::PruneRecords`.
pub fn prune<D: Dialect>(db: &mut D, organization_id: &str, kind: &str, created_before: i64) -> Result<(), StoreError> {
    let n = db.execute(
        "DELETE FROM records WHERE organization_id = ?1 AND kind = ?2 AND created_at < ?3",
        args![organization_id, kind, created_before],
    )?;
    if n > 0 {
        counted(db, organization_id, kind, -(n as i64))?;
    }
    Ok(())
}

/// See `Write::PutRecordChecked`.
pub fn put_checked<D: Dialect>(
    db: &mut D,
    r: &Record,
    unique_message: &str,
    must_exist: bool,
) -> Result<(), StoreError> {
    // Update-then-insert rather than ON CONFLICT: scoped to the organization whatever the
    // table's key is, so another organization's record with the same id is never touched.
    let name_taken = |e: SqlError| match StoreError::from(e) {
        StoreError::Unique(u) if u.constraint == Constraint::RecordName => {
            StoreError::Unique(Unique::new(u.constraint, unique_message))
        }
        StoreError::Unique(_) => {
            StoreError::conflict(format!("{} id {} is already in use by another organization", r.kind, r.id))
        }
        other => other,
    };
    let n = db
        .execute(
            "UPDATE records SET name = ?4, data = ?5, updated_at = ?6 WHERE organization_id = ?1 AND kind = ?2 AND id = ?3",
            args![r.organization_id, r.kind, r.id, r.name, json_text(&r.data), r.updated_at],
        )
        .map_err(name_taken)?;
    if n == 0 {
        if must_exist {
            return Err(StoreError::conflict(format!("{} not found: {}", r.kind.replace('_', " "), r.id)));
        }
        db.execute(
            "INSERT INTO records (organization_id, kind, id, name, data, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            args![r.organization_id, r.kind, r.id, r.name, json_text(&r.data), r.created_at, r.updated_at],
        )
        .map_err(name_taken)?;
    }
    counted(db, &r.organization_id, &r.kind, i64::from(n == 0))
}

/// See `Write::RequireRecordSet`.
pub fn require_set<D: Dialect>(
    db: &mut D,
    organization_id: &str,
    kind: &str,
    key: &str,
    value: &str,
    ids: &[String],
) -> Result<(), StoreError> {
    let rows = db.query(
        "SELECT id, data FROM records WHERE organization_id = ?1 AND kind = ?2",
        args![organization_id, kind],
        |r| Ok::<_, StoreError>((r.text(0)?, r.text(1)?)),
    )?;
    let mut found = std::collections::BTreeSet::new();
    for (id, data) in rows {
        let data: serde_json::Value = parse_json(data);
        if data.get(key).and_then(serde_json::Value::as_str) == Some(value) {
            found.insert(id);
        }
    }
    if found != ids.iter().cloned().collect() {
        return Err(StoreError::conflict(format!(
            "{} records changed while this activity ran; retry",
            kind.replace('_', " ")
        )));
    }
    Ok(())
}

pub fn record<D: Dialect>(db: &mut D, org: &str, kind: &str, id: &str) -> Result<Record, StoreError> {
    let sql = format!("SELECT {RECORD_COLS} FROM records WHERE organization_id = ?1 AND kind = ?2 AND id = ?3");
    db.query_one(&sql, args![org, kind, id], record_row)
}

/// The record of `kind` with `id` in whichever organization holds it (ids are UUIDs).
pub fn record_by_id<D: Dialect>(db: &mut D, kind: &str, id: &str) -> Result<Record, StoreError> {
    let sql = format!("SELECT {RECORD_COLS} FROM records WHERE kind = ?1 AND id = ?2");
    db.query_one(&sql, args![kind, id], record_row)
}

/// Every record of `kind` in every organization (at most 100,000; auth proxy configurations).
pub fn records_of_kind<D: Dialect>(db: &mut D, kind: &str) -> Result<Vec<Record>, StoreError> {
    let sql = format!("SELECT {RECORD_COLS} FROM records WHERE kind = ?1 ORDER BY created_at, id LIMIT 100000");
    db.query(&sql, args![kind], record_row)
}

pub fn records_page<D: Dialect>(db: &mut D, org: &str, kind: &str, page: &Page) -> Result<Vec<Record>, StoreError> {
    let list = Listing {
        table: "records",
        cols: RECORD_COLS,
        scope: "organization_id = ? AND kind = ?",
        args: &[org, kind],
        order: &["created_at", "id"],
    };
    keyset_page(db, list, page, record_row)
}

/// How many records of `kind` `org` has, and a version that changes with every write of them
/// (`(0, 0)`: never any). One row read, kept by every write (see [`counted`]).
pub fn records_version<D: Dialect>(db: &mut D, org: &str, kind: &str) -> Result<(i64, i64), StoreError> {
    let rows = db.query(
        "SELECT count, version FROM record_counts WHERE organization_id = ?1 AND kind = ?2",
        args![org, kind],
        |r| Ok::<_, StoreError>((r.int(0)?, r.int(1)?)),
    )?;
    Ok(rows.into_iter().next().unwrap_or((0, 0)))
}
