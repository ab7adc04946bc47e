//! `cargo xtask kotlin`: the Kotlin binding end to end. Builds the uniffi
//! cdylib (the `dist` profile, as shipped: the tests and the bench load the
//! same library),
//! generates its Kotlin with uniffi-bindgen in library mode into
//! `bindings/kotlin/target/generated-sources/uniffi` (generated at build
//! time, never committed), then runs `mvn -B test` with the library path.
//! Maven downloads what it needs on the first run and works offline after.

use std::path::{Path, PathBuf};

use crate::{cargo, root, run};

const GENERATED: &str = "bindings/kotlin/target/generated-sources/uniffi";

fn library() -> PathBuf {
    root().join("target/dist/libaskpool_uniffi.so")
}

/// Builds the cdylib and generates the Kotlin that loads it.
pub fn generate() -> Result<(), String> {
    cargo(&[
        "build",
        "-q",
        "--profile",
        "dist",
        "-p",
        "askpool-uniffi",
        "--lib",
    ])?;
    cargo(&[
        "build",
        "-q",
        "-p",
        "askpool-uniffi",
        "--features",
        "cli",
        "--bin",
        "uniffi-bindgen",
    ])?;
    bindgen(&root().join("target/debug/uniffi-bindgen"), &library())
}

/// Generates the Kotlin for the cdylib `lib` with the generator `bindgen`
/// (`cargo xtask bench` builds both together with its bench binaries).
pub fn bindgen(bindgen: &Path, lib: &Path) -> Result<(), String> {
    let generated = root().join(GENERATED);
    let _ = std::fs::remove_dir_all(&generated);
    run(
        &bindgen.to_string_lossy(),
        &[
            "generate",
            "--library",
            &lib.to_string_lossy(),
            "--language",
            "kotlin",
            "--no-format",
            "--out-dir",
            &generated.to_string_lossy(),
        ],
        &[],
    )
}

fn lib_dir_arg() -> String {
    format!("-Daskpool.lib.dir={}", root().join("target/dist").display())
}

pub fn mvn(args: &[&str]) -> Result<(), String> {
    let pom = root().join("bindings/kotlin/pom.xml");
    let pom = pom.to_string_lossy();
    let lib_dir = lib_dir_arg();
    let mut all = vec!["-B", "-q", "-f", pom.as_ref(), lib_dir.as_str()];
    all.extend_from_slice(args);
    run("mvn", &all, &[])
}

/// `cargo xtask kotlin`: generate, then every JUnit test. `leak_asks`
/// overrides the leak check's 100,000 asks (`-Daskpool.leak.asks`).
pub fn test(leak_asks: Option<u64>) -> Result<(), String> {
    generate()?;
    let leak = leak_asks.map(|n| format!("-Daskpool.leak.asks={n}"));
    let mut args = vec!["test"];
    if let Some(leak) = &leak {
        args.push(leak);
    }
    mvn(&args)
}
