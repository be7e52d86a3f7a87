//! The engine's layers import only downward: the import graph of `uswap/src`, read from its
//! `use` declarations and the `crate::`/`super::` paths in its code, has no cycle, and no
//! module imports from a layer above its own (`LAYERS`, bottom first; docs/design.md,
//! "Layers", draws it).
//!
//! The CLI (`uswap-cli`), the preload library (`uswap-preload`) and its first stage
//! (`uswap-shim`) are read the same way: their import graphs have no cycle either (a binary's
//! `main.rs` is its crate root).
//!
//! What counts as an import of module B by module A: a path in A's code (outside comments,
//! string literals and `#[cfg(test)]` modules) that names B or an item in it. Not counted: a
//! folder's `mod.rs` declaring its children (`mod x;`) and re-exporting their items
//! (`pub use x::Item;`), which is the folder's interface, not a dependency of its code.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers of `uswap/src`, bottom first. A module is placed by its first path segment
/// (`reclaim::swapout` is in `reclaim`'s layer); it may import from its own layer and those
/// below. Within a layer the graph must still be acyclic.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "the clock, the userfaultfd ABI, the engine's descriptors, the user's options",
        &["clock", "fd", "uffd", "options"],
    ),
    (
        "mappings, locks, queues, counters shared by processes",
        &["mapping", "sync", "fifo", "readahead", "shared_charge", "bounce", "pressure", "budget"],
    ),
    ("devices: where page contents go", &["backend"]),
    (
        "swap: entries, devices, the cluster allocator, the swap table and cache; counters",
        &["swap", "device_config", "error", "stats", "stats_server"],
    ),
    (
        "the page table's entries, the reclaim lists, the pins reclaim honours",
        &["page_table", "lru", "pin", "mlock", "fork_advice"],
    ),
    ("the pager's shared state, split by concern", &["state"]),
    ("regions: a mapping's page table, the registry the fault path searches", &["region"]),
    (
        "services: swap-in, reclaim, readahead, events, release, fault service",
        &["reclaim", "swapin", "async_readahead", "events", "release", "fault_service"],
    ),
    ("fault delivery: thread and signal", &["fault", "user_access", "core_dump"]),
    (
        "the pager: builder, handle, regions, adoption, fork; the system-call guard",
        &["pager", "region_handle", "adopt", "fork", "syscall_guard", "lib"],
    ),
];

/// The `src` folder of the workspace's crate `name` (`uswap`, `uswap-cli`, `uswap-preload`).
fn src_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(name).join("src")
}

/// Module path (`reclaim::swapout`, `lib` for the crate root) of every `.rs` file.
fn modules(dir: &Path, prefix: &[String], out: &mut BTreeMap<String, PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        let name = path.file_stem().and_then(|s| s.to_str()).expect("a UTF-8 name").to_string();
        if path.is_dir() {
            let mut p = prefix.to_vec();
            p.push(name);
            modules(&path, &p, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            let mut p = prefix.to_vec();
            if name != "mod" {
                p.push(name);
            }
            let key = if p.is_empty() { "lib".to_string() } else { p.join("::") };
            let key = if key == "lib" && !prefix.is_empty() { prefix.join("::") } else { key };
            out.insert(key, path);
        }
    }
}

/// The code of a file without comments, string and char literals, and `#[cfg(test)]` items.
fn code_of(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            while i < b.len() && !b[i..].starts_with(b"*/") {
                i += 1;
            }
            i += 2;
        } else if b[i] == b'r'
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))
            && matches!(b.get(i + 1), Some(b'"' | b'#'))
            && b[i + 1..].iter().find(|&&c| c != b'#') == Some(&b'"')
        {
            // A raw string, r"..." or r#"..."#: no escapes, ends at the quote and as many #.
            let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
            let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
            let body = i + 2 + hashes;
            let end = b[body..].windows(close.len()).position(|w| w == close.as_slice()).map_or(b.len(), |k| body + k);
            i = end + close.len();
            out.push_str("\"\"");
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('x', '\n'), not a lifetime.
            i += 2;
            while i < b.len() && b[i] != b'\'' {
                i += 1;
            }
            i += 1;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    strip_cfg_test(&out)
}

