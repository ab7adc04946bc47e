//! The build phase of `cargo xtask bench`: everything the selected suites
//! run is built before any of them measures, so the report can time the two
//! phases apart and a warm run spends its time measuring.
//!
//! - One cargo invocation builds every bench binary and uniffi's Kotlin
//!   generator with the bench profile (the release settings, unchanged):
//!   shared dependencies compile once, with one feature set.
//! - A second one builds the Node and uniffi cdylibs with the `dist` profile
//!   the bindings ship with (fat LTO, as the Python wheel), in `target/dist`
//!   beside the wheel's build. The Node addon is built by cargo directly,
//!   not by the napi CLI, which always passes `--target` and so compiles
//!   every dependency a second time in `target/<triple>`; the bench loads
//!   it through `ASKPOOL_NATIVE`. (Built together with the uniffi library,
//!   its dependencies' features are the two's together: the same code as
//!   the shipped addon but for those.)
//! - The Python wheel comes from `cargo xtask python`'s own build, which
//!   skips maturin when the wheel is newer than its sources.
//! - The Kotlin sources are regenerated and compiled only when the cdylib
//!   or the Kotlin sources changed since the last bench build (a stamp).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Instant, SystemTime};

use serde_json::Value;

use crate::root;

/// What the measuring phase runs.
#[derive(Default)]
pub struct Built {
    /// Bench binaries by bench name, each with its package directory (the
    /// working directory `cargo bench` would give it).
    pub benches: BTreeMap<String, (PathBuf, PathBuf)>,
    /// The Node addon, copied under a `.node` name.
    pub node_addon: Option<PathBuf>,
    /// How long each step took (wall seconds), in order.
    pub steps: Vec<(String, f64)>,
}

/// What the selected suites need built.
#[derive(Default)]
pub struct Needs {
    /// (package, bench target) pairs.
    pub benches: Vec<(&'static str, &'static str)>,
    pub python: bool,
    pub node: bool,
    pub kotlin: bool,
}

/// Builds what `needs` lists. The cargo part always covers `all` (every
/// suite): features are unified over the packages of one invocation, so an
/// invocation that changed with the suites selected would rebuild shared
/// dependencies each time the selection changed.
pub fn build(all: &Needs, needs: &Needs) -> Result<Built, String> {
    let mut built = Built::default();
    let started = Instant::now();
    let benches = cargo_build("bench", &bench_targets(all))?;
    built.steps.push((
        "cargo build --profile bench: bench binaries, uniffi-bindgen".into(),
        started.elapsed().as_secs_f64(),
    ));
    let started = Instant::now();
    let libs = cargo_build("dist", &binding_libs(all))?;
    if !libs.is_empty() {
        built.steps.push((
            "cargo build --profile dist: Node and uniffi cdylibs".into(),
            started.elapsed().as_secs_f64(),
        ));
    }
    // The dist cdylibs first: the bench build makes a (bench profile)
    // uniffi cdylib too, as a dependency of the generator.
    let artifacts: Vec<Artifact> = libs.into_iter().chain(benches).collect();
    for a in &artifacts {
        if a.kind == "bench" {
            if let Some(exe) = &a.executable {
                built
                    .benches
                    .insert(a.name.clone(), (exe.clone(), a.package_dir.clone()));
            }
        }
    }
    if let Some((_, bench)) = needs
        .benches
        .iter()
        .find(|(_, b)| !built.benches.contains_key(*b))
    {
        return Err(format!("cargo built no bench binary `{bench}`"));
    }
    if needs.node {
        let started = Instant::now();
        let lib = cdylib(&artifacts, "askpool_node")?;
        built.node_addon = Some(stage_node_addon(&lib)?);
        built
            .steps
            .push(("Node addon staged".into(), started.elapsed().as_secs_f64()));
    }
    if needs.kotlin {
        let started = Instant::now();
        let lib = cdylib(&artifacts, "askpool_uniffi")?;
        let bindgen = artifacts
            .iter()
            .find(|a| a.name == "uniffi-bindgen")
            .and_then(|a| a.executable.clone())
            .ok_or("cargo built no uniffi-bindgen")?;
        kotlin_classes(&bindgen, &lib)?;
        built.steps.push((
            "Kotlin bindings and bench classes".into(),
            started.elapsed().as_secs_f64(),
        ));
    }
    if needs.python {
        let started = Instant::now();
        crate::python::build()?;
        built.steps.push((
            "Python wheel (maturin, skipped when fresh) installed in .venv".into(),
            started.elapsed().as_secs_f64(),
        ));
    }
    Ok(built)
}

struct Artifact {
    name: String,
    kind: String,
    executable: Option<PathBuf>,
    filenames: Vec<PathBuf>,
    package_dir: PathBuf,
}

/// The packages, bench targets and binaries of one cargo invocation.
#[derive(Default)]
struct Targets {
    packages: Vec<&'static str>,
    benches: Vec<&'static str>,
    features: Vec<&'static str>,
    bins: Vec<&'static str>,
    libs: bool,
}

/// The bench binaries, and uniffi's generator: a separate debug build of
/// it would compile the runtime and its dependencies once more.
fn bench_targets(needs: &Needs) -> Targets {
    let mut t = Targets {
        packages: needs.benches.iter().map(|(p, _)| *p).collect(),
        benches: needs.benches.iter().map(|(_, b)| *b).collect(),
        ..Targets::default()
    };
    if needs.kotlin {
        t.packages.push("askpool-uniffi");
        t.features.push("askpool-uniffi/cli");
        t.bins.push("uniffi-bindgen");
    }
    t
}

