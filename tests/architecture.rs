//! The import rules of docs/ARCHITECTURE.md, checked on the source: the core (model,
//! actors, runtime, store, metrics, webhook delivery, agents, ...) never imports a wire
//! dialect or the HTTP layer, one dialect never imports another, and the core's import
//! graph has no circle.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file under `src/`, e.g. `rpc/seed/params`.
fn module(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src");
    rel.with_extension("").to_string_lossy().replace('\\', "/")
}

/// Lines that are code (not comments), with their numbers.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim_start()))
        .filter(|(_, l)| !l.starts_with("//"))
}

/// The layer a module belongs to.
fn layer(module: &str) -> &'static str {
    let top = module.split('/').next().unwrap_or(module);
    match top {
        "http" | "server" | "main" | "lib" | "fuzzing" => "edge",
        "rpc" if module.starts_with("rpc/seed") => "dialect:seed",
        "rpc" if module.starts_with("rpc/a2a") => "dialect:a2a",
        "rpc" => "rpc",
        "bin" | "build" => "tool",
        _ => "core",
    }
}

#[test]
fn the_core_imports_no_dialect_and_no_dialect_imports_another() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 20, "found the sources");
    let mut violations = Vec::new();
    for file in &files {
        let module = module(&src, file);
        let layer = layer(&module);
        let text = std::fs::read_to_string(file).expect("read");
        for (n, line) in code_lines(&text) {
            let forbidden: &[&str] = match layer {
                "core" => &[
                    "crate::rpc",
                    "crate::http",
                    "crate::server",
                    "rpc::seed",
                    "rpc::a2a",
                ],
                "dialect:seed" => &["rpc::a2a", "crate::http"],
                "dialect:a2a" => &["rpc::seed", "crate::http"],
                "rpc" => &["crate::http"],
                _ => &[],
            };
            for f in forbidden {
                if line.contains(f) {
                    violations.push(format!("{module}:{n} ({layer}) uses {f}: {line}"));
                }
            }
        }
    }
    assert!(
        violations.is_empty(),
        "import rules broken:\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_core_modules_are_where_the_rules_expect_them() {
    // A guard on the guard: if these moved, the layer table above must move with them.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for core in [
        "model.rs",
        "actors.rs",
        "runtime.rs",
        "store.rs",
        "metrics.rs",
        "webhook.rs",
        "push.rs",
    ] {
        assert!(src.join(core).exists(), "{core}");
        assert_eq!(layer(core.trim_end_matches(".rs")), "core");
    }
    assert_eq!(layer("rpc/seed/params"), "dialect:seed");
    assert_eq!(layer("rpc/a2a/v10"), "dialect:a2a");
}

/// Backends never meet the actor system: the agent modules import neither the actors, the
/// runtime, nor ractor (a task's updates reach its actor through a sink the actors
/// implement).
#[test]
fn the_agent_modules_import_no_actor_and_no_runtime() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![src.join("agent.rs")];
    rust_files(&src.join("agent"), &mut files);
    let mut violations = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read");
        for (n, line) in code_lines(&text) {
            for forbidden in ["crate::actors", "crate::runtime", "ractor"] {
                if line.contains(forbidden) {
                    violations.push(format!("{}:{n}: {forbidden}", file.display()));
                }
            }
        }
    }
    assert!(violations.is_empty(), "{violations:#?}");
}

// === the import graph ===

/// The module a `crate::`/`super::`/`self::` path (or a child module's path) names: the
/// longest prefix that is a file, with the crate root's re-exports followed.
fn resolve(
    files: &std::collections::BTreeSet<String>,
    reexports: &std::collections::HashMap<String, String>,
    from: &str,
    path: &[&str],
) -> Option<String> {
    let here: Vec<&str> = if from == "lib" {
        Vec::new()
    } else {
        from.split('/').collect()
    };
    let mut segs = path;
    let mut full: Vec<&str> = match segs.first() {
        Some(&"crate") => {
            segs = &segs[1..];
            if let Some(first) = segs.first()
                && let Some(module) = reexports.get(*first)
            {
                return Some(module.clone());
            }
            Vec::new()
        }
        Some(&"self") => {
            segs = &segs[1..];
            here.clone()
        }
        _ => {
            let mut base = here.clone();
            while segs.first() == Some(&"super") {
                base.pop();
                segs = &segs[1..];
            }
            base
        }
    };
    full.extend_from_slice(segs);
    (0..=full.len()).rev().find_map(|i| {
        let key = if i == 0 {
            "lib".to_string()
        } else {
            full[..i].join("/")
        };
        files.contains(&key).then_some(key)
    })
}

/// Code without comments, string literals and the unit tests at the end of a file.
fn code_only(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("//") {
            continue;
        }
        if line.starts_with("#[cfg(test)]") {
            break;
        }
        let mut in_str = false;
        let mut escaped = false;
        let mut prev = ' ';
        for c in line.chars() {
            if !in_str && c == '/' && prev == '/' {
                out.pop();
                break;
            }
            prev = c;
            if in_str {
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == '"' {
                    in_str = false;
                    out.push('"');
                }
                continue;
            }
            if c == '"' {
                in_str = true;
            }
            out.push(c);
        }
        out.push('\n');
    }
    out
}