/// Drops every item under `#[cfg(test)]`: a `mod tests { ... }` block, or a `mod x;` line.
fn strip_cfg_test(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        let (semi, brace) = (after.find(';'), after.find('{'));
        let end = match (semi, brace) {
            (Some(s), Some(b)) if s < b => s + 1,
            (_, Some(b)) => {
                let mut depth = 0;
                let mut end = after.len();
                for (k, c) in after[b..].char_indices() {
                    depth += match c {
                        '{' => 1,
                        '}' => -1,
                        _ => 0,
                    };
                    if depth == 0 {
                        end = b + k + 1;
                        break;
                    }
                }
                end
            }
            (Some(s), None) => s + 1,
            (None, None) => after.len(),
        };
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// Every path the code names: `use` trees expanded, and `crate::`/`super::`/`self::` paths in
/// expressions and types. Paths are returned as segments; `pub use` of a child module's items
/// from a `mod.rs` is left out (see the module doc).
fn paths_in(code: &str, is_mod_rs: bool, children: &BTreeSet<String>) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let tokens = tokenize(code);
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i] == "use" {
            let is_pub = i > 0 && (tokens[i - 1] == "pub" || tokens[i - 1] == ")");
            let mut j = i + 1;
            let mut tree = Vec::new();
            while j < tokens.len() && tokens[j] != ";" {
                tree.push(tokens[j].clone());
                j += 1;
            }
            let mut expanded = Vec::new();
            expand_use(&tree, &mut 0, &[], &mut expanded);
            for p in expanded {
                let reexport = is_pub && is_mod_rs && p.first().is_some_and(|s| children.contains(s));
                if !reexport {
                    paths.push(p);
                }
            }
            i = j;
        } else if matches!(tokens[i].as_str(), "crate" | "super" | "self")
            && tokens.get(i + 1).is_some_and(|t| t == "::")
            && (i == 0 || tokens[i - 1] != "::")
        {
            let mut p = vec![tokens[i].clone()];
            let mut j = i + 1;
            while tokens.get(j).is_some_and(|t| t == "::") && tokens.get(j + 1).is_some_and(|t| is_ident(t)) {
                p.push(tokens[j + 1].clone());
                j += 2;
            }
            paths.push(p);
            i = j;
        } else {
            i += 1;
        }
    }
    paths
}

fn is_ident(t: &str) -> bool {
    t.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
}

fn tokenize(code: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let b: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_alphanumeric() || c == '_' {
            let s = i;
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_') {
                i += 1;
            }
            tokens.push(b[s..i].iter().collect());
        } else if c == ':' && b.get(i + 1) == Some(&':') {
            tokens.push("::".into());
            i += 2;
        } else if c.is_whitespace() {
            i += 1;
        } else {
            tokens.push(c.to_string());
            i += 1;
        }
    }
    tokens
}

/// Expands a `use` tree (`a::{b, c::{d, e as f}}`) into its paths.
fn expand_use(t: &[String], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let mut cur = prefix.to_vec();
    while *i < t.len() {
        match t[*i].as_str() {
            "{" => {
                *i += 1;
                loop {
                    expand_use(t, i, &cur, out);
                    match t.get(*i).map(String::as_str) {
                        Some(",") => *i += 1,
                        Some("}") => {
                            *i += 1;
                            return;
                        }
                        _ => return,
                    }
                    if t.get(*i).is_some_and(|s| s == "}") {
                        *i += 1;
                        return;
                    }
                }
            }
            "," | "}" => break,
            "::" => *i += 1,
            "as" => *i += 2,
            "*" => *i += 1,
            s => {
                cur.push(s.to_string());
                *i += 1;
            }
        }
    }
    if cur.len() > prefix.len() || !cur.is_empty() {
        out.push(cur);
    }
}

