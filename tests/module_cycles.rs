//! No import cycles among the modules of `src/` (docs/ARCHITECTURE.md: one
//! arrow per module boundary, along the data flow).
//!
//! Rule, applied in every directory: the directory's child modules (files
//! and subdirectories) are nodes; child A points at child B when code in A
//! names an item inside B (`use crate::…`, `super::…`, or a qualified path
//! in code). Edges to a module's own ancestors (a child using its parent's
//! items) are the normal shape of a Rust module tree and are not counted.
//! Any strongly connected set of two or more children is a cycle.
//!
//! Test code is not counted (tests may reach anywhere): an inline
//! `#[cfg(test)] mod tests { ... }` at the end of a file, and a module file
//! declared as `#[cfg(test)] mod name;`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Module = Vec<String>;

/// Every module file: its module path, source, and whether it is a
/// `mod.rs` / `lib.rs` / `main.rs` (its children live in its directory).
fn modules(root: &Path) -> BTreeMap<Module, (String, bool)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "rs") {
                let rel = p.strip_prefix(root).unwrap().with_extension("");
                let mut m: Module = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                let dir_module =
                    matches!(m.last().map(String::as_str), Some("mod" | "lib" | "main"));
                if dir_module {
                    m.pop();
                }
                out.insert(m, (std::fs::read_to_string(&p).unwrap(), dir_module));
            }
        }
    }
    out
}

/// The source without comments and string contents.
fn strip_all(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'r' && b.get(i + 1).is_some_and(|&c| c == b'"' || c == b'#') {
            // Raw string r"..." / r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while j < b.len() && b[j] == b'#' {
                hashes += 1;
                j += 1;
            }
            if j < b.len() && b[j] == b'"' {
                let close: Vec<u8> = std::iter::once(b'"')
                    .chain(std::iter::repeat_n(b'#', hashes))
                    .collect();
                j += 1;
                while j < b.len() && !b[j..].starts_with(&close) {
                    j += 1;
                }
                i = j + close.len();
                out.push_str("\"\"");
            } else {
                out.push('r');
                i += 1;
            }
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// [`strip_all`], and without the inline test module at the end.
fn strip(src: &str) -> String {
    let out = strip_all(src);
    match out.find("#[cfg(test)]\nmod tests {") {
        Some(at) => out[..at].to_string(),
        None => out,
    }
}

/// Module files a file declares under `#[cfg(test)]`: `mod name;` (the
/// child `name`) or `#[path = "file.rs"] mod name;` (the file beside the
/// declaring one). `m` is the declaring module; `is_dir_module` whether it
/// is a `mod.rs`/`lib.rs` (its children live in its own directory).
fn test_children(m: &Module, is_dir_module: bool, src: &str) -> Vec<Module> {
    let mut out = Vec::new();
    let mut rest = src;
    while let Some(at) = rest.find("#[cfg(test)]") {
        rest = &rest[at + "#[cfg(test)]".len()..];
        let mut decl = rest.trim_start();
        let mut path_stem = None;
        if let Some(p) = decl.strip_prefix("#[path") {
            let end = p.find(']').unwrap_or(0);
            let lit = p[..end]
                .trim()
                .trim_start_matches('=')
                .trim()
                .trim_matches('"');
            path_stem = Some(lit.trim_end_matches(".rs").to_string());
            decl = p[end + 1..].trim_start();
        }
        let decl = decl.strip_prefix("pub(crate) ").unwrap_or(decl);
        let decl = decl.strip_prefix("pub ").unwrap_or(decl);
        let Some(name) = decl.strip_prefix("mod ") else {
            continue;
        };
        let name: String = name
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() || !decl["mod ".len() + name.len()..].starts_with(';') {
            continue;
        }
        let mut child = m.clone();
        match path_stem {
            Some(stem) => {
                if !is_dir_module {
                    child.pop();
                }
                child.push(stem);
            }
            None => child.push(name),
        }
        out.push(child);
    }
    out
}

/// `use` trees expanded into full paths: `a::{b, c::{d, e}}` ->
/// `a::b`, `a::c::d`, `a::c::e`.
fn expand(tree: &str) -> Vec<String> {
    let Some(open) = tree.find('{') else {
        return vec![tree.split(" as ").next().unwrap().to_string()];
    };
    let (prefix, inner) = (&tree[..open], &tree[open + 1..tree.len() - 1]);
    let mut parts = Vec::new();
    let (mut depth, mut cur) = (0, String::new());
    for ch in inner.chars() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ => {}
        }
        if ch == ',' && depth == 0 {
            parts.push(std::mem::take(&mut cur));
        } else {
            cur.push(ch);
        }
    }
    parts.push(cur);
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .flat_map(|p| expand(&format!("{prefix}{p}")))
        .collect()
}

/// Paths named by a file: every `use` tree and every qualified path that
/// starts with `crate`, `super` or `self`.
fn paths(src: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = src;
    while let Some(at) = rest.find("use ") {
        let before = rest[..at].chars().last();
        rest = &rest[at + 4..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let Some(end) = rest.find(';') else { break };
        let tree: String = rest[..end].chars().filter(|c| !c.is_whitespace()).collect();
        for p in expand(&tree) {
            out.push(p.split("::").map(str::to_string).collect());
        }
    }
    let bytes = src.as_bytes();
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(at) = src[from..].find(start) {
            let at = from + at;
            from = at + start.len();
            if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
                continue;
            }
            let end = src[at..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .map_or(src.len(), |e| at + e);
            out.push(
                src[at..end]
                    .split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect(),
            );
        }
    }
    out
}