/// The paths a file names: `use` trees expanded, and every `crate::…`/`super::…` or
/// `<child module>::…` path in its code.
fn named_paths(code: &str) -> Vec<Vec<String>> {
    fn expand(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
        let tree = tree.trim();
        if let Some(open) = tree.find('{') {
            let head: Vec<String> = tree[..open]
                .split("::")
                .filter(|s| !s.trim().is_empty())
                .map(|s| s.trim().to_string())
                .collect();
            let mut base = prefix.to_vec();
            base.extend(head);
            let close = tree.rfind('}').filter(|c| *c > open).unwrap_or(tree.len());
            let inner = &tree[open + 1..close];
            let (mut depth, mut start) = (0, 0);
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand(&base, &inner[start..i], out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            expand(&base, &inner[start..], out);
        } else if !tree.is_empty() {
            let name = tree.split(" as ").next().unwrap_or(tree);
            let mut path = prefix.to_vec();
            path.extend(name.split("::").map(|s| s.trim().to_string()));
            out.push(path);
        }
    }
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let children: Vec<String> = code
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let rest = l
                .strip_prefix("pub(crate) ")
                .or(l.strip_prefix("pub "))
                .unwrap_or(l);
            let name = rest.strip_prefix("mod ")?.strip_suffix(';')?;
            Some(name.trim().to_string())
        })
        .collect();
    let mut out = Vec::new();
    // `use` statements (which may span lines).
    let mut statement: Option<String> = None;
    for line in code.lines() {
        let l = line.trim();
        if statement.is_none() {
            let rest = l
                .strip_prefix("pub(crate) ")
                .or(l.strip_prefix("pub "))
                .unwrap_or(l);
            if let Some(tree) = rest.strip_prefix("use ") {
                statement = Some(tree.to_string());
            }
        } else if let Some(s) = statement.as_mut() {
            s.push_str(l);
        }
        if let Some(s) = statement.take_if(|s| s.contains(';')) {
            expand(&[], s.split(';').next().unwrap_or(""), &mut out);
        }
    }
    // Paths in expressions and types.
    let roots: Vec<&str> = ["crate", "super"]
        .into_iter()
        .chain(children.iter().map(String::as_str))
        .collect();
    let bytes: Vec<char> = code.chars().collect();
    let text: String = bytes.iter().collect();
    for root in roots {
        let pat = format!("{root}::");
        let mut from = 0;
        while let Some(i) = text[from..].find(&pat) {
            let at = from + i;
            from = at + pat.len();
            let prev = text[..at].chars().next_back();
            if prev.is_some_and(|c| ident(c) || c == ':') {
                continue;
            }
            let path: String = text[at..]
                .chars()
                .take_while(|c| ident(*c) || *c == ':')
                .collect();
            let mut segs: Vec<String> = path
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            if root != "crate" && root != "super" {
                segs.insert(0, "self".to_string());
            }
            out.push(segs);
        }
    }
    out.retain(|p| {
        matches!(
            p.first().map(String::as_str),
            Some("crate" | "super" | "self")
        ) || p.first().is_some_and(|f| children.contains(f))
    });
    for p in &mut out {
        if p.first().is_some_and(|f| children.contains(f)) {
            p.insert(0, "self".to_string());
        }
    }
    out
}

/// Every module's imports of other modules (file to file).
fn import_graph() -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    rust_files(&src, &mut paths);
    let files: std::collections::BTreeSet<String> = paths.iter().map(|p| module(&src, p)).collect();
    // The crate root's `pub use a::b::{X, Y}`: X and Y live in a/b (or its nearest file).
    let lib = code_only(&std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs"));
    let mut reexports = std::collections::HashMap::new();
    for path in named_paths(&lib) {
        let Some(name) = path.last() else { continue };
        let mut module = path[..path.len() - 1].join("/");
        while !module.is_empty() && !files.contains(&module) {
            module = module
                .rsplit_once('/')
                .map_or(String::new(), |(m, _)| m.to_string());
        }
        if !module.is_empty() {
            reexports.insert(name.clone(), module);
        }
    }
    let mut graph = std::collections::BTreeMap::new();
    for file in &paths {
        let from = module(&src, file);
        let code = code_only(&std::fs::read_to_string(file).expect("read"));
        let mut to = std::collections::BTreeSet::new();
        for path in named_paths(&code) {
            let segs: Vec<&str> = path.iter().map(String::as_str).collect();
            if let Some(m) = resolve(&files, &reexports, &from, &segs)
                && m != from
            {
                to.insert(m);
            }
        }
        graph.insert(from, to);
    }
    graph
}

