//! The Node package (`node/`): `cargo xtask node` installs its dev tools
//! (`npm ci`) and builds the addon with @napi-rs/cli; `cargo xtask test`
//! then runs its node:test suite. Both skip with a note where Node is absent.

use std::path::PathBuf;

use crate::root;

fn dir() -> PathBuf {
    root().join("node")
}

fn npm() -> &'static str {
    if cfg!(windows) {
        "npm.cmd"
    } else {
        "npm"
    }
}

fn in_node(program: &str, args: &[&str]) -> Result<(), String> {
    run_in(program, args, &dir())
}

fn run_in(program: &str, args: &[&str], cwd: &std::path::Path) -> Result<(), String> {
    crate::exec(std::path::Path::new(program), args, cwd, &[])
}

fn has_program(program: &str) -> bool {
    std::process::Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Whether node and npm are installed; says so when they are not.
pub fn available() -> bool {
    let ok = has_program("node") && has_program(npm());
    if !ok {
        eprintln!("\nxtask: skipping the Node package: node/npm not found");
    }
    ok
}

/// `npm ci` when `node_modules` is missing or older than the lock file.
fn install() -> Result<(), String> {
    let modified = |p: PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let lock = modified(dir().join("package-lock.json"));
    let installed = modified(dir().join("node_modules/.package-lock.json"));
    if matches!((lock, installed), (Some(l), Some(i)) if i >= l) {
        return Ok(());
    }
    in_node(npm(), &["ci", "--no-audit", "--no-fund"])
}

/// Installs the tools and builds the addon (release), then checks that the
/// committed `native.d.ts` matches what the build generated.
pub fn build() -> Result<(), String> {
    install()?;
    let dts = dir().join("native.d.ts");
    let before = std::fs::read_to_string(&dts).unwrap_or_default();
    in_node(npm(), &["run", "build"])?;
    let after = std::fs::read_to_string(&dts).map_err(|e| format!("native.d.ts: {e}"))?;
    if before != after {
        return Err(
            "node/native.d.ts drifted from the addon: the build regenerated it; commit it".into(),
        );
    }
    Ok(())
}

/// Builds the addon and runs the node:test suite (the leak test included).
pub fn test() -> Result<(), String> {
    if !available() {
        return Ok(());
    }
    build()?;
    let mut files: Vec<String> = std::fs::read_dir(dir().join("test"))
        .map_err(|e| format!("node/test: {e}"))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".test.js") || n.ends_with(".test.mjs"))
        .map(|n| format!("test/{n}"))
        .collect();
    files.sort();
    let mut args = vec!["--test", "--test-concurrency=1"];
    args.extend(files.iter().map(String::as_str));
    in_node("node", &args)
}
