//! The measuring part of the host-language suites: each runs its bench
//! script against what the build phase (`bench_build`) made, and writes
//! `target/bench/results/<suite>.json` in the benchkit schema.

use std::path::{Path, PathBuf};

use crate::{root, run};

fn out(suite: &str) -> String {
    root()
        .join(format!("target/bench/results/{suite}.json"))
        .to_string_lossy()
        .into_owned()
}

fn script(path: &str) -> String {
    root().join(path).to_string_lossy().into_owned()
}

fn with_quick(mut args: Vec<String>, quick: bool) -> Vec<String> {
    if quick {
        args.push("--quick".into());
    }
    args
}

fn run_owned(program: &str, args: &[String], envs: &[(&str, &str)]) -> Result<(), String> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run(program, &args, envs)
}

/// The wheel installed in `.venv` (from the root, so the source tree does
/// not shadow it).
pub fn python(quick: bool) -> Result<(), String> {
    let python: PathBuf = root().join(".venv/bin/python");
    let args = with_quick(
        vec![
            script("python/bench/bench_ask.py"),
            "--out".into(),
            out("python"),
        ],
        quick,
    );
    run_owned(&python.to_string_lossy(), &args, &[])
}

/// The addon cargo built, loaded through `ASKPOOL_NATIVE`.
pub fn node(addon: &Path, quick: bool) -> Result<(), String> {
    let args = with_quick(
        vec![script("node/bench/ask.js"), "--out".into(), out("node")],
        quick,
    );
    run_owned(
        "node",
        &args,
        &[("ASKPOOL_NATIVE", &addon.to_string_lossy())],
    )
}

/// The bench classes `mvn test-compile` made, run with `exec:java` alone so
/// Maven compiles nothing here.
pub fn kotlin(quick: bool) -> Result<(), String> {
    let exec_args = format!(
        "-Dexec.args={}{}",
        out("kotlin"),
        if quick { " --quick" } else { "" }
    );
    crate::kotlin::mvn(&["exec:java", &exec_args])
}
