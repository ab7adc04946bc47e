//! The Node package (`node/`): `cargo xtask node` installs its dev tools
//! (`npm ci`) and builds the addon with @napi-rs/cli; `cargo xtask test`
//! then runs its node:test suite. Both fail where Node is absent, as the
//! Python and Kotlin tasks do where their tools are: a suite skipped with a
//! note would let `cargo xtask test` report all green without it.

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

/// Fails unless node and npm are installed.
fn require_node() -> Result<(), String> {
    for program in ["node", npm()] {
        if !crate::succeeds(program, &["--version"]) {
            return Err(format!(
                "cannot start `{program} --version`: the Node package needs Node 20 and npm"
            ));
        }
    }
    Ok(())
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

/// `cargo xtask node`: installs the tools and builds the addon (release),
/// regenerating `native.d.ts`; fails if that changed it, so that the new
/// file gets committed.
pub fn build() -> Result<(), String> {
    build_checking(Drift::Keep)
}

/// What to do with a regenerated `native.d.ts` that differs from the
/// committed one.
#[derive(PartialEq)]
enum Drift {
    /// Keep it (to commit it) and fail.
    Keep,
    /// Put the committed one back and fail: the check fails again on the
    /// next run, instead of passing because the first run rewrote the file.
    Restore,
}

fn build_checking(drift: Drift) -> Result<(), String> {
    require_node()?;
    install()?;
    let dts = dir().join("native.d.ts");
    let before = std::fs::read_to_string(&dts).unwrap_or_default();
    in_node(npm(), &["run", "build"])?;
    let after = std::fs::read_to_string(&dts).map_err(|e| format!("native.d.ts: {e}"))?;
    if before == after {
        return Ok(());
    }
    if drift == Drift::Restore {
        std::fs::write(&dts, &before).map_err(|e| format!("native.d.ts: {e}"))?;
        return Err(
            "node/native.d.ts drifted from the addon: run `cargo xtask node` and commit it".into(),
        );
    }
    Err("node/native.d.ts drifted from the addon: the build regenerated it; commit it".into())
}

/// Builds the addon and runs the node:test suite (the leak test included).
pub fn test() -> Result<(), String> {
    build_checking(Drift::Restore)?;
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
