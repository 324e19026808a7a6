//! The configuration tables of `docs/configuration.md` (key, environment variable, default), and
//! the check each binary's tests run of its table against its configuration code.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::environment::{read_by, Reader};

/// How a test reads the process's configuration with the environment it is given (no file),
/// answering it as JSON, or the error the process would stop with.
pub type LoadWith<'a> = &'a dyn Fn(&dyn Fn(&str) -> Option<String>) -> Result<Value, String>;

/// What the check needs besides the documentation and the code.
pub struct Exceptions<'a> {
    /// Variables that take effect only with others set (mutual TLS files go together; enclave URLs
    /// need them): each with the other variables and values it is tried with.
    pub with: &'a [(&'a str, &'a [(&'a str, &'a str)])],
    /// Variables whose only value other than the default is refused at start, with their key.
    pub refused_otherwise: &'a [(&'a str, &'a str)],
}

/// Values a variable is tried with, in order, until the process takes one: the first that changes
/// a key to (or to a list holding) that value names the variable's key.
const SAMPLES: &[&str] = &[
    "7",
    "127.0.0.9:19",
    "/sample/path",
    "https://issuer.example",
    "smtp://127.0.0.1:25",
    "coffer@example.com",
    "generic",
    "true",
    "10.0.0.0/8",
];

/// One row of a key table: the key (`table.key` inside a table), its variables (", " between
/// them), its default as the documentation writes it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Row {
    pub key: String,
    pub variable: Option<String>,
    pub default: String,
}

/// The leaves of a configuration as JSON, by dotted key (lists are leaves).
fn leaves(value: &Value, prefix: &str, out: &mut BTreeMap<String, Value>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                leaves(v, &key, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.clone());
        }
    }
}

/// A default as the tables write it: TOML-like, `none` for an unset optional value.
pub fn rendered(value: &Value) -> String {
    match value {
        Value::Null => "none".into(),
        other => other.to_string(),
    }
}

/// Whether `value` is what setting `sample` made it.
fn reflects(value: &Value, sample: &str) -> bool {
    match value {
        Value::String(s) => s == sample,
        Value::Number(n) => n.to_string() == sample,
        Value::Bool(b) => b.to_string() == sample,
        Value::Array(items) => items.iter().any(|i| reflects(i, sample)),
        _ => false,
    }
}

/// The rows of the table under the heading `section` (a `## ` heading of `doc`), and the
/// variables of its "set no key" table (the first column of each row of the second table).
pub fn documented(doc: &str, section: &str) -> (Vec<Row>, BTreeSet<String>) {
    let body = doc.split(&format!("\n## {section}\n")).nth(1).unwrap_or_default();
    let body = body.split("\n## ").next().unwrap_or_default();
    let cell = |c: &str| c.trim().replace('`', "");
    let (mut rows, mut no_key) = (Vec::new(), BTreeSet::new());
    let mut table = 0;
    let mut in_table = false;
    for line in body.lines() {
        let line = line.trim();
        if !line.starts_with('|') {
            in_table = false;
            continue;
        }
        if !in_table {
            in_table = true;
            table += 1;
            continue; // the header
        }
        if line.starts_with("|---") {
            continue;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').collect();
        match (table, cells.as_slice()) {
            (1, [key, variable, default, ..]) => rows.push(Row {
                key: cell(key),
                variable: Some(cell(variable)).filter(|v| v.starts_with("COFFER_")),
                default: cell(default),
            }),
            (2, [variable, ..]) => {
                no_key.insert(cell(variable));
            }
            _ => {}
        }
    }
    (rows, no_key)
}

/// The table the code says: every key of `defaults` (an optional table left unset shows as its
/// own key), the variable that sets it, its default; and the variables of `reader` that set no
/// key. Each variable's key is found by setting it (with [`Exceptions::with`]) to a sample value
/// the process takes and seeing which key then holds that value.
pub fn derived(
    defaults: &Value,
    reader: Reader,
    load: LoadWith<'_>,
    exceptions: &Exceptions<'_>,
) -> (Vec<Row>, BTreeSet<String>) {
    let mut default_leaves = BTreeMap::new();
    leaves(defaults, "", &mut default_leaves);
    let mut key_of: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut no_key = BTreeSet::new();
    for variable in read_by(reader) {
        let with: &[(&str, &str)] = exceptions.with.iter().find(|(v, _)| *v == variable).map_or(&[], |(_, w)| w);
        let found = SAMPLES.iter().find_map(|sample| {
            let env = |name: &str| {
                if name == variable {
                    Some(sample.to_string())
                } else {
                    with.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string())
                }
            };
            let loaded = load(&env).ok()?;
            let mut now = BTreeMap::new();
            leaves(&loaded, "", &mut now);
            let keys: Vec<String> = now
                .iter()
                .filter(|(k, v)| default_leaves.get(*k) != Some(v) && reflects(v, sample))
                .map(|(k, _)| k.clone())
                .collect();
            (!keys.is_empty()).then_some(keys)
        });
        let found = found.or_else(|| {
            let refused = exceptions.refused_otherwise.iter().find(|(v, _)| *v == variable);
            refused.map(|(_, key)| vec![key.to_string()])
        });
        match found {
            Some(keys) => {
                for key in keys {
                    // A key inside an optional table left unset is documented under that table.
                    let shown = if default_leaves.contains_key(&key) {
                        key
                    } else {
                        key.rsplit_once('.').map_or(key.clone(), |(table, _)| table.to_string())
                    };
                    key_of.entry(shown).or_default().insert(variable.to_string());
                }
            }
            None => {
                no_key.insert(variable.to_string());
            }
        }
    }
    let rows = default_leaves
        .iter()
        .map(|(key, value)| Row {
            key: key.clone(),
            variable: key_of.get(key).map(|vars| vars.iter().cloned().collect::<Vec<_>>().join(", ")),
            default: rendered(value),
        })
        .collect();
    (rows, no_key)
}