/// The circles of a graph (its strongly connected parts of more than one node).
fn circles(
    graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
) -> Vec<Vec<String>> {
    // Kosaraju: order by finish time, then walk the reversed graph.
    fn visit(
        node: &str,
        graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
        seen: &mut std::collections::BTreeSet<String>,
        order: &mut Vec<String>,
    ) {
        if !seen.insert(node.to_string()) {
            return;
        }
        for next in graph.get(node).into_iter().flatten() {
            visit(next, graph, seen, order);
        }
        order.push(node.to_string());
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut order = Vec::new();
    for node in graph.keys() {
        visit(node, graph, &mut seen, &mut order);
    }
    let mut reversed: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        std::collections::BTreeMap::new();
    for (from, tos) in graph {
        for to in tos {
            reversed.entry(to.clone()).or_default().insert(from.clone());
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for node in order.iter().rev() {
        let mut part = Vec::new();
        visit(node, &reversed, &mut seen, &mut part);
        if part.len() > 1 {
            part.sort();
            out.push(part);
        }
    }
    out
}

/// The core reads one way (docs/ARCHITECTURE.md, "Who imports whom"): among its rooms (the
/// top-level modules: model, store, actors, runtime, stream, agent, ...) no two import each
/// other, directly or around a circle; and inside a room, no two sibling files do (a room's
/// front file may use its children and they it: that is the room's door, not a circle).
#[test]
fn the_core_has_no_import_circle() {
    let graph = import_graph();
    assert!(
        graph
            .get("actors/task")
            .is_some_and(|t| t.contains("stream")),
        "the import graph sees the task actor's imports: {:?}",
        graph.get("actors/task")
    );
    let room = |m: &str| m.split('/').next().unwrap_or(m).to_string();
    let mut rooms: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        std::collections::BTreeMap::new();
    let mut siblings: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        std::collections::BTreeMap::new();
    let parent = |m: &str| m.rsplit_once('/').map(|(p, _)| p.to_string());
    for (from, tos) in &graph {
        if layer(from) != "core" {
            continue;
        }
        for to in tos.iter().filter(|t| layer(t) == "core") {
            if room(from) != room(to) {
                rooms.entry(room(from)).or_default().insert(room(to));
            } else if parent(from).is_some() && parent(from) == parent(to) {
                siblings.entry(from.clone()).or_default().insert(to.clone());
            }
        }
    }
    let found: Vec<_> = circles(&rooms)
        .into_iter()
        .chain(circles(&siblings))
        .collect();
    assert!(found.is_empty(), "import circles in the core: {found:?}");
}

/// The edge reads one way too (docs/ARCHITECTURE.md): the listener (`server`) uses the
/// service (`http`), never the reverse; nothing below the edge (`rpc`, the dialects, the
/// core) imports either; the service's front file (`http.rs`) names no dialect; and the
/// edge admits in one place: only `http/admit` authenticates a caller, checks the agents
/// its key may use or makes a call's context.
#[test]
fn the_edge_admits_in_one_place_and_nothing_below_imports_it() {
    let graph = import_graph();
    let under = |m: &str, room: &str| m == room || m.starts_with(&format!("{room}/"));
    let mut violations = Vec::new();
    for (from, tos) in &graph {
        for to in tos {
            if under(to, "server") && (layer(from) != "edge" || under(from, "http")) {
                violations.push(format!("{from} imports {to}: only the top of the edge may"));
            }
            if under(to, "http") && layer(from) != "edge" {
                violations.push(format!("{from} ({}) imports the edge ({to})", layer(from)));
            }
        }
    }
    let front = graph.get("http").expect("src/http.rs");
    for to in front {
        if under(to, "rpc/a2a") || under(to, "rpc/seed") {
            violations.push(format!("http imports the dialect module {to}"));
        }
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![src.join("http.rs")];
    rust_files(&src.join("http"), &mut files);
    for file in files {
        let module = module(&src, &file);
        if module == "http/admit" {
            continue;
        }
        let code = code_only(&std::fs::read_to_string(&file).expect("read"));
        for rule in [".authenticate(", ".may_use(", "CallContext {"] {
            if code.contains(rule) {
                violations.push(format!(
                    "{module} admits on its own ({rule}); use http/admit"
                ));
            }
        }
    }
    assert!(violations.is_empty(), "{violations:#?}");
}

#[test]
fn the_circle_check_sees_a_circle() {
    // A guard on the guard: two rooms that import each other are found.
    let mut graph = std::collections::BTreeMap::new();
    graph.insert("a".to_string(), ["b".to_string()].into());
    graph.insert("b".to_string(), ["c".to_string()].into());
    graph.insert("c".to_string(), ["a".to_string()].into());
    graph.insert("d".to_string(), ["a".to_string()].into());
    assert_eq!(circles(&graph), vec![vec!["a", "b", "c"]]);
    let code = code_only(
        "use crate::{model::{TaskKey, TaskEvent}, store::cluster::Watch};\nfn f() { crate::runtime::remote::spawn(); } // crate::http\n",
    );
    let paths = named_paths(&code);
    assert!(
        paths.contains(&vec![
            "crate".into(),
            "store".into(),
            "cluster".into(),
            "Watch".into()
        ]),
        "{paths:?}"
    );
    assert!(
        paths
            .iter()
            .any(|p| p.get(1).is_some_and(|s| s == "runtime")),
        "{paths:?}"
    );
    assert!(
        !paths.iter().any(|p| p.get(1).is_some_and(|s| s == "http")),
        "{paths:?}"
    );
}
