//! The import rules of docs/ARCHITECTURE.md, checked on the source: the core (model,
//! actors, runtime, store, metrics, webhook delivery, agents, ...) never imports a wire
//! dialect or the HTTP layer, and one dialect never imports another.

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
        "bin" => "tool",
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
