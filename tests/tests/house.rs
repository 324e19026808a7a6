//! Housekeeping checks of the workspace itself, run by `make test` (`cargo test --workspace`):
//!
//! - no import cycles between the files of a crate's `src/` tree (the module graph below);
//! - no resolved package (`cargo metadata`) declares a `rust-version` newer than the workspace's,
//!   and every crate inherits it;
//! - every crate takes the workspace's lints;
//! - README's layout table follows the tree.
//!
//! No process is started except `cargo metadata`, and nothing is built.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Command;

// ------------------------------------------------------------------------------------------------
// The module graph of one crate's `src/` tree.
//
// Every .rs file is a module, found by following `mod x;` declarations from each crate root
// (`lib.rs`, `main.rs`, `bin/*.rs`, `bin/*/main.rs`). A file A has an edge to a file B when A's
// text (comments and string literals stripped) names a path into B: `crate::…`, `super::…`,
// `self::…`, a bare path through a module declared in A (`mod x;` + `x::f`), a bare path through
// a module A imported (`use super::ops;` + `ops::keys::f`), grouped imports included. A path
// resolves to the deepest module of it that is a file. A `mod x;` declaration alone is not an
// edge; `pub use x::Y` is. Test code does not count: items under `#[cfg(test)]` (the inline
// `mod tests { … }` blocks) are dropped, and files named tests.rs are skipped.
// ------------------------------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    Ident(String),
    /// `::`
    Sep,
    Punct(char),
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_char(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// The text with comments, string literals (plain, raw, byte, C) and char literals replaced by
/// spaces (newlines kept). Lifetimes and labels stay.
fn strip_comments_and_literals(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let blank = |out: &mut String, s: &[char]| {
        for &ch in s {
            out.push(if ch == '\n' { '\n' } else { ' ' });
        }
    };
    let mut i = 0;
    while i < c.len() {
        // Line comment (doc comments included).
        if c[i] == '/' && c.get(i + 1) == Some(&'/') {
            let mut j = i;
            while j < c.len() && c[j] != '\n' {
                j += 1;
            }
            blank(&mut out, &c[i..j]);
            i = j;
            continue;
        }
        // Block comment, nested.
        if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0usize;
            let mut j = i;
            while j < c.len() {
                if c[j] == '/' && c.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 2;
                } else if c[j] == '*' && c.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            let j = j.min(c.len());
            blank(&mut out, &c[i..j]);
            i = j;
            continue;
        }
        // Raw string: r"…", r#"…"#, br#"…"#, cr"…" (not a raw identifier r#name).
        if c[i] == 'r' {
            let prev_ok = i == 0
                || !is_ident_char(c[i - 1])
                || ((c[i - 1] == 'b' || c[i - 1] == 'c') && (i < 2 || !is_ident_char(c[i - 2])));
            if prev_ok {
                let mut j = i + 1;
                while c.get(j) == Some(&'#') {
                    j += 1;
                }
                if c.get(j) == Some(&'"') {
                    let hashes = j - i - 1;
                    let mut k = j + 1;
                    loop {
                        if k >= c.len() {
                            break;
                        }
                        if c[k] == '"' && (0..hashes).all(|h| c.get(k + 1 + h) == Some(&'#')) {
                            k += 1 + hashes;
                            break;
                        }
                        k += 1;
                    }
                    let k = k.min(c.len());
                    blank(&mut out, &c[i..k]);
                    i = k;
                    continue;
                }
            }
        }
        // String (a b or c prefix is left as a harmless one-letter identifier).
        if c[i] == '"' {
            let mut j = i + 1;
            while j < c.len() && c[j] != '"' {
                if c[j] == '\\' {
                    j += 1;
                }
                j += 1;
            }
            let j = (j + 1).min(c.len());
            blank(&mut out, &c[i..j]);
            i = j;
            continue;
        }
        // Char literal ('x', '\n', '\u{1F600}', '\''); a lifetime or label ('a, 'outer) stays.
        if c[i] == '\'' {
            if c.get(i + 1) == Some(&'\\') {
                let mut j = i + 3;
                while j < c.len() && c[j] != '\'' {
                    j += 1;
                }
                let j = (j + 1).min(c.len());
                blank(&mut out, &c[i..j]);
                i = j;
                continue;
            }
            if c.get(i + 2) == Some(&'\'') {
                blank(&mut out, &c[i..i + 3]);
                i += 3;
                continue;
            }
        }
        out.push(c[i]);
        i += 1;
    }
    out
}

fn tokenize(text: &str) -> Vec<Tok> {
    let c: Vec<char> = text.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch.is_whitespace() {
            i += 1;
        } else if is_ident_start(ch) {
            let mut j = i;
            while j < c.len() && is_ident_char(c[j]) {
                j += 1;
            }
            let word: String = c[i..j].iter().collect();
            // Raw identifier r#name.
            if word == "r" && c.get(j) == Some(&'#') && c.get(j + 1).is_some_and(|&n| is_ident_start(n)) {
                let mut k = j + 1;
                while k < c.len() && is_ident_char(c[k]) {
                    k += 1;
                }
                toks.push(Tok::Ident(c[j + 1..k].iter().collect()));
                i = k;
            } else {
                toks.push(Tok::Ident(word));
                i = j;
            }
        } else if ch.is_ascii_digit() {
            let mut j = i;
            while j < c.len() && is_ident_char(c[j]) {
                j += 1;
            }
            toks.push(Tok::Punct('0'));
            i = j;
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            toks.push(Tok::Sep);
            i += 2;
        } else {
            toks.push(Tok::Punct(ch));
            i += 1;
        }
    }
    toks
}