/// The module a path names (its longest prefix that is a module), seen from module `from`.
fn resolve(from: &str, path: &[String], mods: &BTreeMap<String, PathBuf>, is_mod_rs: bool) -> Option<String> {
    let here: Vec<String> = if from == "lib" { vec![] } else { from.split("::").map(String::from).collect() };
    // A file `a/b.rs` is module a::b, whose `super` is a; `a/mod.rs` is module a, whose `super`
    // is a's parent. `self` is the module itself.
    let mut base: Vec<String>;
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => {
            base = vec![];
            rest = &path[1..];
        }
        Some("self") => {
            base = here.clone();
            rest = &path[1..];
        }
        Some("super") => {
            base = here.clone();
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
        }
        Some(first) => {
            // A relative `use` of a child module (2018 paths), or an external crate.
            let child = if here.is_empty() { first.to_string() } else { format!("{}::{first}", here.join("::")) };
            if !mods.contains_key(&child) {
                return None;
            }
            base = here.clone();
        }
        None => return None,
    }
    let _ = is_mod_rs;
    let mut best = None;
    for k in 0..=rest.len() {
        let mut p = base.clone();
        p.extend(rest[..k].iter().cloned());
        let key = if p.is_empty() { "lib".to_string() } else { p.join("::") };
        if mods.contains_key(&key) {
            best = Some(key);
        }
    }
    best
}

fn import_graph() -> BTreeMap<String, BTreeSet<String>> {
    import_graph_of("uswap")
}

/// The import graph of crate `name`'s modules.
fn import_graph_of(name: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut mods = BTreeMap::new();
    modules(&src_dir(name), &[], &mut mods);
    // A binary's root is `main.rs`: the crate root, as `lib.rs` is.
    if let Some(main) = mods.remove("main") {
        mods.insert("lib".into(), main);
    }
    // Files that are `#[cfg(test)]` modules of their parent: not part of the engine.
    let test_files: BTreeSet<String> = mods.keys().filter(|m| m.ends_with("::tests")).cloned().collect();
    let mut graph = BTreeMap::new();
    for (m, path) in &mods {
        if test_files.contains(m) {
            continue;
        }
        let text = std::fs::read_to_string(path).expect("read a source file");
        let is_mod_rs = path.file_name().is_some_and(|n| n == "mod.rs" || n == "lib.rs" || n == "main.rs");
        let children: BTreeSet<String> = mods
            .keys()
            .filter_map(|k| {
                let rest = if m == "lib" { Some(k.as_str()) } else { k.strip_prefix(&format!("{m}::")) };
                rest.filter(|r| !r.contains("::")).map(String::from)
            })
            .collect();
        let deps: &mut BTreeSet<String> = graph.entry(m.clone()).or_default();
        for p in paths_in(&code_of(&text), is_mod_rs, &children) {
            if let Some(target) = resolve(m, &p, &mods, is_mod_rs) {
                if target != *m && !test_files.contains(&target) && target != "lib" {
                    deps.insert(target);
                }
            }
        }
    }
    graph
}

fn layer_of(module: &str) -> usize {
    let top = module.split("::").next().unwrap_or(module);
    LAYERS
        .iter()
        .position(|(_, mods)| mods.contains(&top))
        .unwrap_or_else(|| panic!("module {module} is in no layer: add it to LAYERS in tests/layers.rs"))
}

