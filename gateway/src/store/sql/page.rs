//! Keyset pages: the one way the store's lists are read a page at a time.

use super::db::{Arg, Dialect, SqlRow, Value};
use crate::store::error::StoreError;
use crate::store::model::Page;

/// What [`keyset_page`] lists: `cols` of `table` where `scope` holds, in `order`.
pub struct Listing<'a> {
    pub table: &'a str,
    pub cols: &'a str,
    pub scope: &'a str,
    pub args: &'a [&'a str],
    pub order: &'a [&'a str],
}

/// One keyset page of `table`: rows where `scope` holds (its `?`s bound to `args`), ordered by
/// the `order` columns (ending in a unique one), at most `page.limit`, strictly after or before
/// the row whose id is a cursor (a cursor id outside `scope` is ignored). With an index on
/// (scope columns, order columns) a page reads one page of rows, whatever the table holds.
pub fn keyset_page<D: Dialect, T>(
    db: &mut D,
    list: Listing<'_>,
    page: &Page,
    row: impl FnMut(&dyn SqlRow) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    let Listing { table, cols, scope, args, order } = list;
    let keys = order.join(", ");
    let mut cursor = |id: &Option<String>| -> Result<Option<Vec<Value>>, StoreError> {
        let Some(id) = id else { return Ok(None) };
        let sql = format!("SELECT {keys} FROM {table} WHERE {scope} AND id = ?");
        let bound: Vec<Arg<'_>> = args.iter().map(|a| Arg::Text(a)).chain([Arg::Text(id)]).collect();
        Ok(db.query_opt(&sql, &bound, |r| (0..order.len()).map(|i| r.value(i)).collect::<Result<_, _>>())?)
    };
    let (after, before) = (cursor(&page.after)?, cursor(&page.before)?);
    let marks = vec!["?"; order.len()].join(", ");
    let mut sql = format!("SELECT {cols} FROM {table} WHERE {scope}");
    let mut bound: Vec<Arg<'_>> = args.iter().map(|a| Arg::Text(a)).collect();
    if let Some(values) = &after {
        sql.push_str(&format!(" AND ({keys}) > ({marks})"));
        bound.extend(values.iter().map(Value::arg));
    }
    if let Some(values) = &before {
        sql.push_str(&format!(" AND ({keys}) < ({marks})"));
        bound.extend(values.iter().map(Value::arg));
    }
    // Before a cursor: the rows just preceding it, read downwards and turned around.
    let direction = if before.is_some() { "DESC" } else { "ASC" };
    let ordering: Vec<String> = order.iter().map(|k| format!("{k} {direction}")).collect();
    sql.push_str(&format!(" ORDER BY {} LIMIT ?", ordering.join(", ")));
    bound.push(Arg::Int(page.limit.min(i64::MAX as usize) as i64));
    let mut items = db.query(&sql, &bound, row)?;
    if before.is_some() {
        items.reverse();
    }
    Ok(items)
}

/// A list of one organization's rows, oldest first.
pub fn by_organization<'a>(table: &'a str, cols: &'a str, org: &'a [&'a str]) -> Listing<'a> {
    Listing { table, cols, scope: "organization_id = ?", args: org, order: &["created_at", "id"] }
}