fn is_punct(t: Option<&Tok>, ch: char) -> bool {
    matches!(t, Some(Tok::Punct(p)) if *p == ch)
}

fn is_ident(t: Option<&Tok>, word: &str) -> bool {
    matches!(t, Some(Tok::Ident(w)) if w == word)
}

/// The index just past the group opened at `i` (`(`, `[` or `{`), or the end.
fn skip_balanced(toks: &[Tok], i: usize) -> usize {
    let mut depth = 0usize;
    let mut j = i;
    while j < toks.len() {
        match &toks[j] {
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(')' | ']' | '}') => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return j + 1;
                }
            }
            _ => {}
        }
        j += 1;
    }
    toks.len()
}

/// Drops every item under `#[cfg(test)]` (a whole file under `#![cfg(test)]`): the inline
/// `mod tests { … }` blocks, and test-only `use`s, functions and `mod x;` declarations.
fn drop_test_items(toks: Vec<Tok>) -> Vec<Tok> {
    let cfg_test = |toks: &[Tok], i: usize| -> bool {
        is_ident(toks.get(i), "cfg")
            && is_punct(toks.get(i + 1), '(')
            && is_ident(toks.get(i + 2), "test")
            && is_punct(toks.get(i + 3), ')')
            && is_punct(toks.get(i + 4), ']')
    };
    let mut out = Vec::with_capacity(toks.len());
    let mut i = 0;
    while i < toks.len() {
        if is_punct(toks.get(i), '#')
            && is_punct(toks.get(i + 1), '!')
            && is_punct(toks.get(i + 2), '[')
            && cfg_test(&toks, i + 3)
        {
            return Vec::new();
        }
        if is_punct(toks.get(i), '#') && is_punct(toks.get(i + 1), '[') && cfg_test(&toks, i + 2) {
            let mut j = i + 7;
            // Further attributes of the same item.
            while is_punct(toks.get(j), '#') && is_punct(toks.get(j + 1), '[') {
                j = skip_balanced(&toks, j + 1);
            }
            // The item: up to its `;`, or through its `{ … }` block.
            let mut depth = 0usize;
            while j < toks.len() {
                match &toks[j] {
                    Tok::Punct('(' | '[') => depth += 1,
                    Tok::Punct(')' | ']') => depth = depth.saturating_sub(1),
                    Tok::Punct(';') if depth == 0 => {
                        j += 1;
                        break;
                    }
                    Tok::Punct('{') if depth == 0 => {
                        j = skip_balanced(&toks, j);
                        break;
                    }
                    _ => {}
                }
                j += 1;
            }
            i = j;
            continue;
        }
        out.push(toks[i].clone());
        i += 1;
    }
    out
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct UsePath {
    segs: Vec<String>,
    glob: bool,
    rename: Option<String>,
}

/// From index `i` (at a path segment, `*` or `{`), the paths of one path or use tree, appended
/// to `out` with `prefix` before them; returns the index past it.
fn parse_tree(toks: &[Tok], mut i: usize, prefix: Vec<String>, out: &mut Vec<UsePath>) -> usize {
    let base = prefix.len();
    let mut segs = prefix;
    loop {
        match toks.get(i) {
            Some(Tok::Ident(s)) => {
                segs.push(s.clone());
                i += 1;
                if toks.get(i) == Some(&Tok::Sep) {
                    i += 1;
                    continue;
                }
                let mut rename = None;
                if is_ident(toks.get(i), "as") {
                    if let Some(Tok::Ident(name)) = toks.get(i + 1) {
                        rename = Some(name.clone());
                        i += 2;
                    }
                }
                out.push(UsePath { segs, glob: false, rename });
                return i;
            }
            Some(Tok::Punct('*')) => {
                out.push(UsePath { segs, glob: true, rename: None });
                return i + 1;
            }
            Some(Tok::Punct('{')) => {
                i += 1;
                loop {
                    match toks.get(i) {
                        None => return i,
                        Some(Tok::Punct('}')) => return i + 1,
                        Some(Tok::Punct(',')) => i += 1,
                        _ => {
                            let j = parse_tree(toks, i, segs.clone(), out);
                            i = j.max(i + 1);
                            // Anything unexpected: on to the next element of this group.
                            let mut depth = 0usize;
                            while i < toks.len() {
                                match &toks[i] {
                                    Tok::Punct(',') | Tok::Punct('}') if depth == 0 => break,
                                    Tok::Punct('{') => depth += 1,
                                    Tok::Punct('}') => depth -= 1,
                                    _ => {}
                                }
                                i += 1;
                            }
                        }
                    }
                }
            }
            _ => {
                // Ended after a `::` (e.g. `Vec::<u8>::new`): what came before is the path.
                if segs.len() > base {
                    out.push(UsePath { segs, glob: false, rename: None });
                }
                return i;
            }
        }
    }
}

/// What one file declares and names.
#[derive(Debug, Default)]
struct FileScan {
    /// `mod x;` declarations: the inline module they sit in (`[]` at the top) and the name.
    file_mods: Vec<(Vec<String>, String)>,
    /// Every module declared here, file or inline, by the inline module it sits in.
    declared: BTreeSet<(Vec<String>, String)>,
    /// Every path named, with the inline module it is named in.
    paths: Vec<(Vec<String>, UsePath)>,
    /// `#[cfg(test)] mod x;` at the top of the file: test support, outside the graph like tests.
    test_mods: Vec<String>,
}

/// The names of the top-level `#[cfg(test)] (pub …) mod x;` declarations of a token stream.
fn test_mod_names(toks: &[Tok]) -> Vec<String> {
    let mut names = Vec::new();
    let mut depth = 0usize;
    for i in 0..toks.len() {
        match &toks[i] {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => depth = depth.saturating_sub(1),
            Tok::Punct('#')
                if depth == 0
                    && is_punct(toks.get(i + 1), '[')
                    && is_ident(toks.get(i + 2), "cfg")
                    && is_punct(toks.get(i + 3), '(')
                    && is_ident(toks.get(i + 4), "test")
                    && is_punct(toks.get(i + 5), ')')
                    && is_punct(toks.get(i + 6), ']') =>
            {
                let mut j = i + 7;
                if is_ident(toks.get(j), "pub") {
                    j += 1;
                    if is_punct(toks.get(j), '(') {
                        j = skip_balanced(toks, j);
                    }
                }
                if let (true, Some(Tok::Ident(name)), true) =
                    (is_ident(toks.get(j), "mod"), toks.get(j + 1), is_punct(toks.get(j + 2), ';'))
                {
                    names.push(name.clone());
                }
            }
            _ => {}
        }
    }
    names
}

fn scan_file(src: &str) -> FileScan {
    let all = tokenize(&strip_comments_and_literals(src));
    let test_mods = test_mod_names(&all);
    let toks = drop_test_items(all);
    let mut scan = FileScan { test_mods, ..FileScan::default() };
    let mut stack: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        let scope: Vec<String> = stack.iter().map(|(n, _)| n.clone()).collect();
        match &toks[i] {
            Tok::Punct('{') => {
                depth += 1;
                i += 1;
            }
            Tok::Punct('}') => {
                if stack.last().is_some_and(|&(_, d)| d == depth) {
                    stack.pop();
                }
                depth = depth.saturating_sub(1);
                i += 1;
            }
            Tok::Ident(k) if k == "mod" => {
                if let Some(Tok::Ident(name)) = toks.get(i + 1) {
                    if is_punct(toks.get(i + 2), ';') {
                        scan.file_mods.push((scope.clone(), name.clone()));
                        scan.declared.insert((scope, name.clone()));
                    } else if is_punct(toks.get(i + 2), '{') {
                        scan.declared.insert((scope, name.clone()));
                        depth += 1;
                        stack.push((name.clone(), depth));
                        i += 3;
                        continue;
                    }
                }
                i += 2;
            }
            Tok::Ident(_) if i == 0 || toks[i - 1] != Tok::Sep => {
                let mut found = Vec::new();
                let j = parse_tree(&toks, i, Vec::new(), &mut found);
                scan.paths.extend(found.into_iter().map(|p| (scope.clone(), p)));
                i = j.max(i + 1);
            }
            _ => i += 1,
        }
    }
    scan
}

