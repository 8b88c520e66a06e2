//! Tidy: the layers ARCHITECTURE.md declares are the layers the code has (after
//! rust-analyzer's `tidy.rs`). It reads the document's *Layers* section and every
//! source file of each crate named there, and fails with the file and the path when:
//! - a module uses a module of a higher layer, or two modules form an import circle;
//! - a top-level module has no layer, or a layer names a module that does not exist;
//! - files form an import circle at any depth (`a/x.rs` ↔ `a/y.rs`; a child using its parent
//!   is the module tree, not a circle), or a production file says `use super::*`;
//! - a module uses an item of the crate root (`lib.rs`/`main.rs` are tables of contents);
//! - a module of a layer that says "leaves" uses any other module of its crate, or a module
//!   uses what its layer's "must not know:" names in backticks: a module of its crate, or an
//!   external crate (`axum`, `rusqlite`: a dependency in the crate's `Cargo.toml`, found by its
//!   `name::` paths); a backticked name that is neither fails too, so the prose stays true;
//! - a file is over [`LONG`] lines without a line at its top saying why;
//! - a file does not open with a `//!` comment saying its role;
//! - ARCHITECTURE.md is longer than [`MAP_LINES`] lines (it is the map; design notes go to
//!   `docs/`).
//!
//! Imports are read as text: every `crate::` path outside comments and outside
//! `#[cfg(test)]` modules (a module's unit tests may use any layer). Paths written with
//! `super::super::` would escape it, so they are refused too.
//! It knows nothing of what the modules do; only the document does.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Most lines of ARCHITECTURE.md.
const MAP_LINES: usize = 150;

/// Lines above which a file must say, at its top, why it is kept whole.
const LONG: usize = 800;

/// Phrases that count as saying why a long file is kept whole.
const LONG_REASONS: [&str; 3] = ["long because", "kept whole", "why this file"];

/// One crate's declared layers: module → layer number (1 = bottom), the layers of leaves, and
/// each layer's backticked "must not know" names.
#[derive(Debug, Default)]
struct Layers {
    of: BTreeMap<String, usize>,
    leaves: BTreeSet<usize>,
    not_known: BTreeMap<usize, BTreeSet<String>>,
}

/// The *Layers* section of ARCHITECTURE.md: `### <src dir>` headings, each followed by
/// numbered lines whose backticked names before the first ` — ` are that layer's modules. A
/// line whose description says "leaves" makes them leaves; the backticked lower-case names
/// after its "must not know:" are what they must not use.
fn declared(architecture: &str) -> BTreeMap<String, Layers> {
    let mut crates: BTreeMap<String, Layers> = BTreeMap::new();
    let mut in_section = false;
    let mut current: Option<String> = None;
    for line in architecture.lines() {
        if let Some(title) = line.strip_prefix("## ") {
            in_section = title.trim() == "Layers";
            current = None;
            continue;
        }
        if !in_section {
            continue;
        }
        if let Some(dir) = line.strip_prefix("### ") {
            let dir = dir.trim().trim_matches('`').to_string();
            crates.entry(dir.clone()).or_default();
            current = Some(dir);
            continue;
        }
        let Some(dir) = &current else { continue };
        let trimmed = line.trim_start();
        let Some((number, rest)) = trimmed.split_once(". ") else { continue };
        let Ok(layer) = number.parse::<usize>() else { continue };
        let (names, description) = rest.split_once(" — ").unwrap_or((rest, ""));
        let layers = crates.get_mut(dir).expect("entry made at its heading");
        for (i, piece) in names.split('`').enumerate() {
            if i % 2 == 1 {
                layers.of.insert(piece.to_string(), layer);
            }
        }
        if description.split(|c: char| !c.is_alphanumeric()).any(|w| w == "leaves") {
            layers.leaves.insert(layer);
        }
        if let Some((_, not_known)) = description.split_once("must not know:") {
            let names = not_known.split('`').skip(1).step_by(2);
            let names = names.filter(|n| {
                n.starts_with(|c: char| c.is_ascii_lowercase())
                    && n.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            });
            layers.not_known.entry(layer).or_default().extend(names.map(str::to_string));
        }
    }
    crates
}