/// The cdylibs the Node and Kotlin suites load.
fn binding_libs(needs: &Needs) -> Targets {
    let mut t = Targets {
        libs: true,
        ..Targets::default()
    };
    if needs.node {
        t.packages.push("askpool-node");
    }
    if needs.kotlin {
        t.packages.push("askpool-uniffi");
    }
    t
}

fn cargo_build(profile: &str, targets: &Targets) -> Result<Vec<Artifact>, String> {
    let mut packages = targets.packages.clone();
    packages.sort_unstable();
    packages.dedup();
    if packages.is_empty() {
        return Ok(Vec::new());
    }
    let mut args: Vec<&str> = vec![
        "build",
        "--profile",
        profile,
        "--message-format=json-render-diagnostics",
    ];
    for p in &packages {
        args.extend(["-p", p]);
    }
    for f in &targets.features {
        args.extend(["--features", f]);
    }
    for b in &targets.bins {
        args.extend(["--bin", b]);
    }
    if targets.libs {
        args.push("--lib");
    }
    for bench in &targets.benches {
        args.extend(["--bench", bench]);
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("\n==> {cargo} {}", args.join(" "));
    let started = Instant::now();
    let mut child = Command::new(&cargo)
        .args(&args)
        .current_dir(root())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start cargo: {e}"))?;
    let stdout = child.stdout.take().expect("piped");
    let artifacts: Vec<Artifact> = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .filter_map(|line| serde_json::from_str::<Value>(&line).ok())
        .filter_map(|v| artifact(&v))
        .collect();
    let status = child.wait().map_err(|e| e.to_string())?;
    eprintln!(
        "<== cargo build --profile {profile}: {status} in {:.1?}",
        started.elapsed()
    );
    if !status.success() {
        return Err(format!("the bench build failed ({status})"));
    }
    Ok(artifacts)
}

fn artifact(v: &Value) -> Option<Artifact> {
    if v["reason"] != "compiler-artifact" {
        return None;
    }
    let manifest = PathBuf::from(v["manifest_path"].as_str()?);
    Some(Artifact {
        name: v["target"]["name"].as_str()?.to_string(),
        kind: v["target"]["kind"][0].as_str()?.to_string(),
        executable: v["executable"].as_str().map(PathBuf::from),
        filenames: v["filenames"]
            .as_array()?
            .iter()
            .filter_map(|f| f.as_str().map(PathBuf::from))
            .collect(),
        package_dir: manifest.parent()?.to_path_buf(),
    })
}

fn cdylib(artifacts: &[Artifact], name: &str) -> Result<PathBuf, String> {
    artifacts
        .iter()
        .filter(|a| a.name == name)
        .flat_map(|a| &a.filenames)
        .find(|f| f.extension().is_some_and(|e| e == "so" || e == "dylib"))
        .cloned()
        .ok_or_else(|| format!("cargo built no cdylib for {name}"))
}

fn modified(path: &Path) -> SystemTime {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// Newest modification time of the files under `path`.
fn newest(path: &Path) -> SystemTime {
    let Ok(entries) = std::fs::read_dir(path) else {
        return modified(path);
    };
    entries
        .flatten()
        .filter(|e| e.file_name() != "target")
        .map(|e| newest(&e.path()))
        .max()
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

fn bench_dir() -> PathBuf {
    root().join("target/bench")
}

/// Node loads an addon only from a `.node` file: the cdylib is copied to
/// `target/bench/askpool.node` unless the copy there has its size and
/// modification time (which the copy is given): a copy newer than the
/// library, made from another build (another profile, another commit),
/// is replaced too.
fn stage_node_addon(lib: &Path) -> Result<PathBuf, String> {
    let addon = bench_dir().join("askpool.node");
    let stamp = |p: &Path| {
        std::fs::metadata(p)
            .ok()
            .map(|m| (m.len(), m.modified().ok()))
    };
    let staged = stamp(&addon);
    if staged.is_none() || staged != stamp(lib) {
        let fail = |e: std::io::Error| format!("{}: {e}", addon.display());
        std::fs::create_dir_all(bench_dir()).map_err(|e| e.to_string())?;
        std::fs::copy(lib, &addon).map_err(fail)?;
        std::fs::File::options()
            .write(true)
            .open(&addon)
            .and_then(|f| f.set_modified(modified(lib)))
            .map_err(fail)?;
    }
    Ok(addon)
}

/// The Kotlin generated from `lib` and the test classes (the bench lives
/// there), unless neither the library nor a Kotlin source changed since the
/// stamp was written.
fn kotlin_classes(bindgen: &Path, lib: &Path) -> Result<(), String> {
    let stamp = bench_dir().join("kotlin.stamp");
    let kotlin = root().join("bindings/kotlin");
    let inputs = modified(lib)
        .max(newest(&kotlin.join("src")))
        .max(modified(&kotlin.join("pom.xml")));
    if modified(&stamp) > inputs && kotlin.join("target/test-classes").exists() {
        eprintln!("xtask bench: Kotlin classes are up to date");
        return Ok(());
    }
    crate::kotlin::bindgen(bindgen, lib)?;
    crate::kotlin::mvn(&["test-compile"])?;
    std::fs::create_dir_all(bench_dir()).map_err(|e| e.to_string())?;
    std::fs::write(&stamp, b"").map_err(|e| e.to_string())
}
