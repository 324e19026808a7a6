//! SQLite's connection as a [`Db`]: statements through the connection's prepared-statement cache
//! (preparing cost more than running in the gateway's profile), values and rows as they are.

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, ErrorCode};

use crate::db::{Db, SqlError, SqlRow, UniqueViolation};
use crate::value::{Arg, Value};

/// The driver's error, typed (a tier's code that calls the driver itself maps through this too).
pub fn sqlite_error(e: rusqlite::Error) -> SqlError {
    if let rusqlite::Error::SqliteFailure(f, msg) = &e {
        use rusqlite::ffi::{SQLITE_CONSTRAINT_PRIMARYKEY, SQLITE_CONSTRAINT_UNIQUE};
        if matches!(f.extended_code, SQLITE_CONSTRAINT_UNIQUE | SQLITE_CONSTRAINT_PRIMARYKEY) {
            // SQLite names the constraint's columns only in the message ("UNIQUE constraint failed:
            // records.organization_id, records.kind, records.name"): read here, and nowhere else.
            let message = msg.clone().unwrap_or_default();
            let constraint = message.strip_prefix("UNIQUE constraint failed: ").unwrap_or(&message).to_string();
            return SqlError::Unique(UniqueViolation { constraint, message });
        }
        match f.code {
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => return SqlError::Busy,
            ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase => return SqlError::Corrupt(format!("sqlite: {e}")),
            ErrorCode::ConstraintViolation => return SqlError::Constraint(format!("sqlite: {e}")),
            _ => {}
        }
    }
    match e {
        rusqlite::Error::InvalidColumnType(..) | rusqlite::Error::FromSqlConversionFailure(..) => {
            SqlError::Corrupt(format!("sqlite: {e}"))
        }
        e => SqlError::Backend(format!("sqlite: {e}")),
    }
}

impl rusqlite::ToSql for Arg<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match *self {
            Arg::Null => ValueRef::Null,
            Arg::Int(v) => ValueRef::Integer(v),
            Arg::Text(s) => ValueRef::Text(s.as_bytes()),
            Arg::Bytes(b) => ValueRef::Blob(b),
        }))
    }
}

impl SqlRow for rusqlite::Row<'_> {
    fn value(&self, i: usize) -> Result<Value, SqlError> {
        Ok(match self.get_ref(i).map_err(sqlite_error)? {
            ValueRef::Null => Value::Null,
            ValueRef::Integer(v) => Value::Int(v),
            ValueRef::Real(v) => Value::Int(v as i64),
            ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
            ValueRef::Blob(b) => Value::Bytes(b.to_vec()),
        })
    }
}

impl Db for Connection {
    const BEGIN_WRITE: &'static str = "BEGIN IMMEDIATE";

    fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, SqlError> {
        let mut st = self.prepare_cached(sql).map_err(sqlite_error)?;
        Ok(st.execute(rusqlite::params_from_iter(args)).map_err(sqlite_error)? as u64)
    }

    fn query<T, E: From<SqlError>>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
        mut f: impl FnMut(&dyn SqlRow) -> Result<T, E>,
    ) -> Result<Vec<T>, E> {
        let mut st = self.prepare_cached(sql).map_err(sqlite_error)?;
        let mut rows = st.query(rusqlite::params_from_iter(args)).map_err(sqlite_error)?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(sqlite_error)? {
            out.push(f(row)?);
        }
        Ok(out)
    }

    fn batch(&mut self, sql: &str) -> Result<(), SqlError> {
        self.execute_batch(sql).map_err(sqlite_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args;

    #[test]
    fn errors_are_typed_and_rows_read_back_as_bound() {
        let db = &mut Connection::open_in_memory().unwrap();
        Db::batch(db, "CREATE TABLE t (k TEXT PRIMARY KEY, n INTEGER CHECK (n > 0), b BLOB)").unwrap();
        let insert = "INSERT INTO t VALUES (?1, ?2, ?3)";
        assert_eq!(Db::execute(db, insert, args!["a", 7i64, vec![1u8, 2]]).unwrap(), 1);
        let err = Db::execute(db, insert, args!["a", 8i64, vec![3u8]]).unwrap_err();
        assert!(matches!(&err, SqlError::Unique(u) if u.constraint == "t.k"), "{err:?}");
        let err = Db::execute(db, insert, args!["z", 0i64, vec![3u8]]).unwrap_err();
        assert!(matches!(&err, SqlError::Constraint(m) if m.contains("CHECK")), "{err:?}");
        let row =
            db.query_one("SELECT k, n, b FROM t", &[], |r| Ok::<_, SqlError>((r.text(0)?, r.int(1)?, r.bytes(2)?)));
        assert_eq!(row.unwrap(), ("a".to_string(), 7, vec![1, 2]));
        let none = db.query_one("SELECT k FROM t WHERE k = 'b'", &[], |r| r.text(0));
        assert!(matches!(none, Err(SqlError::NotFound)), "{none:?}");
        let mistyped = db.query_one("SELECT k FROM t", &[], |r| r.int(0));
        assert!(matches!(mistyped, Err(SqlError::Corrupt(_))), "{mistyped:?}");
        let failed: Result<(), SqlError> = Db::transaction(db, |db: &mut Connection| {
            Db::execute(db, "INSERT INTO t VALUES ('c', 1, x'')", &[])?;
            Err(SqlError::Backend("undo".into()))
        });
        assert!(failed.is_err());
        assert!(!db.exists("SELECT 1 FROM t WHERE k = 'c'", &[]).unwrap(), "a failed transaction is rolled back");
        let flag = db.query_one("SELECT EXISTS (SELECT 1 FROM t WHERE k = 'a')", &[], |r| r.flag(0));
        assert!(flag.unwrap());
    }
}