/// The names of a crate's dependencies (`[dependencies]`, `[dependencies.name]` and
/// per-target tables; not dev-dependencies) as code writes them (`-` read as `_`).
fn dependencies(manifest: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut in_deps = false;
    for line in manifest.lines().map(str::trim) {
        if let Some(table) = line.strip_prefix('[') {
            let table = table.trim_end_matches(']');
            let last = table.rsplit('.').next().unwrap_or_default();
            in_deps = !table.starts_with("workspace") && (table == "dependencies" || table.ends_with(".dependencies"));
            if table.starts_with("dependencies.") || (table.contains("target.") && table.contains(".dependencies.")) {
                names.insert(last.replace('-', "_"));
            }
            continue;
        }
        if in_deps && let Some(key) = line.split(['=', '.']).next().map(str::trim).filter(|k| !k.is_empty()) {
            names.insert(key.trim_matches('"').replace('-', "_"));
        }
    }
    names
}

/// Whether `code` uses the external crate `name`: a path `name::…` that is not the tail of a
/// longer path (`crate::name::`, `other_name::`), or `use name;` / `use name as …`.
fn uses_crate(code: &str, name: &str) -> bool {
    let path = format!("{name}::");
    let mut from = 0;
    while let Some(i) = code[from..].find(&path) {
        let at = from + i;
        from = at + path.len();
        let before = code[..at].chars().next_back();
        if !before.is_some_and(|c| c == '_' || c == ':' || c == '$' || c.is_alphanumeric()) {
            return true;
        }
    }
    code.contains(&format!("use {name};")) || code.contains(&format!("use {name} as "))
}

/// Every `.rs` file under `dir`, sorted.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The top-level module a file belongs to; `None` for the crate roots.
fn top_module(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).expect("file under src");
    let mut parts = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned());
    let first = parts.next()?;
    let nested = rel.components().count() > 1;
    match first.strip_suffix(".rs") {
        Some("lib" | "main") if !nested => None,
        Some(stem) => Some(stem.to_string()),
        None => Some(first),
    }
}