/// Whether the tables of `doc_path` under `section` are the ones the code says ([`derived`]):
/// if not, the error holds the tables as the documentation should have them.
pub fn check_documented(
    doc_path: &std::path::Path,
    section: &str,
    defaults: &Value,
    reader: Reader,
    load: LoadWith<'_>,
    exceptions: &Exceptions<'_>,
) -> Result<(), String> {
    let doc = std::fs::read_to_string(doc_path).map_err(|e| format!("{}: {e}", doc_path.display()))?;
    let code = derived(defaults, reader, load, exceptions);
    if documented(&doc, section) == code {
        return Ok(());
    }
    Err(format!("{}, {section}, should be:\n{}", doc_path.display(), markdown(&code.0, &code.1)))
}

/// The table as markdown, for a failing check's message (what the documentation should say).
pub fn markdown(rows: &[Row], no_key: &BTreeSet<String>) -> String {
    let mut out = String::from("| key | environment variable | default |\n|---|---|---|\n");
    for r in rows {
        let variable = r
            .variable
            .as_deref()
            .map_or("—".to_string(), |v| v.split(", ").map(|v| format!("`{v}`")).collect::<Vec<_>>().join(", "));
        out.push_str(&format!("| `{}` | {variable} | `{}` |\n", r.key, r.default));
    }
    out.push_str("\n| variable | what it sets |\n|---|---|\n");
    for v in no_key {
        out.push_str(&format!("| `{v}` | |\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_variable_is_found_by_the_key_that_takes_its_value() {
        let defaults = serde_json::json!({"port": 80, "name": "a", "tls": null, "list": []});
        let load = |env: &dyn Fn(&str) -> Option<String>| -> Result<Value, String> {
            let mut v = defaults.clone();
            if let Some(p) = env("COFFER_LISTEN") {
                v["port"] = serde_json::json!(p.parse::<u64>().map_err(|e| e.to_string())?);
            }
            if let Some(n) = env("COFFER_OPS_LISTEN") {
                v["list"] = serde_json::json!([n]);
            }
            Ok(v)
        };
        let exceptions = Exceptions { with: &[], refused_otherwise: &[] };
        let (rows, no_key) = derived(&defaults, Reader::Gateway, &load, &exceptions);
        let find = |k: &str| rows.iter().find(|r| r.key == k).unwrap().clone();
        assert_eq!(find("port").variable.as_deref(), Some("COFFER_LISTEN"));
        assert_eq!(find("list").variable.as_deref(), Some("COFFER_OPS_LISTEN"));
        assert_eq!((find("tls").default.as_str(), find("name").variable), ("none", None));
        assert!(no_key.contains("COFFER_STORE_URL") && !no_key.contains("COFFER_LISTEN"));
        let doc = format!("# x\n\n## The gateway\n\n{}\n## Next\n", markdown(&rows, &no_key));
        assert_eq!(documented(&doc, "The gateway"), (rows, no_key), "the markdown reads back as written");
    }
}
