//! Tidy: the layers ARCHITECTURE.md declares are the layers the code has (after
//! rust-analyzer's `tidy.rs`). It reads the document's *Layers* section and every
//! source file of each crate named there, and fails with the file and the path when:
//! - a module uses a module of a higher layer, or two modules form an import circle;
//! - a top-level module has no layer, or a layer names a module that does not exist;
//! - a module uses an item of the crate root (`lib.rs`/`main.rs` are tables of contents);
//! - a file is over [`LONG`] lines without a line at its top saying why;
//! - a file does not open with a `//!` comment saying its role.
//!
//! Imports are read as text: every `crate::` path outside comments and outside
//! `#[cfg(test)]` modules (a module's unit tests may use any layer). Paths written with
//! `super::super::` would escape it, so they are refused too.
//! It knows nothing of what the modules do; only the document does.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Lines above which a file must say, at its top, why it is kept whole.
const LONG: usize = 800;

/// Phrases that count as saying why a long file is kept whole.
const LONG_REASONS: [&str; 3] = ["long because", "kept whole", "why this file"];

/// One crate's declared layers: module → layer number (1 = bottom).
#[derive(Debug, Default)]
struct Layers {
    of: BTreeMap<String, usize>,
}

/// The *Layers* section of ARCHITECTURE.md: `### <src dir>` headings, each followed by
/// numbered lines whose backticked names before the first ` — ` are that layer's modules.
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
        let names = rest.split(" — ").next().unwrap_or_default();
        let layers = crates.get_mut(dir).expect("entry made at its heading");
        for (i, piece) in names.split('`').enumerate() {
            if i % 2 == 1 {
                layers.of.insert(piece.to_string(), layer);
            }
        }
    }
    crates
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

/// `text` without `//` comments and without the bodies of `#[cfg(test)]` modules and
/// `#[cfg(test)]` items that end at their `;`. Returns the stripped text and the names of
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
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
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
            (None, Some(o)) => {
                let mut depth = 0usize;
                let mut end = after.len();
                for (i, ch) in after[o..].char_indices() {
                    match ch {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = o + i + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (None, None) => after.len(),
        };
        rest = &after[header_end..];
    }
    out.push_str(rest);
    (out, test_files)
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
    let mut edges: Edges = BTreeMap::new();
    for (file, top, production) in &code {
        let Some(from) = top else { continue };
        if production.contains("super::super::") {
            problems.push(format!("{}: write `crate::` paths, not `super::super::`", file.display()));
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
    let crates = declared(&architecture);
    for dir in ["functions/src", "gateway/src", "scheduler/src", "ep/src", "storage/src", "src"] {
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
    for dir in ["functions/src", "gateway/src", "scheduler/src", "ep/src", "storage/src", "src", "tests/src"] {
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
/// a circle, a root item, and an undeclared module.
#[test]
fn the_checker_catches_upward_imports_circles_root_items_and_unplaced_modules() {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path().join("fix/src");
    std::fs::create_dir_all(src.join("store")).expect("mkdir");
    let write = |p: &str, t: &str| std::fs::write(src.join(p), t).expect("write");
    write("lib.rs", "//! root\npub struct Shared;\nmod store; mod api; mod extra;\n#[cfg(test)]\nmod testing;\n");
    write("testing.rs", "//! fixtures\nuse crate::api;\n");
    write("store/mod.rs", "//! store\nuse crate::api::Handler;\n#[cfg(test)]\nmod tests { use crate::extra::X; }\n");
    write("store/rows.rs", "//! rows\nuse crate::{store::Row, Shared};\n");
    write("api.rs", "//! api\nuse crate::store;\n// use crate::nowhere;\n");
    write("extra.rs", "//! extra\n");
    let layers = declared(
        "## Layers\n### fix/src\n1. `store` — the store\n2. `api`, `gone` — the api\n## Next\n1. `extra` — not in the section\n",
    );
    let mut problems = Vec::new();
    assert_eq!(layers.len(), 1, "only the Layers section counts");
    check_crate(dir.path(), "fix/src", &layers["fix/src"], &mut problems);
    let all = problems.join("\n");
    assert!(all.contains("`store` (layer 1) uses `api` (layer 2)"), "{all}");
    assert!(all.contains("import circle: "), "{all}");
    assert!(all.contains("uses `crate::Shared` from the crate root"), "{all}");
    assert!(all.contains("module `extra` has no layer"), "{all}");
    assert!(all.contains("places `gone`, which does not exist"), "{all}");
    assert!(!all.contains("nowhere"), "comments are not code: {all}");
    assert!(!all.contains("`store` (layer 1) uses `extra`"), "unit tests are exempt: {all}");
    assert_eq!(problems.len(), 5, "{all}");
}