/// `text` without `//` comments and without the bodies of test-only modules and items
/// (`#[cfg(test)]`, `#[cfg(all(test, …))]`) that end at their `;`. Returns the stripped text and the names of
/// out-of-line `#[cfg(test)] mod name;` modules.
fn production_code(text: &str) -> (String, Vec<String>) {
    let no_comments: String = text
        .lines()
        .map(|l| match l.find("//") {
            // Keep `://` in string literals such as URLs.
            Some(i) if !l[..i].ends_with(':') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = String::new();
    let mut test_files = Vec::new();
    let mut rest = no_comments.as_str();
    while let Some((at, attr)) = test_attribute(rest) {
        out.push_str(&rest[..at]);
        let after = &rest[at + attr..];
        let open = after.find('{');
        // An item ending at `;` before any `{`, or a block.
        let semi = after.find(';').filter(|s| open.is_none_or(|o| *s < o));
        let header_end = match (semi, open) {
            (Some(s), _) => {
                // `#[cfg(test)] mod name;` or `#[cfg(test)] use …;`
                let header = &after[..s];
                let item = header.trim();
                let item = item.strip_prefix("pub(crate) ").or_else(|| item.strip_prefix("pub ")).unwrap_or(item);
                if let Some(name) = item.strip_prefix("mod ") {
                    test_files.push(name.trim().to_string());
                }
                s + 1
            }
            (None, Some(o)) => block_end(after, o),
            (None, None) => after.len(),
        };
        rest = &after[header_end..];
    }
    out.push_str(rest);
    (out, test_files)
}

/// Where the block opening at `text[open]` (a `{`) ends: just past its `}`, counting braces
/// outside string and character literals (`"}"`, `r#"{"#`, `'{'`); the end of `text` if it
/// never closes.
fn block_end(text: &str, open: usize) -> usize {
    let b = text.as_bytes();
    let (mut depth, mut i) = (0usize, open);
    while i < b.len() {
        match b[i] {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            b'r' if matches!(b.get(i + 1), Some(b'"' | b'#'))
                && !b[..i].last().is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_') =>
            {
                let hashes = b[i + 1..].iter().take_while(|c| **c == b'#').count();
                if b.get(i + 1 + hashes) == Some(&b'"') {
                    let close: String = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
                    let body = i + 2 + hashes;
                    i = text[body..].find(&close).map_or(b.len(), |e| body + e + close.len());
                    continue;
                }
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'\'' => {
                // A character literal ('{', '\'', '\u{7d}'); a lifetime has no closing quote near.
                let len = if b.get(i + 1) == Some(&b'\\') { text[i + 2..].find('\'').map(|e| e + 2) } else { Some(2) };
                if let Some(len) = len
                    && b.get(i + len) == Some(&b'\'')
                {
                    i += len;
                }
            }
            _ => {}
        }
        i += 1;
    }
    b.len()
}

/// The first test-only attribute in `text` (`#[cfg(test)]`, or `#[cfg(all(test, …))]`): where
/// it starts and how long it is.
fn test_attribute(text: &str) -> Option<(usize, usize)> {
    let plain = text.find("#[cfg(test)]").map(|at| (at, "#[cfg(test)]".len()));
    let all = text.find("#[cfg(all(test").and_then(|at| Some((at, text[at..].find(")]")? + 2)));
    [plain, all].into_iter().flatten().min()
}

/// The first segment of every `crate::` path in `code` (`crate::{a, b::c}` gives `a`, `b`).
fn crate_paths(code: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let bytes = code.as_bytes();
    let mut from = 0;
    while let Some(i) = code[from..].find("crate::") {
        let at = from + i;
        from = at + "crate::".len();
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c == '$' || c == '_' || c.is_alphanumeric()) {
            continue;
        }
        if bytes.get(from) == Some(&b'{') {
            let mut depth = 0usize;
            let mut item = String::new();
            for ch in code[from..].chars() {
                match ch {
                    '{' => {
                        depth += 1;
                        if depth == 1 {
                            continue;
                        }
                    }
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => {
                        push_first_ident(&item, &mut found);
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                if depth >= 1 {
                    item.push(ch);
                }
            }
            push_first_ident(&item, &mut found);
        } else {
            push_first_ident(&code[from..], &mut found);
        }
    }
    found
}

fn push_first_ident(text: &str, into: &mut BTreeSet<String>) {
    let ident: String = text.trim_start().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
    if !ident.is_empty() && ident != "self" {
        into.insert(ident);
    }
}

/// Files declared `#[cfg(test)] mod name;` in `file`: `name.rs` or `name/` beside it.
fn test_module_files(file: &Path, names: &[String]) -> Vec<PathBuf> {
    let stem = file.file_stem().map(|s| s.to_string_lossy().into_owned());
    let dir = match stem.as_deref() {
        Some("mod" | "lib" | "main") => file.parent().map(Path::to_path_buf),
        Some(stem) => file.parent().map(|p| p.join(stem)),
        None => None,
    };
    let Some(dir) = dir else { return Vec::new() };
    names.iter().flat_map(|n| [dir.join(format!("{n}.rs")), dir.join(n).join("mod.rs")]).collect()
}

/// The edges `from → to` between top-level modules, each with the file that makes it.
type Edges = BTreeMap<(String, String), PathBuf>;

fn check_crate(root: &Path, dir: &str, layers: &Layers, problems: &mut Vec<String>) {
    let src = root.join(dir);
    let files = sources(&src);
    let mut modules: BTreeSet<String> = BTreeSet::new();
    let mut exempt: BTreeSet<PathBuf> = BTreeSet::new();
    let mut code: Vec<(PathBuf, Option<String>, String)> = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let (production, tests) = production_code(&text);
        exempt.extend(test_module_files(file, &tests));
        code.push((file.clone(), top_module(&src, file), production));
    }
    // Files of `#[cfg(test)] mod x;` modules (unit tests, a crate's `testing` fixtures) are
    // exempt, and a module made only of them needs no layer.
    let is_exempt = |file: &Path| exempt.iter().any(|e| file == e || file.starts_with(e.with_extension("")));
    let test_only: BTreeSet<String> =
        code.iter().filter(|(file, _, _)| is_exempt(file)).filter_map(|(_, top, _)| top.clone()).collect();
    code.retain(|(file, _, _)| !is_exempt(file));
    modules.extend(code.iter().filter_map(|(_, top, _)| top.clone()));
    let test_only: BTreeSet<String> = test_only.difference(&modules).cloned().collect();
    for module in &modules {
        if !layers.of.contains_key(module) {
            problems.push(format!("{dir}: module `{module}` has no layer in ARCHITECTURE.md"));
        }
    }
    for module in layers.of.keys() {
        if !modules.contains(module) {
            problems.push(format!("{dir}: ARCHITECTURE.md places `{module}`, which does not exist"));
        }
    }
    let manifest = src.parent().map(|c| c.join("Cargo.toml")).and_then(|m| std::fs::read_to_string(m).ok());
    let deps = dependencies(manifest.as_deref().unwrap_or_default());
    for (layer, names) in &layers.not_known {
        for name in names.iter().filter(|n| !modules.contains(*n) && !deps.contains(*n)) {
            problems.push(format!(
                "{dir}: layer {layer} must not know `{name}`, which is neither a module nor a dependency of the crate"
            ));
        }
    }
    let mut edges: Edges = BTreeMap::new();
    for (file, top, production) in &code {
        let Some(from) = top else { continue };
        let layer = layers.of.get(from).copied().unwrap_or_default();
        let not_known = layers.not_known.get(&layer);
        for name in not_known.into_iter().flatten().filter(|n| deps.contains(*n) && !modules.contains(*n)) {
            if uses_crate(production, name) {
                problems
                    .push(format!("{}: `{from}` (layer {layer}) must not know `{name}`, but uses it", file.display()));
            }
        }
        if production.contains("super::super::") {
            problems.push(format!("{}: write `crate::` paths, not `super::super::`", file.display()));
        }
        if production.contains("use super::*") {
            problems.push(format!("{}: `use super::*` outside tests; name what it uses", file.display()));
        }
        for used in crate_paths(production) {
            if used == *from || test_only.contains(&used) {
                continue;
            }
            if !modules.contains(&used) {
                problems.push(format!(
                    "{}: uses `crate::{used}` from the crate root; name the module that defines it",
                    file.display()
                ));
                continue;
            }
            if layers.leaves.contains(&layer) {
                problems.push(format!("{}: `{from}` is a leaf (layer {layer}) but uses `{used}`", file.display()));
            } else if not_known.is_some_and(|n| n.contains(&used)) {
                problems
                    .push(format!("{}: `{from}` (layer {layer}) must not know `{used}`, but uses it", file.display()));
            }
            let (a, b) = (layers.of.get(from), layers.of.get(&used));
            if let (Some(a), Some(b)) = (a, b)
                && b > a
            {
                problems.push(format!(
                    "{}: `{from}` (layer {a}) uses `{used}` (layer {b}), a higher layer",
                    file.display()
                ));
            }
            edges.entry((from.clone(), used)).or_insert_with(|| file.clone());
        }
    }
    for circle in circles(&modules, &edges) {
        let shown: Vec<String> = circle
            .windows(2)
            .map(|w| {
                let file = &edges[&(w[0].clone(), w[1].clone())];
                format!("{} → {} ({})", w[0], w[1], file.display())
            })
            .collect();
        problems.push(format!("{dir}: import circle: {}", shown.join(", ")));
    }
    let files: Vec<(PathBuf, String)> = code.iter().map(|(file, _, text)| (file.clone(), text.clone())).collect();
    for circle in file_circles(&src, &files) {
        problems.push(format!("{dir}: import circle between files: {circle}"));
    }
}

/// A file's module path in its crate: `a/b.rs` and `a/b/mod.rs` are `["a", "b"]`, the crate
/// root is `[]`.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).expect("file under src");
    let mut parts: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.strip_suffix(".rs").unwrap_or(&last).to_string();
    let root_file = parts.is_empty() && (stem == "lib" || stem == "main");
    if stem != "mod" && !root_file {
        parts.push(stem);
    }
    parts
}

/// Every path in `code` that starts with `start` (`crate::`, `super::` or `self::`), as its
/// segments after it: `crate::a::{b::C, d}` gives `[a, b, C]` and `[a, d]`.
fn paths_after(code: &str, start: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = code[from..].find(start) {
        let at = from + i;
        from = at + start.len();
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c == '$' || c == '_' || c == ':' || c.is_alphanumeric()) {
            continue;
        }
        tree(&code[from..], Vec::new(), &mut out);
    }
    out
}

/// Reads one use-tree at the start of `text` (segments joined by `::`, `{…}` groups of
/// comma-separated trees), pushing each leaf's full path (`prefix` then its segments); returns
/// the bytes read.
fn tree(text: &str, prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    let skip = |at: usize| at + (text[at..].len() - text[at..].trim_start().len());
    let mut path = prefix;
    let mut at = skip(0);
    loop {
        if text[at..].starts_with('{') {
            at += 1;
            loop {
                at = skip(at);
                if text[at..].starts_with('}') {
                    return at + 1;
                }
                at += tree(&text[at..], path.clone(), out);
                at = skip(at);
                if text[at..].starts_with(',') {
                    at += 1;
                } else {
                    // `}` or malformed: the group ends here.
                    return if text[at..].starts_with('}') { at + 1 } else { at };
                }
            }
        }
        let ident: String = text[at..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if ident.is_empty() {
            break;
        }
        at += ident.len();
        if ident != "self" {
            path.push(ident);
        }
        if !text[at..].starts_with("::") {
            break;
        }
        at = skip(at + 2);
    }
    if !path.is_empty() {
        out.push(path);
    }
    at
}

/// The longest prefix of `path` that is a module in `known`.
fn longest_module(path: &[String], known: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    (1..=path.len()).rev().map(|n| path[..n].to_vec()).find(|p| known.contains(p))
}

/// The modules a file's production `code` uses: its `crate::`, `super::` and `self::` paths
/// and the paths through the child modules it declares (`mod x;` … `x::f()`), each resolved
/// to the longest module path of the crate it names. `here` is the file's module.
fn used_modules(code: &str, here: &[String], known: &BTreeSet<Vec<String>>) -> BTreeSet<Vec<String>> {
    let mut used = BTreeSet::new();
    let mut resolve = |full: Vec<String>| {
        if let Some(m) = longest_module(&full, known) {
            used.insert(m);
        }
    };
    for p in paths_after(code, "crate::") {
        resolve(p);
    }
    let parent: Vec<String> = here[..here.len().saturating_sub(1)].to_vec();
    for p in paths_after(code, "super::") {
        resolve(parent.iter().cloned().chain(p).collect());
    }
    for p in paths_after(code, "self::") {
        resolve(here.iter().cloned().chain(p).collect());
    }
    let children: Vec<&Vec<String>> =
        known.iter().filter(|k| k.len() == here.len() + 1 && k.starts_with(here)).collect();
    for child in children {
        let name = child.last().expect("a child has a name");
        for p in paths_after(code, &format!("{name}::")) {
            resolve(child.iter().cloned().chain(p).collect());
        }
    }
    used
}

/// Import circles between files of the crate at `src` whose production code is `code`
/// (`(file, text)`), at any depth: an edge for every module a file uses, except its own
/// ancestors (a child using what its parent defines is the module tree, not a circle).
fn file_circles(src: &Path, code: &[(PathBuf, String)]) -> Vec<String> {
    let known: BTreeSet<Vec<String>> = code.iter().map(|(f, _)| module_path(src, f)).collect();
    let name = |m: &[String]| if m.is_empty() { "crate".to_string() } else { m.join("::") };
    let mut edges: Edges = BTreeMap::new();
    let mut modules: BTreeSet<String> = BTreeSet::new();
    for (file, text) in code {
        let here = module_path(src, file);
        modules.insert(name(&here));
        for used in used_modules(text, &here, &known) {
            if used == here || here.starts_with(&used) {
                continue;
            }
            edges.entry((name(&here), name(&used))).or_insert_with(|| file.clone());
        }
    }
    circles(&modules, &edges)
        .into_iter()
        .map(|circle| {
            let shown: Vec<String> = circle
                .windows(2)
                .map(|w| {
                    let file = &edges[&(w[0].clone(), w[1].clone())];
                    format!("{} → {} ({})", w[0], w[1], file.display())
                })
                .collect();
            shown.join(", ")
        })
        .collect()
}

/// One cycle per strongly connected component of more than one module, as a closed walk.
fn circles(modules: &BTreeSet<String>, edges: &Edges) -> Vec<Vec<String>> {
    let next = |m: &str| -> Vec<String> { edges.keys().filter(|(a, _)| a == m).map(|(_, b)| b.clone()).collect() };
    let reaches = |from: &str, to: &str| -> Option<Vec<String>> {
        // Breadth-first path from `from` to `to`.
        let mut parent: BTreeMap<String, String> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([from.to_string()]);
        while let Some(m) = queue.pop_front() {
            for n in next(&m) {
                if n == to {
                    let mut path = vec![to.to_string(), m.clone()];
                    let mut at = m;
                    while let Some(p) = parent.get(&at) {
                        path.push(p.clone());
                        at = p.clone();
                    }
                    path.reverse();
                    return Some(path);
                }
                if n != from && !parent.contains_key(&n) {
                    parent.insert(n.clone(), m.clone());
                    queue.push_back(n);
                }
            }
        }
        None
    };
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut out = Vec::new();
    for m in modules {
        if seen.contains(m) {
            continue;
        }
        if let Some(cycle) = reaches(m, m) {
            seen.extend(cycle.iter().cloned());
            out.push(cycle);
        }
    }
    out
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ is in the workspace").to_path_buf()
}

#[test]
fn layers_in_architecture_md_hold_in_the_code() {
    let root = workspace_root();
    let architecture = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let lines = architecture.lines().count();
    assert!(lines <= MAP_LINES, "ARCHITECTURE.md has {lines} lines, more than {MAP_LINES}: move design notes to docs/");
    let crates = declared(&architecture);
    for dir in ["functions/src", "gateway/src", "bridges/src", "scheduler/src", "ep/src", "storage/src", "src"] {
        assert!(crates.contains_key(dir), "ARCHITECTURE.md's Layers section has no `### {dir}`");
    }
    let mut problems = Vec::new();
    for (dir, layers) in &crates {
        check_crate(&root, dir, layers, &mut problems);
    }
    assert!(problems.is_empty(), "layering problems:\n  {}", problems.join("\n  "));
}

#[test]
fn every_source_file_says_its_role_and_long_ones_say_why() {
    let root = workspace_root();
    let mut problems = Vec::new();
    for dir in
        ["functions/src", "gateway/src", "bridges/src", "scheduler/src", "ep/src", "storage/src", "src", "tests/src"]
    {
        for file in sources(&root.join(dir)) {
            let text = std::fs::read_to_string(&file).expect("source file");
            let head: Vec<&str> = text.lines().take(4).collect();
            if !head.iter().any(|l| l.starts_with("//!")) {
                problems.push(format!("{}: no `//!` comment at its top saying its role", file.display()));
            }
            let lines = text.lines().count();
            let says_why = head.iter().any(|l| LONG_REASONS.iter().any(|r| l.to_lowercase().contains(r)));
            if lines > LONG && !says_why {
                problems.push(format!("{}: {lines} lines and no line at its top saying why", file.display()));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The checker itself refuses what it should: a fixture crate with an upward import,
/// a circle of modules and one of files, `use super::*`, a root item, an undeclared module, a
/// leaf that uses a module, and a module that uses a module or crate its layer must not know.
#[test]
fn the_checker_catches_upward_imports_circles_at_any_depth_root_items_and_unplaced_modules() {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path().join("fix/src");
    std::fs::create_dir_all(src.join("store")).expect("mkdir");
    std::fs::write(
        dir.path().join("fix/Cargo.toml"),
        "[dependencies]\naxum.workspace = true\n[dev-dependencies]\nrusqlite = \"1\"\n",
    )
    .expect("write");
    let write = |p: &str, t: &str| std::fs::write(src.join(p), t).expect("write");
    write(
        "lib.rs",
        "//! root\npub struct Shared;\nmod store; mod api; mod extra; mod util;\n#[cfg(test)]\nmod testing;\n",
    );
    write("testing.rs", "//! fixtures\nuse crate::api;\n");
    // A brace in a test's string literal does not end the test module early.
    let store = "//! store\nuse crate::api::Handler;\nfn router() -> axum::Router { todo!() }\n#[cfg(test)]\nmod tests { const C: &str = \"}\"; use crate::extra::X; use super::super::Z; }\n";
    write("store/mod.rs", store);
    write(
        "store/rows.rs",
        "//! rows\nuse crate::{store::Row, Shared};\nuse crate::store::keys::Key;\nuse crate::extra::Y;\n",
    );
    // A circle one level down, which the modules' graph cannot see; paths that only end in a
    // forbidden crate's name are not that crate.
    write(
        "store/keys.rs",
        "//! keys\nuse super::{rows::Rows, Row};\nuse super::*;\ntype T = (not_axum::X, other::axum::Y);\n",
    );
    write("api.rs", "//! api\nuse crate::store;\n// use crate::nowhere;\nuse rusqlite::Connection;\n");
    write("extra.rs", "//! extra\n");
    write("util.rs", "//! util\nuse crate::extra::Z;\n");
    let layers = declared(
        "## Layers\n### fix/src\n1. `util` — leaves\n2. `store` — the store; must not know: `axum`, `extra`, `nowhere_crate`, `Shared`\n3. `api`, `gone` — the api; must not know: `rusqlite`\n## Next\n1. `extra` — not in the section\n",
    );
    let mut problems = Vec::new();
    assert_eq!(layers.len(), 1, "only the Layers section counts");
    check_crate(dir.path(), "fix/src", &layers["fix/src"], &mut problems);
    let all = problems.join("\n");
    assert!(all.contains("`store` (layer 2) uses `api` (layer 3)"), "{all}");
    assert!(all.contains("import circle: "), "{all}");
    assert!(all.contains("uses `crate::Shared` from the crate root"), "{all}");
    assert!(all.contains("module `extra` has no layer"), "{all}");
    assert!(all.contains("places `gone`, which does not exist"), "{all}");
    assert!(all.contains("import circle between files: store::keys → store::rows"), "{all}");
    assert!(
        all.contains("import circle between files: api → store"),
        "the modules' circle, seen from the files: {all}"
    );
    assert!(all.contains("store/keys.rs: `use super::*` outside tests"), "{all}");
    assert!(all.contains("util.rs: `util` is a leaf (layer 1) but uses `extra`"), "{all}");
    assert!(all.contains("rows.rs: `store` (layer 2) must not know `extra`, but uses it"), "{all}");
    assert!(all.contains("store/mod.rs: `store` (layer 2) must not know `axum`, but uses it"), "{all}");
    assert!(all.contains("must not know `nowhere_crate`, which is neither a module nor a dependency"), "{all}");
    assert!(
        all.contains("must not know `rusqlite`, which is neither"),
        "a dev-dependency is not the crate's dependency: {all}"
    );
    assert!(!all.contains("keys.rs: `store` (layer 2) must not know `axum`"), "`not_axum::` is not axum: {all}");
    assert!(!all.contains("nowhere`"), "comments are not code: {all}");
    assert!(!all.contains("super::super"), "a test module's string does not end it: {all}");
    assert!(!all.contains("`store` (layer 2) uses `extra`"), "unit tests are exempt: {all}");
    assert_eq!(problems.len(), 13, "{all}");
}