/// One crate root's module tree and the edges between its files.
#[derive(Debug)]
struct ModuleGraph {
    /// `crate` or `crate [bin/x.rs]`.
    label: String,
    /// Files (relative to src/) by module id; `mods[id]` is the module path of `files[id]`.
    files: Vec<String>,
    mods: Vec<Vec<String>>,
    /// Edges between module ids, each with the paths that make it.
    edges: BTreeMap<(usize, usize), BTreeSet<String>>,
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

fn dir_name(path: &str) -> &str {
    path.rfind('/').map_or("", |k| &path[..k])
}

fn join(dir: &str, rest: &str) -> String {
    if dir.is_empty() {
        rest.to_string()
    } else {
        format!("{dir}/{rest}")
    }
}

/// The crate roots present in a `src/` tree: lib.rs, main.rs, bin/*.rs and bin/*/main.rs.
fn crate_roots(files: &BTreeMap<String, String>) -> Vec<String> {
    files
        .keys()
        .filter(|f| {
            let parts: Vec<&str> = f.split('/').collect();
            matches!(parts.as_slice(), ["lib.rs"] | ["main.rs"] | ["bin", _] | ["bin", _, "main.rs"])
        })
        .cloned()
        .collect()
}

/// The module graph of every crate root of a `src/` tree (files by path relative to src/), and
/// the files no root reaches (tests.rs files aside).
fn module_graphs(krate: &str, files: &BTreeMap<String, String>) -> (Vec<ModuleGraph>, Vec<String>) {
    let scans: BTreeMap<&String, FileScan> = files.iter().map(|(f, text)| (f, scan_file(text))).collect();
    let mut reached = BTreeSet::new();
    let mut graphs = Vec::new();
    for root in crate_roots(files) {
        let label = if root == "lib.rs" { krate.to_string() } else { format!("{krate} [{root}]") };
        let mut g = ModuleGraph { label, files: vec![root.clone()], mods: vec![Vec::new()], edges: BTreeMap::new() };
        // The tree, from `mod x;` declarations.
        let mut queue = VecDeque::from([0usize]);
        while let Some(id) = queue.pop_front() {
            let file = g.files[id].clone();
            reached.insert(file.clone());
            let owns_dir = id == 0 || file_name(&file) == "mod.rs";
            let child_dir =
                if owns_dir { dir_name(&file).to_string() } else { file.trim_end_matches(".rs").to_string() };
            // Test support declared `#[cfg(test)] mod x;` is test code: reached, not in the graph.
            for name in &scans[&file].test_mods {
                for f in [join(&child_dir, &format!("{name}.rs")), join(&child_dir, &format!("{name}/mod.rs"))] {
                    if files.contains_key(&f) {
                        reached.insert(f);
                    }
                }
            }
            for (scope, name) in &scans[&file].file_mods {
                let dir = scope.iter().fold(child_dir.clone(), |d, s| join(&d, s));
                let flat = join(&dir, &format!("{name}.rs"));
                let nested = join(&dir, &format!("{name}/mod.rs"));
                let Some(child) = [flat, nested].into_iter().find(|f| files.contains_key(f)) else { continue };
                if file_name(&child) == "tests.rs" || g.files.contains(&child) {
                    continue;
                }
                let mut path = g.mods[id].clone();
                path.extend(scope.iter().cloned());
                path.push(name.clone());
                g.files.push(child);
                g.mods.push(path);
                queue.push_back(g.files.len() - 1);
            }
        }
        // The edges, from the paths each file names.
        let by_path: BTreeMap<&Vec<String>, usize> = g.mods.iter().enumerate().map(|(id, m)| (m, id)).collect();
        let deepest = |full: &[String]| -> usize {
            (0..=full.len()).rev().find_map(|n| by_path.get(&full[..n].to_vec()).copied()).unwrap_or(0)
        };
        let mut edges = BTreeMap::new();
        for (id, file) in g.files.iter().enumerate() {
            let scan = &scans[file];
            let here = &g.mods[id];
            // Absolute form of a path named in inline module `scope`, given the module aliases.
            let absolute = |scope: &[String], p: &UsePath, aliases: &BTreeMap<String, Vec<String>>| {
                let mut segs = p.segs.clone();
                while segs.len() > 1 && segs.last().is_some_and(|s| s == "self") {
                    segs.pop();
                }
                // `pub(crate)`, `pub(super)`, a lone identifier: no path into another module.
                if segs.len() < 2 && !p.glob {
                    return None;
                }
                let mut cur = here.clone();
                cur.extend(scope.iter().cloned());
                let (mut base, rest): (Vec<String>, &[String]) = match segs[0].as_str() {
                    "crate" => (Vec::new(), &segs[1..]),
                    "self" => (cur, &segs[1..]),
                    "super" => {
                        let ups = segs.iter().take_while(|s| *s == "super").count();
                        let keep = cur.len().checked_sub(ups)?;
                        (cur[..keep].to_vec(), &segs[ups..])
                    }
                    first if scan.declared.contains(&(scope.to_vec(), first.to_string())) => (cur, &segs[..]),
                    first if aliases.contains_key(first) => (aliases[first].clone(), &segs[1..]),
                    _ => return None,
                };
                base.extend(rest.iter().cloned());
                Some(base)
            };
            // Modules imported by name (`use super::ops;`), for later paths through them.
            let mut aliases = BTreeMap::new();
            for (scope, p) in &scan.paths {
                if let Some(full) = absolute(scope, p, &BTreeMap::new()) {
                    if !p.glob && by_path.contains_key(&full) {
                        aliases
                            .insert(p.rename.clone().unwrap_or_else(|| full.last().cloned().unwrap_or_default()), full);
                    }
                }
            }
            for (scope, p) in &scan.paths {
                if let Some(full) = absolute(scope, p, &aliases) {
                    let to = deepest(&full);
                    if to != id {
                        let mut shown = p.segs.join("::");
                        if p.glob {
                            shown.push_str("::*");
                        } else if let Some(module) = shown.strip_suffix("::self") {
                            shown = module.to_string();
                        }
                        edges.entry((id, to)).or_insert_with(BTreeSet::new).insert(shown);
                    }
                }
            }
        }
        g.edges = edges;
        graphs.push(g);
    }
    let orphans = files.keys().filter(|f| !reached.contains(*f) && file_name(f) != "tests.rs").cloned().collect();
    (graphs, orphans)
}

/// Tarjan's strongly connected components of more than one module.
fn cycles_sccs(n: usize, edges: &BTreeMap<(usize, usize), BTreeSet<String>>) -> Vec<Vec<usize>> {
    struct State<'a> {
        adj: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn connect(s: &mut State, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        let adj = s.adj;
        for &w in adj[v].iter() {
            match s.index[w] {
                None => {
                    connect(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut scc = Vec::new();
            loop {
                let w = s.stack.pop().expect("v is on the stack");
                s.on_stack[w] = false;
                scc.push(w);
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                s.out.push(scc);
            }
        }
    }
    let mut adj = vec![Vec::new(); n];
    for &(a, b) in edges.keys() {
        adj[a].push(b);
    }
    let mut s = State {
        adj: &adj,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            connect(&mut s, v);
        }
    }
    s.out.sort();
    s.out
}

/// The cycles of a graph, as `label: a.rs -> b.rs -> a.rs`: for every edge inside a strongly
/// connected component, the shortest cycle through it (so every edge that closes a cycle is
/// shown), each cycle once.
fn cycles(g: &ModuleGraph) -> Vec<String> {
    let mut found = BTreeSet::new();
    for scc in cycles_sccs(g.files.len(), &g.edges) {
        let inside: BTreeSet<usize> = scc.iter().copied().collect();
        for &(a, b) in g.edges.keys() {
            if !inside.contains(&a) || !inside.contains(&b) {
                continue;
            }
            // Shortest way back from b to a, inside the component.
            let mut prev = BTreeMap::from([(b, b)]);
            let mut queue = VecDeque::from([b]);
            while let Some(v) = queue.pop_front() {
                if v == a {
                    break;
                }
                for &(x, y) in g.edges.keys() {
                    if x == v && inside.contains(&y) && !prev.contains_key(&y) {
                        prev.insert(y, v);
                        queue.push_back(y);
                    }
                }
            }
            let mut back = vec![a];
            while *back.last().expect("nonempty") != b {
                back.push(prev[back.last().expect("nonempty")]);
            }
            back.reverse(); // b … a
            let mut cycle = vec![a];
            cycle.extend(back); // a b … a
            cycle.pop();
            // One rotation per cycle: from its smallest file.
            let start = (0..cycle.len()).min_by_key(|&k| &g.files[cycle[k]]).expect("nonempty");
            cycle.rotate_left(start);
            cycle.push(cycle[0]);
            let names: Vec<&str> = cycle.iter().map(|&m| g.files[m].as_str()).collect();
            found.insert(format!("{}: {}", g.label, names.join(" -> ")));
        }
    }
    found.into_iter().collect()
}

/// The edges that lie on a cycle, with the paths that make them: what to change to break it.
fn cycle_edges(g: &ModuleGraph) -> Vec<String> {
    let mut out = Vec::new();
    for scc in cycles_sccs(g.files.len(), &g.edges) {
        for ((a, b), why) in &g.edges {
            if scc.contains(a) && scc.contains(b) {
                let why: Vec<&str> = why.iter().map(String::as_str).collect();
                out.push(format!("{}: {} -> {} ({})", g.label, g.files[*a], g.files[*b], why.join(", ")));
            }
        }
    }
    out
}

// ------------------------------------------------------------------------------------------------
// The workspace on disk.
// ------------------------------------------------------------------------------------------------

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ sits in the workspace").to_path_buf()
}

/// `members = [...]` of the root Cargo.toml.
fn workspace_members(root: &Path) -> Vec<String> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("root Cargo.toml");
    let line = manifest.lines().find(|l| l.trim_start().starts_with("members")).expect("a members line");
    let list = &line[line.find('[').expect("[")..=line.rfind(']').expect("]")];
    list.trim_matches(|c| c == '[' || c == ']').split(',').map(|m| m.trim().trim_matches('"').to_string()).collect()
}

/// Every .rs file under `dir`, by path relative to it, with its text.
fn read_rs_tree(dir: &Path) -> BTreeMap<String, String> {
    fn walk(dir: &Path, rel: &str, out: &mut BTreeMap<String, String>) {
        let mut entries: Vec<_> =
            std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).map(|e| e.unwrap()).collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let name = e.file_name().to_string_lossy().into_owned();
            let path = e.path();
            if path.is_dir() {
                walk(&path, &join(rel, &name), out);
            } else if name.ends_with(".rs") {
                out.insert(join(rel, &name), std::fs::read_to_string(&path).expect("read"));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, "", &mut out);
    out
}

fn workspace_graphs() -> (Vec<ModuleGraph>, Vec<String>) {
    let root = workspace_root();
    let mut graphs = Vec::new();
    let mut problems = Vec::new();
    for member in workspace_members(&root) {
        let files = read_rs_tree(&root.join(&member).join("src"));
        if crate_roots(&files).is_empty() {
            problems.push(format!("{member}: no lib.rs, main.rs or bin/ under src/"));
        }
        let (g, orphans) = module_graphs(&member, &files);
        problems.extend(orphans.into_iter().map(|f| {
            format!(
                "{member}: src/{f} is reached by no `mod` declaration (a #[path] module? teach tests/tests/house.rs)"
            )
        }));
        graphs.extend(g);
    }
    (graphs, problems)
}

/// Every file of every crate's src/ is in the module graph the cycle check reads, so that it
/// cannot pass by missing part of the tree.
#[test]
fn module_graph_covers_every_source_file() {
    let (graphs, problems) = workspace_graphs();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let modules: usize = graphs.iter().map(|g| g.files.len()).sum();
    let edges: usize = graphs.iter().map(|g| g.edges.len()).sum();
    assert!(modules > 50 && edges > 50, "only {modules} modules and {edges} edges found: is the scanner broken?");
}

#[test]
fn no_import_cycles_between_modules() {
    let (graphs, problems) = workspace_graphs();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let found: Vec<String> = graphs.iter().flat_map(cycles).collect();
    let edges: Vec<String> = graphs.iter().flat_map(cycle_edges).collect();
    assert!(
        found.is_empty(),
        "{} import cycles between modules:\n{}\n\nthe edges on them, with the paths that make them:\n{}",
        found.len(),
        found.join("\n"),
        edges.join("\n")
    );
}

// ------------------------------------------------------------------------------------------------
// The checker itself, on small trees.
// ------------------------------------------------------------------------------------------------

fn tree(files: &[(&str, &str)]) -> BTreeMap<String, String> {
    files.iter().map(|(f, t)| (f.to_string(), t.to_string())).collect()
}

fn lib_graph(files: &[(&str, &str)]) -> ModuleGraph {
    let (graphs, orphans) = module_graphs("t", &tree(files));
    assert!(orphans.is_empty(), "orphans: {orphans:?}");
    graphs.into_iter().find(|g| g.label == "t").expect("a lib.rs")
}

fn edge_set(g: &ModuleGraph) -> BTreeSet<(String, String)> {
    g.edges.keys().map(|&(a, b)| (g.files[a].clone(), g.files[b].clone())).collect()
}

fn e(a: &str, b: &str) -> (String, String) {
    (a.to_string(), b.to_string())
}

#[test]
fn checker_finds_a_cycle() {
    let g = lib_graph(&[
        ("lib.rs", "pub mod a;\npub mod b;\n"),
        ("a.rs", "use crate::b::X;\npub struct Y(X);\n"),
        ("b.rs", "pub struct X;\npub fn f() -> crate::a::Y { todo!() }\n"),
    ]);
    assert_eq!(cycles(&g), vec!["t: a.rs -> b.rs -> a.rs"]);
    assert_eq!(cycle_edges(&g), vec!["t: a.rs -> b.rs (crate::b::X)", "t: b.rs -> a.rs (crate::a::Y)"]);
}

#[test]
fn checker_finds_a_longer_cycle_through_nested_files() {
    let g = lib_graph(&[
        ("lib.rs", "pub mod ops;\npub mod state;\n"),
        ("ops/mod.rs", "pub mod keys;\n"),
        ("ops/keys.rs", "pub fn f(s: &super::super::state::S) {}\n"),
        ("state.rs", "pub struct S;\nfn g() { crate::ops::keys::f(&S) }\n"),
    ]);
    assert_eq!(cycles(&g), vec!["t: ops/keys.rs -> state.rs -> ops/keys.rs"]);
}

#[test]
fn a_child_using_its_parent_is_no_cycle_until_the_parent_uses_the_child() {
    let parent_child =
        [("lib.rs", "pub mod child;\npub struct X;\n"), ("child.rs", "use super::X;\npub struct Y(X);\n")];
    let g = lib_graph(&parent_child);
    assert_eq!(edge_set(&g), BTreeSet::from([e("child.rs", "lib.rs")]));
    assert!(cycles(&g).is_empty());

    // A re-export through the child is a use of it.
    let g = lib_graph(&[("lib.rs", "pub mod child;\npub use child::Y;\npub struct X;\n"), parent_child[1]]);
    assert_eq!(cycles(&g), vec!["t: child.rs -> lib.rs -> child.rs"]);

    // So is a call through it, in a mod.rs parent too.
    let g = lib_graph(&[
        ("lib.rs", "mod p;\n"),
        ("p/mod.rs", "mod child;\npub struct X;\nfn f() { child::g() }\n"),
        ("p/child.rs", "pub fn g() {}\nuse super::*;\n"),
    ]);
    assert_eq!(cycles(&g), vec!["t: p/child.rs -> p/mod.rs -> p/child.rs"]);
}

#[test]
fn grouped_imports_parse() {
    let g = lib_graph(&[
        ("lib.rs", "mod a;\nmod b;\nmod c;\nmod z;\n"),
        ("a.rs", ""),
        ("b.rs", ""),
        ("c.rs", "pub mod d;\n"),
        ("c/d.rs", ""),
        ("z.rs", "use crate::{\n    a::X,\n    b::{Y, Z as W},\n    c::{self, d::*},\n};\n"),
    ]);
    assert_eq!(
        edge_set(&g),
        BTreeSet::from([e("z.rs", "a.rs"), e("z.rs", "b.rs"), e("z.rs", "c.rs"), e("z.rs", "c/d.rs")])
    );
    let mut out = Vec::new();
    let toks = tokenize("crate::{a::X, b::{Y, Z as W}, c::{self, d::*}}");
    assert_eq!(parse_tree(&toks, 0, Vec::new(), &mut out), toks.len());
    let shown: Vec<String> = out
        .iter()
        .map(|p| {
            format!("{}{}{}", p.segs.join("::"), if p.glob { "::*" } else { "" }, p.rename.as_deref().unwrap_or(""))
        })
        .collect();
    assert_eq!(shown, ["crate::a::X", "crate::b::Y", "crate::b::ZW", "crate::c::self", "crate::c::d::*"]);
}

#[test]
fn paths_resolve_to_the_deepest_file() {
    let g = lib_graph(&[
        ("lib.rs", "pub mod a;\npub mod z;\n"),
        ("a.rs", "pub mod b;\npub struct Inner;\n"),
        ("a/b.rs", "pub struct C;\n"),
        ("z.rs", "fn f() { let _ = crate::a::b::C; let _ = crate::a::Inner; }\n"),
    ]);
    assert_eq!(edge_set(&g), BTreeSet::from([e("z.rs", "a.rs"), e("z.rs", "a/b.rs")]));
    let id = |f: &str| g.files.iter().position(|x| x == f).expect(f);
    assert_eq!(g.edges[&(id("z.rs"), id("a.rs"))], BTreeSet::from(["crate::a::Inner".to_string()]));
}

#[test]
fn self_paths_bare_child_paths_and_module_aliases_count() {
    let g = lib_graph(&[
        ("lib.rs", "pub mod ops;\npub mod state;\n"),
        ("ops/mod.rs", "pub mod keys;\npub mod users;\npub fn f() { self::keys::k() }\n"),
        ("ops/keys.rs", "pub fn k() {}\n"),
        ("ops/users.rs", "pub fn u() {}\n"),
        ("state.rs", "use crate::ops;\nfn g() { ops::users::u() }\n"),
    ]);
    assert_eq!(
        edge_set(&g),
        BTreeSet::from([e("ops/mod.rs", "ops/keys.rs"), e("state.rs", "ops/mod.rs"), e("state.rs", "ops/users.rs")])
    );
}

#[test]
fn comments_strings_visibility_and_test_code_are_no_edges() {
    let g = lib_graph(&[
        ("lib.rs", "pub mod a;\npub mod b;\n"),
        (
            "a.rs",
            r###"
pub mod c;
// use crate::b::X;
/* crate::b::X /* nested */ crate::b::X */
/// [`crate::b::X`]
pub(crate) fn f() -> &'static str { "crate::b::X" }
pub(super) fn g() -> char { '"' }
const R: &str = r#"crate::b::X " still raw"#;
const Q: char = '\'';
#[cfg(test)]
mod tests {
    use crate::b::X;
    fn t() { let _ = "}"; }
}
#[cfg(test)]
use crate::b::Y;
#[cfg(test)]
#[allow(dead_code)]
fn helper(x: [u8; 2]) -> crate::b::X { crate::b::X }
"###,
        ),
        ("a/c.rs", "pub fn h() -> u8 { 1 }\n"),
        ("a/tests.rs", "use crate::b::X;\n"),
        ("b.rs", "pub struct X;\npub struct Y;\npub fn k() { crate::a::c::h(); }\n"),
    ]);
    assert_eq!(edge_set(&g), BTreeSet::from([e("b.rs", "a/c.rs")]));
    assert!(!g.files.contains(&"a/tests.rs".to_string()));
}

#[test]
fn inline_modules_resolve_super_from_where_they_sit() {
    let g = lib_graph(&[
        ("lib.rs", "pub mod sign;\n"),
        ("sign/mod.rs", "mod eip712;\npub mod fuzzing {\n    pub fn d() { super::eip712::h() }\n}\n"),
        ("sign/eip712.rs", "pub fn h() {}\n"),
    ]);
    assert_eq!(edge_set(&g), BTreeSet::from([e("sign/mod.rs", "sign/eip712.rs")]));
}

#[test]
fn binaries_are_their_own_roots_and_unreached_files_are_reported() {
    let (graphs, orphans) = module_graphs(
        "t",
        &tree(&[
            ("lib.rs", "pub mod a;\n"),
            ("a.rs", ""),
            ("main.rs", "mod cli;\n"),
            ("cli.rs", "use crate::*;\n"),
            ("bin/tool.rs", "fn main() { t::a::f() }\n"),
            ("stray.rs", "use crate::a;\n"),
        ]),
    );
    let labels: Vec<&str> = graphs.iter().map(|g| g.label.as_str()).collect();
    assert_eq!(labels, ["t [bin/tool.rs]", "t", "t [main.rs]"]);
    assert_eq!(orphans, ["stray.rs"]);
    let main = &graphs[2];
    assert_eq!(edge_set(main), BTreeSet::from([e("cli.rs", "main.rs")]));
}

#[test]
fn test_support_declared_under_cfg_test_is_reached_but_not_in_the_graph() {
    let (graphs, orphans) = module_graphs(
        "t",
        &tree(&[
            (
                "lib.rs",
                "pub mod a;
",
            ),
            (
                "a/mod.rs",
                "pub fn f() {}
#[cfg(test)]
pub(crate) mod harness;
",
            ),
            (
                "a/harness.rs",
                "use crate::a::f;
",
            ),
        ]),
    );
    assert!(orphans.is_empty(), "orphans: {orphans:?}");
    assert!(!graphs[0].files.iter().any(|f| f == "a/harness.rs"), "{:?}", graphs[0].files);
}

// ------------------------------------------------------------------------------------------------
// rust-version: no resolved package may need a newer Rust than the workspace declares.
// (Std APIs newer than it, in the workspace's own code, are clippy's `incompatible_msrv`.)
// ------------------------------------------------------------------------------------------------

fn parse_version(v: &str) -> Vec<u64> {
    let mut parts: Vec<u64> = v.split('.').map(|p| p.parse().unwrap_or_else(|_| panic!("version {v:?}"))).collect();
    parts.resize(3, 0);
    parts
}

/// `rust-version` of `[workspace.package]` in the root Cargo.toml.
fn workspace_rust_version(root: &Path) -> String {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("root Cargo.toml");
    let mut section = "";
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
        } else if section == "[workspace.package]" && line.starts_with("rust-version") {
            return line.split('=').nth(1).expect("a value").trim().trim_matches('"').to_string();
        }
    }
    panic!("no rust-version in [workspace.package] of the root Cargo.toml");
}

