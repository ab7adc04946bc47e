//! The Python binding's tasks: `cargo xtask python` (the wheel, installed in
//! `.venv`), its tests (pytest + mypy --strict, run by `cargo xtask test`)
//! and its bench suite.
//!
//! Everything is idempotent: the venv is reused when it has the tools, and
//! the wheel is rebuilt only when a source it is made from changed.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::{exec, root};

/// The tools' scripts in the venv, and the versions installed: pinned, so
/// that a fresh machine runs the checks this tree passes (a new mypy adds
/// checks; maturin is held where `python/pyproject.toml` holds it).
const TOOLS: &[&str] = &["maturin", "pytest", "mypy"];
const PINNED: &[&str] = &[
    "maturin==1.16.0",
    // pytest 9 and mypy 2 need Python 3.10; the package supports 3.9.
    "pytest==9.2.0; python_version >= '3.10'",
    "pytest>=8.3,<9; python_version < '3.10'",
    "mypy==2.4.1; python_version >= '3.10'",
    "mypy>=1.14,<2; python_version < '3.10'",
];

fn venv() -> PathBuf {
    root().join(".venv")
}

fn venv_bin(name: &str) -> PathBuf {
    venv().join("bin").join(name)
}

fn wheels() -> PathBuf {
    root().join("target/wheels")
}

/// `.venv` with maturin, pytest and mypy, made or completed as needed.
fn ensure_venv() -> Result<(), String> {
    let python = venv_bin("python");
    // A venv whose pip is missing (its creation was interrupted) would fail
    // every run until deleted by hand: made again instead.
    if python.exists() && !crate::succeeds(&python, &["-m", "pip", "--version"]) {
        eprintln!("xtask: .venv has no working pip; making it again");
        std::fs::remove_dir_all(venv()).map_err(|e| format!(".venv: {e}"))?;
    }
    if !python.exists() {
        let system = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        exec(
            Path::new(&system),
            &["-m", "venv", &venv().to_string_lossy()],
            &root(),
            &[],
        )?;
    }
    if TOOLS.iter().all(|t| venv_bin(t).exists()) && pinned_already(&venv(), PINNED) {
        return Ok(());
    }
    install_pinned(&python, &venv(), PINNED)
}

/// The pins a venv's tools were last installed by, beside them: a venv kept
/// from before a pin changed is brought to the new pins, as a fresh one is.
fn pins_file(venv: &Path) -> PathBuf {
    venv.join("xtask-pins")
}

fn pinned_already(venv: &Path, pins: &[&str]) -> bool {
    std::fs::read_to_string(pins_file(venv)).is_ok_and(|held| held == pins.join("\n"))
}

fn install_pinned(python: &Path, venv: &Path, pins: &[&str]) -> Result<(), String> {
    pip_install(python, pins)?;
    std::fs::write(pins_file(venv), pins.join("\n")).map_err(|e| format!("{}: {e}", venv.display()))
}

/// `pip install` of `packages` into the venv of `python`.
fn pip_install(python: &Path, packages: &[&str]) -> Result<(), String> {
    let mut args = vec![
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
    ];
    args.extend_from_slice(packages);
    exec(python, &args, &root(), &[])
}

/// The newest modification time under `dir` (files only).
fn newest(dir: &Path) -> SystemTime {
    let mut latest = SystemTime::UNIX_EPOCH;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return latest;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name == "target" || name == "__pycache__" || name == ".mypy_cache" {
            continue;
        }
        let time = if path.is_dir() {
            newest(&path)
        } else {
            entry
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH)
        };
        latest = latest.max(time);
    }
    latest
}

/// The built wheel, if any.
fn wheel() -> Option<PathBuf> {
    std::fs::read_dir(wheels())
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            name.starts_with("askpool-") && name.ends_with(".whl")
        })
}

/// Whether the wheel is older than anything it is built from.
fn wheel_stale(wheel: &Path) -> bool {
    let built = std::fs::metadata(wheel)
        .and_then(|m| m.modified())
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let root = root();
    let sources = [
        root.join("bindings/python"),
        root.join("python/askpool"),
        root.join("python/pyproject.toml"),
        root.join("crates"),
        root.join("Cargo.lock"),
        // The release profile and workspace dependency features.
        root.join("Cargo.toml"),
        root.join(".cargo/config.toml"),
    ];
    sources.iter().any(|s| {
        let time = if s.is_dir() {
            newest(s)
        } else {
            std::fs::metadata(s)
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH)
        };
        time > built
    })
}