/// The module a path from module `cur` lands in (the longest prefix of
/// its absolute form that is a module).
fn resolve(
    cur: &Module,
    path: &[String],
    mods: &BTreeMap<Module, (String, bool)>,
) -> Option<Module> {
    let mut full: Module = match path.first()?.as_str() {
        "crate" => Vec::new(),
        "super" | "self" => cur.clone(),
        _ => return None,
    };
    let mut segs = path.iter().skip(usize::from(path[0] == "crate")).peekable();
    while let Some(s) = segs.peek() {
        match s.as_str() {
            "super" => {
                full.pop();
            }
            "self" => {}
            _ => break,
        }
        segs.next();
    }
    full.extend(segs.cloned());
    (0..=full.len())
        .rev()
        .map(|i| full[..i].to_vec())
        .find(|m| mods.contains_key(m))
}

fn is_prefix(a: &[String], b: &[String]) -> bool {
    a.len() <= b.len() && b[..a.len()] == *a
}

/// Strongly connected sets of two or more nodes (Tarjan).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        t.on.insert(v);
        for w in &t.g[v] {
            if !t.index.contains_key(w.as_str()) {
                visit(t, w);
                let lw = t.low[w.as_str()];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w.as_str()) {
                let iw = t.index[w.as_str()];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = t.stack.pop().unwrap();
                t.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g: graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

/// Every cycle, as "dir: [a, b, ...] (a -> b via file, ...)".
fn find_cycles(root: &Path) -> Vec<String> {
    let mut mods = modules(root);
    // Module files declared under #[cfg(test)] (read from the source with
    // its strings, which hold #[path] file names).
    let tests: Vec<Module> = mods
        .iter()
        .flat_map(|(m, (src, dir_module))| test_children(m, *dir_module, src))
        .collect();
    mods.retain(|m, _| !tests.iter().any(|t| is_prefix(t, m)));
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (m, (src, _)) in &mods {
        for p in paths(&strip(src)) {
            if let Some(t) = resolve(m, &p, &mods) {
                if t != *m {
                    edges.entry(m.clone()).or_default().insert(t);
                }
            }
        }
    }
    let dirs: BTreeSet<Module> = mods
        .keys()
        .flat_map(|m| (0..m.len()).map(|i| m[..i].to_vec()))
        .collect();
    let mut found = Vec::new();
    for d in &dirs {
        let child = |m: &Module| -> Option<String> {
            (m.len() > d.len() && is_prefix(d, m)).then(|| m[d.len()].clone())
        };
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut why: BTreeMap<(String, String), String> = BTreeMap::new();
        for m in mods.keys() {
            if let Some(c) = child(m) {
                g.entry(c).or_default();
            }
        }
        for (a, ts) in &edges {
            let Some(ca) = child(a) else { continue };
            for t in ts {
                if let Some(ct) = child(t) {
                    if ct != ca {
                        g.get_mut(&ca).unwrap().insert(ct.clone());
                        why.entry((ca.clone(), ct))
                            .or_insert_with(|| format!("{} -> {}", a.join("/"), t.join("/")));
                    }
                }
            }
        }
        for comp in cycles(&g) {
            let inside: Vec<String> = why
                .iter()
                .filter(|((a, b), _)| comp.contains(a) && comp.contains(b))
                .map(|(_, w)| w.clone())
                .collect();
            found.push(format!(
                "src/{}: {:?} ({})",
                d.join("/"),
                comp,
                inside.join(", ")
            ));
        }
    }
    found
}

#[test]
fn src_has_no_import_cycles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = find_cycles(&root);
    assert!(
        found.is_empty(),
        "import cycles among modules:\n{}",
        found.join("\n")
    );
}

/// The checker itself finds a cycle it is shown (it can fail), through a
/// `use` group, a `super::` path and a qualified path in code, and ignores
/// comments, strings, edges to a parent and test-only module files.
#[test]
fn the_checker_finds_planted_cycles() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::create_dir_all(src.join("b")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod a; mod b; mod c;\n").unwrap();
    std::fs::write(
        src.join("a/mod.rs"),
        "mod x; mod y; pub struct P;\n#[cfg(test)]\nmod t;\n",
    )
    .unwrap();
    // Test-only: its edges (a cycle with x) are not counted.
    std::fs::write(src.join("a/t.rs"), "use super::x::g; use crate::c::C;\n").unwrap();
    // Likewise one declared with #[path] from a non-mod.rs file.
    std::fs::write(
        src.join("a/y.rs"),
        "pub struct Y; fn f() { let _ = super::x::g(); }\n#[cfg(test)]\n#[path = \"y_tests.rs\"]\nmod tests;\n",
    )
    .unwrap();
    std::fs::write(src.join("a/y_tests.rs"), "use crate::c::C;\n").unwrap();
    std::fs::write(
        src.join("a/x.rs"),
        "use super::{P, y::Y};\n// use crate::c::C;\nconst S: &str = \"crate::c::C\";\n",
    )
    .unwrap();
    std::fs::write(src.join("b/mod.rs"), "fn f() { crate::c::h(); }\n").unwrap();
    std::fs::write(src.join("c.rs"), "use crate::{a::P, b};\n").unwrap();
    let found = find_cycles(src);
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(found[0].starts_with("src/: [\"b\", \"c\"]"), "{found:#?}");
    assert!(found[1].starts_with("src/a: [\"x\", \"y\"]"), "{found:#?}");
}