/// `cargo metadata --locked --offline` of the workspace. Without network it can only read the
/// packages already downloaded, which after a build are those of the host: then the resolve is
/// filtered to the host (and the packages it leaves out are named on stderr).
fn cargo_metadata(root: &Path) -> serde_json::Value {
    let cargo = env!("CARGO");
    let run = |extra: &[&str]| {
        Command::new(cargo)
            .args(["metadata", "--locked", "--format-version", "1", "--offline"])
            .args(extra)
            .current_dir(root)
            .output()
            .expect("cargo metadata runs")
    };
    let mut out = run(&[]);
    if !out.status.success() {
        let version = Command::new(cargo).arg("-vV").output().expect("cargo -vV");
        let version = String::from_utf8_lossy(&version.stdout).into_owned();
        let host = version.lines().find_map(|l| l.strip_prefix("host: ")).expect("host in cargo -vV").to_string();
        let why = String::from_utf8_lossy(&out.stderr).lines().next().unwrap_or("").to_string();
        eprintln!("cargo metadata --offline: {why}\nchecking the packages of {host} only (`cargo fetch --locked` brings the others)");
        out = run(&["--filter-platform", &host]);
    }
    assert!(out.status.success(), "cargo metadata failed:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("cargo metadata JSON")
}

#[test]
fn no_dependency_needs_a_newer_rust_than_the_workspace() {
    let root = workspace_root();
    let declared = workspace_rust_version(&root);
    let meta = cargo_metadata(&root);
    let packages: BTreeMap<&str, &serde_json::Value> =
        meta["packages"].as_array().expect("packages").iter().map(|p| (p["id"].as_str().expect("id"), p)).collect();
    let describe = |p: &serde_json::Value| {
        format!("{} {}", p["name"].as_str().unwrap_or("?"), p["version"].as_str().unwrap_or("?"))
    };

    // Every member inherits the workspace's (else clippy's incompatible_msrv does not see it).
    let mut problems = Vec::new();
    for id in meta["workspace_members"].as_array().expect("workspace_members") {
        let p = packages[id.as_str().expect("id")];
        if p["rust_version"].as_str() != Some(declared.as_str()) {
            problems.push(format!(
                "{} declares rust-version {} instead of the workspace's {declared}: add `rust-version.workspace = true`",
                describe(p),
                p["rust_version"]
            ));
        }
    }

    let nodes = meta["resolve"]["nodes"].as_array().expect("resolve.nodes");
    assert!(nodes.len() > 100, "only {} resolved packages", nodes.len());
    let members: BTreeSet<&str> =
        meta["workspace_members"].as_array().expect("workspace_members").iter().filter_map(|m| m.as_str()).collect();
    let mut newest: Option<(Vec<u64>, String)> = None;
    for node in nodes {
        let id = node["id"].as_str().expect("id");
        if members.contains(id) {
            continue;
        }
        let p = packages[id];
        let Some(rv) = p["rust_version"].as_str() else { continue };
        let v = parse_version(rv);
        if v > parse_version(&declared) {
            problems.push(format!("{} declares rust-version {rv}, newer than the workspace's {declared}", describe(p)));
        }
        if newest.as_ref().is_none_or(|(n, _)| v > *n) {
            newest = Some((v, format!("{} ({rv})", describe(p))));
        }
    }
    eprintln!(
        "{} resolved dependencies; the newest rust-version among them: {}; the workspace's: {declared}",
        nodes.len() - members.len(),
        newest.map_or("none".to_string(), |(_, d)| d)
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Every member takes the workspace's lints (`unsafe_code = "forbid"`, clippy's `all` with
/// `incompatible_msrv` in it).
#[test]
fn every_crate_uses_the_workspace_lints() {
    let root = workspace_root();
    let mut missing = Vec::new();
    for member in workspace_members(&root) {
        let manifest = std::fs::read_to_string(root.join(&member).join("Cargo.toml")).expect("member Cargo.toml");
        let lines: Vec<&str> =
            manifest.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
        let inherits = lines.windows(2).any(|w| w[0] == "[lints]" && w[1].replace(' ', "") == "workspace=true");
        if !inherits {
            missing.push(format!("{member}/Cargo.toml: no `[lints] workspace = true`"));
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

/// README's layout table follows the tree, as the import graph is kept: every path it names
/// exists, and every top-level directory (hidden ones and `target/` aside) and every workspace
/// member has its row.
#[test]
fn the_readme_layout_table_follows_the_tree() {
    let root = workspace_root();
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let section = readme.split("\n## Layout\n").nth(1).expect("README has a Layout section");
    let table = section.split("\n## ").next().unwrap_or_default();
    let named: Vec<String> = table
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(String::from)
        .collect();
    assert!(named.len() >= 10, "the layout table has {} rows", named.len());
    for path in &named {
        assert!(root.join(path).exists(), "README's layout names {path}, which the tree does not have");
    }
    let mut dirs: Vec<String> = std::fs::read_dir(&root)
        .expect("the workspace root")
        .flatten()
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().into_string().ok())
        // What the quickstart's JavaScript example may leave at the root (.gitignore has it).
        .filter(|n| !n.starts_with('.') && n != "target" && n != "node_modules")
        .collect();
    dirs.extend(workspace_members(&root));
    for dir in dirs {
        let row = format!("{}/", dir.trim_end_matches('/'));
        assert!(named.contains(&row), "{row} has no row in README's layout table");
    }
}