/// Removes extension modules `maturin develop` left in the source tree, so
/// they never end up in the wheel.
fn remove_dev_builds() {
    let package = root().join("python/askpool");
    for entry in std::fs::read_dir(package).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "so" || e == "pyd") {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// `cargo xtask python`: builds the wheel (the `dist` profile, abi3) into
/// `target/wheels` and installs it into `.venv`. Returns the wheel.
pub fn build() -> Result<PathBuf, String> {
    ensure_venv()?;
    let current = wheel().filter(|w| !wheel_stale(w));
    let wheel = match current {
        Some(wheel) => {
            eprintln!("xtask python: {} is up to date", wheel.display());
            wheel
        }
        None => {
            if let Some(old) = wheel() {
                let _ = std::fs::remove_file(old);
            }
            remove_dev_builds();
            let out = wheels();
            exec(
                &venv_bin("maturin"),
                &[
                    "build",
                    // Fat LTO, one codegen unit (see the workspace's Cargo.toml).
                    "--profile",
                    "dist",
                    "--quiet",
                    "--interpreter",
                    &venv_bin("python").to_string_lossy(),
                    "--out",
                    &out.to_string_lossy(),
                ],
                &root().join("python"),
                &[],
            )?;
            self::wheel().ok_or("maturin wrote no wheel")?
        }
    };
    install_wheel(&venv_bin("python"), &wheel)?;
    Ok(wheel)
}

/// Installs `wheel` into the venv of `python`, over whatever it holds.
fn install_wheel(python: &Path, wheel: &Path) -> Result<(), String> {
    let wheel = wheel.to_string_lossy();
    pip_install(python, &["--no-deps", "--force-reinstall", &wheel])
}

/// The Python part of `cargo xtask test`: the wheel, pytest (which also
/// installs the wheel into a fresh venv), and mypy --strict.
pub fn test() -> Result<(), String> {
    let wheel = build()?;
    let python = venv_bin("python");
    let dir = root().join("python");
    // The venv's pytest, not `python -m pytest`: the latter would put
    // python/ first on sys.path and import the source tree without its
    // extension instead of the installed wheel.
    exec(
        &venv_bin("pytest"),
        &["-q", "tests"],
        &dir,
        &[("ASKPOOL_WHEEL", &wheel.to_string_lossy())],
    )?;
    exec(
        &python,
        &["-m", "mypy", "--strict", "askpool", "tests", "bench"],
        &dir,
        &[],
    )?;
    // The hand-written stubs against the installed module (from the root:
    // in python/, the sources would shadow it): drift fails here.
    exec(
        &python,
        &["-m", "mypy.stubtest", "askpool._native"],
        &root(),
        &[],
    )?;
    for version in OTHER_PYTHONS {
        other_python(version, &wheel)?;
    }
    Ok(())
}

/// Pythons the suite runs on too, where this machine has them: the oldest
/// the wheel supports (3.9; abi3), as asyncio differs before 3.11 (no cancel
/// counts, no task contexts: a slot's task that a shutdown cancelled there
/// waited for good, which only a run on it showed), and the newest (3.12
/// reimplemented `wait_for` on `asyncio.timeout`, so a handler's first
/// await is then the very future it awaits: the wrapper kept that future
/// alive while the handler ran, which only a run there showed). Each is
/// skipped, saying so, where there is none.
const OTHER_PYTHONS: [&str; 2] = ["3.9", "3.13"];

fn other_python(version: &str, wheel: &Path) -> Result<(), String> {
    let Some(interpreter) = find_python(version) else {
        crate::skipped(format!("the Python {version} run: no python{version} here"));
        return Ok(());
    };
    let venv = root().join(format!("target/py{version}-venv"));
    let python = venv.join("bin/python");
    let pytest = PINNED
        .iter()
        .copied()
        .filter(|p| p.starts_with("pytest"))
        .collect::<Vec<_>>();
    if !crate::succeeds(&python, &["-m", "pytest", "--version"]) {
        let _ = std::fs::remove_dir_all(&venv);
        exec(
            &interpreter,
            &["-m", "venv", &venv.to_string_lossy()],
            &root(),
            &[],
        )?;
    }
    if !pinned_already(&venv, &pytest) {
        install_pinned(&python, &venv, &pytest)?;
    }
    install_wheel(&python, wheel)?;
    let wheel = wheel.to_string_lossy();
    // Its pytest script, not `python -m pytest` (see `test`).
    exec(
        &venv.join("bin/pytest"),
        &["-q", "-p", "no:cacheprovider", "tests"],
        &root().join("python"),
        &[("ASKPOOL_WHEEL", wheel.as_ref())],
    )
}

/// `python<version>` on the PATH, or one pyenv installed.
fn find_python(version: &str) -> Option<PathBuf> {
    let named = format!("python{version}");
    if crate::succeeds(&named, &["-c", "import venv"]) {
        return Some(PathBuf::from(named));
    }
    let home = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pyenv")))?;
    let mut found: Vec<PathBuf> = std::fs::read_dir(home.join("versions"))
        .ok()?
        .flatten()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix(version)
                .is_some_and(|rest| rest.starts_with('.'))
        })
        .map(|e| e.path().join("bin").join(&named))
        .filter(|p| crate::succeeds(p, &["-c", "import venv"]))
        .collect();
    // The newest patch release: by number (3.9.10 after 3.9.9), not by text.
    found.sort_by_key(|p| patch_of(p));
    found.pop()
}

/// The patch number of a pyenv interpreter at `versions/X.Y.PATCH/bin/..`.
fn patch_of(interpreter: &Path) -> u32 {
    let version = interpreter
        .ancestors()
        .nth(2)
        .and_then(Path::file_name)
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    version
        .rsplit('.')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_pyenv_patch_release_is_picked_by_number() {
        let mut found: Vec<PathBuf> = ["3.9.9", "3.9.10", "3.9.2"]
            .iter()
            .map(|v| PathBuf::from(format!("/p/versions/{v}/bin/python3.9")))
            .collect();
        found.sort_by_key(|p| patch_of(p));
        assert_eq!(
            found.pop(),
            Some(PathBuf::from("/p/versions/3.9.10/bin/python3.9"))
        );
    }
}