/// Every cycle's modules (strongly connected components of more than one module).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Kosaraju: order by finish time, then components on the reversed graph.
    fn visit(n: &str, g: &BTreeMap<String, BTreeSet<String>>, seen: &mut BTreeSet<String>, order: &mut Vec<String>) {
        let mut stack = vec![(n.to_string(), false)];
        while let Some((v, done)) = stack.pop() {
            if done {
                order.push(v);
                continue;
            }
            if !seen.insert(v.clone()) {
                continue;
            }
            stack.push((v.clone(), true));
            for w in g.get(&v).into_iter().flatten() {
                if !seen.contains(w) {
                    stack.push((w.clone(), false));
                }
            }
        }
    }
    let (mut seen, mut order) = (BTreeSet::new(), Vec::new());
    for n in graph.keys() {
        visit(n, graph, &mut seen, &mut order);
    }
    let mut reversed: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (a, bs) in graph {
        for b in bs {
            reversed.entry(b.clone()).or_default().insert(a.clone());
        }
    }
    let mut assigned = BTreeSet::new();
    let mut out = Vec::new();
    for n in order.iter().rev() {
        if assigned.contains(n) {
            continue;
        }
        let mut comp = Vec::new();
        visit(n, &reversed, &mut assigned, &mut comp);
        if comp.len() > 1 {
            comp.sort();
            out.push(comp);
        }
    }
    out
}

#[test]
fn the_import_graph_of_the_engine_has_no_cycle() {
    let graph = import_graph();
    assert!(graph.len() > 40, "only {} modules found: is the reader broken?", graph.len());
    assert_no_cycle("the engine", &graph);
}

#[test]
fn the_import_graphs_of_the_cli_and_the_preload_have_no_cycle() {
    for (name, at_least) in [("uswap-cli", 30), ("uswap-preload", 12), ("uswap-shim", 4)] {
        let graph = import_graph_of(name);
        assert!(graph.len() > at_least, "only {} modules found in {name}: is the reader broken?", graph.len());
        assert_no_cycle(name, &graph);
    }
}

fn assert_no_cycle(what: &str, graph: &BTreeMap<String, BTreeSet<String>>) {
    let found = cycles(graph);
    let mut report = String::new();
    for c in &found {
        report.push_str(&format!("cycle of {} modules:\n", c.len()));
        for a in c {
            let inside: Vec<&String> = graph[a].iter().filter(|b| c.contains(b)).collect();
            report.push_str(&format!("  {a} -> {inside:?}\n"));
        }
    }
    assert!(found.is_empty(), "{what}'s imports have cycles:\n{report}");
}

#[test]
fn no_module_imports_from_a_layer_above_its_own() {
    let graph = import_graph();
    let mut upward = Vec::new();
    for (a, bs) in &graph {
        for b in bs {
            if layer_of(b) > layer_of(a) {
                upward.push(format!("{a} ({}) -> {b} ({})", LAYERS[layer_of(a)].0, LAYERS[layer_of(b)].0));
            }
        }
    }
    assert!(upward.is_empty(), "imports that go up a layer:\n  {}", upward.join("\n  "));
}

#[test]
fn the_reader_sees_the_imports_it_must() {
    // The reader itself can fail silently (a missed path is a missed arrow): check it on a
    // few imports that exist, and on a `use` tree.
    let graph = import_graph();
    assert!(graph["uffd"].contains("fd"), "{:?}", graph["uffd"]);
    assert!(graph["reclaim::swapout"].contains("swap"), "{:?}", graph["reclaim::swapout"]);
    let mut out = Vec::new();
    let tokens = tokenize("crate::{a::{b, c as d}, e}");
    expand_use(&tokens, &mut 0, &[], &mut out);
    let want: Vec<Vec<String>> = [vec!["crate", "a", "b"], vec!["crate", "a", "c"], vec!["crate", "e"]]
        .iter()
        .map(|p| p.iter().map(|s| s.to_string()).collect())
        .collect();
    assert_eq!(out, want);
    // Strings (raw ones too), char literals and comments are not code.
    let code = code_of("let a = r#\"crate::a\"#; let b = \"crate::b\"; let c = '\"'; // crate::c\ncrate::d::e();");
    let paths = paths_in(&code, false, &BTreeSet::new());
    assert_eq!(paths, vec![vec!["crate".to_string(), "d".to_string(), "e".to_string()]]);
}
