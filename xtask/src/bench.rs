//! `cargo xtask bench`: runs every benchmark suite, then merges their
//! results (`target/bench/results/<suite>.json`, the `askpool-benchkit`
//! schema) into `target/bench/report.md` and `report.json`, and, after a
//! run of every suite (full or quick), the README's performance section.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde_json::{json, Value};

use crate::{bench_build, bench_host, bench_notes, root};

/// A suite: its name, the program it needs besides cargo (skipped when
/// missing), what it runs, and the result files it writes besides its own
/// (one bench binary may measure two suites in the same trials).
struct Suite {
    name: &'static str,
    needs: Option<&'static str>,
    kind: Kind,
    also: &'static [&'static str],
}

/// What a suite runs; `bench_build` builds all of it before any suite
/// measures.
enum Kind {
    /// A bench binary (`harness = false`, the benchkit method).
    Bench {
        package: &'static str,
        bench: &'static str,
    },
    Python,
    Node,
    Kotlin,
}

const SUITES: &[Suite] = &[
    Suite {
        name: "floors",
        needs: None,
        kind: Kind::Bench {
            package: "askpool-benchkit",
            bench: "floors",
        },
        also: &[],
    },
    Suite {
        name: "dedup",
        needs: None,
        kind: Kind::Bench {
            package: "askpool-dedup",
            bench: "dedup",
        },
        also: &[],
    },
    Suite {
        name: "ask",
        needs: None,
        kind: Kind::Bench {
            package: "askpool",
            bench: "ask",
        },
        also: &["ack"],
    },
    Suite {
        name: "promises",
        needs: None,
        kind: Kind::Bench {
            package: "askpool-promises",
            bench: "promises",
        },
        also: &[],
    },
    Suite {
        name: "python",
        needs: Some("python3"),
        kind: Kind::Python,
        also: &[],
    },
    Suite {
        name: "node",
        needs: Some("node"),
        kind: Kind::Node,
        also: &[],
    },
    Suite {
        name: "kotlin",
        needs: Some("mvn"),
        kind: Kind::Kotlin,
        also: &[],
    },
];

pub fn names() -> Vec<&'static str> {
    SUITES.iter().map(|s| s.name).collect()
}

fn results_dir() -> PathBuf {
    root().join("target/bench/results")
}

/// Whether `program` is an executable file in one of `path`'s directories
/// (the value of `PATH`).
fn on_path(program: &str, path: &OsStr) -> bool {
    std::env::split_paths(path).any(|dir| {
        let file = dir.join(program);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(&file)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        }
        #[cfg(not(unix))]
        {
            file.is_file()
                || file.with_extension("exe").is_file()
                || file.with_extension("cmd").is_file()
        }
    })
}

/// The selected suites, each either to run or skipped with the reason (its
/// toolchain is not on `path`).
fn plan(only: Option<&str>, path: &OsStr) -> Vec<(&'static Suite, Option<String>)> {
    SUITES
        .iter()
        .filter(|s| only.is_none_or(|n| n == s.name))
        .map(|s| {
            let skip = s
                .needs
                .filter(|p| !on_path(p, path))
                .map(|p| format!("skipped: `{p}` not found"));
            (s, skip)
        })
        .collect()
}

fn build_needs(suites: &[&Suite]) -> bench_build::Needs {
    let mut needs = bench_build::Needs::default();
    for s in suites {
        match s.kind {
            Kind::Bench { package, bench } => needs.benches.push((package, bench)),
            Kind::Python => needs.python = true,
            Kind::Node => needs.node = true,
            Kind::Kotlin => needs.kotlin = true,
        }
    }
    needs
}

fn measure(suite: &Suite, built: &bench_build::Built, quick: bool) -> Result<(), String> {
    match suite.kind {
        Kind::Bench { bench, .. } => {
            let (exe, dir) = &built.benches[bench];
            let quick_env: &[(&str, &str)] = if quick {
                &[("ASKPOOL_BENCH_QUICK", "1")]
            } else {
                &[]
            };
            crate::exec(exe, &["--bench"], dir, quick_env)
        }
        Kind::Python => bench_host::python(quick),
        Kind::Node => bench_host::node(
            built
                .node_addon
                .as_deref()
                .expect("the build staged the addon"),
            quick,
        ),
        Kind::Kotlin => bench_host::kotlin(quick),
    }
}

/// What became of one suite in this run.
struct Outcome {
    suite: &'static str,
    status: String,
    results: Option<Value>,
    /// Wall seconds of its measuring run (the bench binary or script).
    seconds: Option<f64>,
}

/// Wall times of the two phases.
#[derive(Default)]
struct Timings {
    build_steps: Vec<(String, f64)>,
    build_s: f64,
    measure_s: f64,
}

pub fn run(only: Option<&str>, quick: bool) -> Result<(), String> {
    if let Some(name) = only {
        if !SUITES.iter().any(|s| s.name == name) {
            return Err(format!(
                "unknown bench suite {name:?}; known: {}",
                names().join(", ")
            ));
        }
    }
    let notes = bench_notes::load()?;
    let path = std::env::var_os("PATH").unwrap_or_default();
    let plan = plan(only, &path);
    let dir = results_dir();
    for (suite, _) in &plan {
        for name in std::iter::once(suite.name).chain(suite.also.iter().copied()) {
            let _ = std::fs::remove_file(dir.join(format!("{name}.json")));
        }
    }
    let to_run: Vec<&Suite> = plan
        .iter()
        .filter(|(_, skip)| skip.is_none())
        .map(|(s, _)| *s)
        .collect();
    let mut timings = Timings::default();
    let started = Instant::now();
    let every: Vec<&Suite> = SUITES.iter().collect();
    let built = bench_build::build(&build_needs(&every), &build_needs(&to_run));
    timings.build_s = started.elapsed().as_secs_f64();
    eprintln!("\nxtask bench: build phase {:.1} s", timings.build_s);
    let started = Instant::now();
    let mut outcomes = Vec::new();
    for (suite, skip) in &plan {
        let (status, seconds) = match (skip, &built) {
            (Some(reason), _) => (reason.clone(), None),
            (None, Err(e)) => (format!("failed: build phase: {e}"), None),
            (None, Ok(built)) => {
                let t = Instant::now();
                let status = match measure(suite, built, quick) {
                    Ok(()) => "ran".to_string(),
                    Err(e) => format!("failed: {e}"),
                };
                (status, Some(t.elapsed().as_secs_f64()))
            }
        };
        outcomes.extend(outcomes_of(suite, &status, seconds, &dir));
    }
    timings.measure_s = started.elapsed().as_secs_f64();
    if let Ok(built) = built {
        timings.build_steps = built.steps;
    }
    let report = compose(&outcomes, only, quick, &timings);
    let bench = root().join("target/bench");
    std::fs::create_dir_all(&bench).map_err(|e| e.to_string())?;
    std::fs::write(
        bench.join("report.json"),
        serde_json::to_string_pretty(&report).expect("json"),
    )
    .map_err(|e| e.to_string())?;
    let md = markdown(&report, &notes);
    std::fs::write(bench.join("report.md"), &md).map_err(|e| e.to_string())?;
    println!("\n{md}");
    println!("written: target/bench/report.md, target/bench/report.json");
    let failed = failures(&outcomes);
    if only.is_none() && failed.is_empty() {
        update_readme(&report, &notes)?;
        println!("README.md performance section regenerated");
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("bench suites failed: {}", failed.join(", ")))
    }
}

/// The outcome of `suite` and of the suites it also measures, each with the
/// results file it wrote.
fn outcomes_of(suite: &Suite, status: &str, seconds: Option<f64>, dir: &Path) -> Vec<Outcome> {
    std::iter::once(suite.name)
        .chain(suite.also.iter().copied())
        .map(|name| {
            let file = dir.join(format!("{name}.json"));
            let (status, results) = match (status, read_json(&file)) {
                ("ran", Some(v)) => (status.to_string(), Some(v)),
                ("ran", None) => (format!("failed: wrote no {}", file.display()), None),
                _ => (status.to_string(), None),
            };
            if status != "ran" {
                eprintln!("\nxtask bench: {name}: {status}");
            }
            Outcome {
                suite: name,
                status,
                results,
                seconds: if name == suite.name { seconds } else { None },
            }
        })
        .collect()
}

/// Suites that failed; skipped ones are not failures.
fn failures(outcomes: &[Outcome]) -> Vec<&'static str> {
    outcomes
        .iter()
        .filter(|o| o.status.starts_with("failed"))
        .map(|o| o.suite)
        .collect()
}

fn read_json(path: &Path) -> Option<Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// Versions of the crates that matter to the figures, from Cargo.lock.
fn crate_versions() -> Vec<(String, String)> {
    let lock = std::fs::read_to_string(root().join("Cargo.lock")).unwrap_or_default();
    let wanted = [
        "tokio",
        "flume",
        "crossbeam-epoch",
        "dashmap",
        "rustc-hash",
        "quick_cache",
        "moka",
        "papaya",
        "criterion",
        "rusqlite",
        "pyo3",
        "napi",
        "uniffi",
    ];
    let mut out = Vec::new();
    let mut name = None;
    for line in lock.lines() {
        if let Some(n) = line.strip_prefix("name = ") {
            name = Some(n.trim_matches('"').to_string());
        } else if let Some(v) = line.strip_prefix("version = ") {
            if let Some(n) = name.take().filter(|n| wanted.contains(&n.as_str())) {
                let v = v.trim_matches('"').to_string();
                if !out
                    .iter()
                    .any(|(a, b): &(String, String)| *a == n && *b == v)
                {
                    out.push((n, v));
                }
            }
        }
    }
    out.sort();
    out
}

fn command_output(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn compose(outcomes: &[Outcome], only: Option<&str>, quick: bool, timings: &Timings) -> Value {
    let floors: Vec<Value> = outcomes
        .iter()
        .filter_map(|o| o.results.as_ref())
        .flat_map(|r| r["floors"].as_array().cloned().unwrap_or_default())
        .collect();
    let floor_ns = |name: &str| {
        floors
            .iter()
            .find(|f| f["name"] == name)
            .and_then(|f| f["ns"].as_f64())
    };
    let mut suites = Vec::new();
    for o in outcomes {
        let mut comparisons = Vec::new();
        if let Some(r) = &o.results {
            for c in r["comparisons"].as_array().cloned().unwrap_or_default() {
                let mut c = c;
                let ratio = c["ratio"].as_f64().unwrap_or(f64::NAN);
                let pass = c["target"].as_object().map(|t| {
                    let v = t["value"].as_f64().unwrap_or(f64::NAN);
                    if t["op"] == ">=" {
                        ratio >= v
                    } else {
                        ratio <= v
                    }
                });
                c["pass"] = json!(pass);
                let multiple = c["floor"]
                    .as_str()
                    .and_then(floor_ns)
                    .and_then(|f| c["askpool_ns"].as_f64().map(|a| a / f));
                c["floor_multiple"] = json!(multiple);
                comparisons.push(c);
            }
        }
        suites.push(json!({
            "suite": o.suite,
            "status": o.status,
            "seconds": o.seconds,
            "comparisons": comparisons,
            "facts": o.results.as_ref().map(|r| r["facts"].clone()),
        }));
    }
    json!({
        "quick": quick,
        "command": format!(
            "cargo xtask bench{}{}",
            if quick { " --quick" } else { "" },
            only.map(|suite| format!(" {suite}")).unwrap_or_default()
        ),
        "machine": {
            "cpus": std::thread::available_parallelism().map_or(1, |n| n.get()),
            "cpu": cpu_model(),
            "rustc": command_output("rustc", &["--version"]),
        },
        "method": "candidates interleaved within each trial (order rotating), at least 7 trials \
                   (9 in a full run), median of per-trial ratios with the min..max spread; \
                   latency workloads never run more busy threads than cores",
        "hasher": "FxHash (rustc-hash 2) in the runtime's maps and the dedup table; the dedup \
                   suite gives every candidate table the same hasher",
        "allocator": "the system allocator (glibc malloc) in the Rust suites; mimalloc in the \
                      Python and Node extensions and the uniffi cdylib",
        "crates": crate_versions()
            .into_iter()
            .map(|(n, v)| json!({"name": n, "version": v}))
            .collect::<Vec<_>>(),
        "timings": {
            "build_s": timings.build_s,
            "build_steps": timings.build_steps.iter()
                .map(|(step, s)| json!({"step": step, "seconds": s}))
                .collect::<Vec<_>>(),
            "measure_s": timings.measure_s,
        },
        "floors": floors,
        "suites": suites,
    })
}

fn fmt_ns(ns: f64) -> String {
    if ns >= 1_000_000.0 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1_000.0 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{ns:.1} ns")
    }
}

pub(crate) fn target_text(c: &Value) -> String {
    match c["target"].as_object() {
        Some(t) => format!(
            "{} {} (#{})",
            t["op"].as_str().unwrap_or("?"),
            t["value"],
            t["issue"]
        ),
        None => "—".into(),
    }
}

fn verdict(c: &Value) -> &'static str {
    match c["pass"].as_bool() {
        Some(true) => "met",
        Some(false) => "**missed**",
        None => "—",
    }
}

fn markdown(r: &Value, notes: &[bench_notes::Note]) -> String {
    let mut md = String::new();
    md.push_str(&format!(
        "# askpool benchmark report{}\n\nReproduce: `{}`. Machine: {} CPUs ({}), {}.\n\n",
        if r["quick"] == true { " (quick)" } else { "" },
        r["command"].as_str().unwrap_or(""),
        r["machine"]["cpus"],
        r["machine"]["cpu"].as_str().unwrap_or(""),
        r["machine"]["rustc"].as_str().unwrap_or(""),
    ));
    md.push_str(&format!(
        "Method: {}.\n\nHasher: {}.\n\nAllocator: {}.\n\nCrates: {}.\n\n",
        r["method"].as_str().unwrap_or(""),
        r["hasher"].as_str().unwrap_or(""),
        r["allocator"].as_str().unwrap_or(""),
        r["crates"]
            .as_array()
            .map(|a| a
                .iter()
                .map(|c| format!(
                    "{} {}",
                    c["name"].as_str().unwrap_or(""),
                    c["version"].as_str().unwrap_or("")
                ))
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default()
    ));
    md.push_str(&run_time(r));
    let floors = r["floors"].as_array().cloned().unwrap_or_default();
    if !floors.is_empty() {
        md.push_str(
            "## Floors (measured in this run)\n\n| primitive | median | spread |\n|---|---|---|\n",
        );
    }
    for f in floors {
        md.push_str(&format!(
            "| {} | {} | {}..{} |\n",
            f["name"].as_str().unwrap_or(""),
            fmt_ns(f["ns"].as_f64().unwrap_or(f64::NAN)),
            fmt_ns(f["min"].as_f64().unwrap_or(f64::NAN)),
            fmt_ns(f["max"].as_f64().unwrap_or(f64::NAN)),
        ));
    }
    for s in r["suites"].as_array().cloned().unwrap_or_default() {
        md.push_str(&format!(
            "\n## {} — {}\n\n",
            s["suite"].as_str().unwrap_or(""),
            s["status"].as_str().unwrap_or("")
        ));
        let comparisons = s["comparisons"].as_array().cloned().unwrap_or_default();
        if comparisons.is_empty() {
            continue;
        }
        md.push_str(
            "| workload | askpool | baseline | ratio (spread) | target | result | askpool ÷ floor |\n\
             |---|---|---|---|---|---|---|\n",
        );
        for c in comparisons {
            let floor = match (c["floor_multiple"].as_f64(), c["floor"].as_str()) {
                (Some(m), Some(f)) => format!("{m:.1}× {f}"),
                _ => "—".into(),
            };
            md.push_str(&format!(
                "| {} | {} {} | {} {} | {:.2}× ({:.2}..{:.2}){} | {} | {} | {} |\n",
                c["workload"].as_str().unwrap_or(""),
                c["askpool"].as_str().unwrap_or(""),
                fmt_ns(c["askpool_ns"].as_f64().unwrap_or(f64::NAN)),
                c["baseline"].as_str().unwrap_or(""),
                fmt_ns(c["baseline_ns"].as_f64().unwrap_or(f64::NAN)),
                c["ratio"].as_f64().unwrap_or(f64::NAN),
                c["min"].as_f64().unwrap_or(f64::NAN),
                c["max"].as_f64().unwrap_or(f64::NAN),
                if c["unit"] == "throughput" {
                    " thr."
                } else {
                    ""
                },
                target_text(&c),
                verdict(&c),
                floor,
            ));
        }
    }
    md.push_str(&bench_notes::what_remains(r, notes, "##"));
    md
}

const README_START: &str = "<!-- bench-report:start -->";
const README_END: &str = "<!-- bench-report:end -->";

/// One line: the wall time of each phase.
fn phases(r: &Value) -> String {
    let t = &r["timings"];
    format!(
        "That run took {:.0} s to build (next to nothing when warm) and {:.0} s to measure.",
        t["build_s"].as_f64().unwrap_or(f64::NAN),
        t["measure_s"].as_f64().unwrap_or(f64::NAN),
    )
}

/// The report's run-time part: the build phase step by step, then each
/// suite's measuring run.
fn run_time(r: &Value) -> String {
    let mut md = format!(
        "## Run time\n\n{}\n\n| phase | step | wall |\n|---|---|---|\n",
        phases(r)
    );
    for step in r["timings"]["build_steps"].as_array().into_iter().flatten() {
        md.push_str(&format!(
            "| build | {} | {:.1} s |\n",
            step["step"].as_str().unwrap_or(""),
            step["seconds"].as_f64().unwrap_or(f64::NAN)
        ));
    }
    for s in r["suites"].as_array().into_iter().flatten() {
        if let Some(secs) = s["seconds"].as_f64() {
            md.push_str(&format!(
                "| measure | {} | {secs:.1} s |\n",
                s["suite"].as_str().unwrap_or("")
            ));
        }
    }
    md.push('\n');
    md
}

/// The README's table of ratios (not absolute times), from the report.
fn readme_section(r: &Value, notes: &[bench_notes::Note]) -> String {
    let mut s = format!(
        "Ratios from the last `{}` of every suite on {} CPUs (interleaved trials, \
         median of per-trial ratios, and their spread, lowest to highest; the \
         whole report with absolute figures and floors is `target/bench/report.md`). \
         Time ratios: below 1 askpool is faster; `thr.` rows are throughput ratios \
         (above 1 is better). A target met by the median may be missed by some \
         trials: the spread says how many ways it went.\n\n\
         {}\n\n\
         | suite | workload | askpool vs baseline | ratio | spread | target | |\n\
         |---|---|---|---|---|---|---|\n",
        r["command"].as_str().unwrap_or("cargo xtask bench"),
        r["machine"]["cpus"],
        phases(r),
    );
    for suite in r["suites"].as_array().cloned().unwrap_or_default() {
        let name = suite["suite"].as_str().unwrap_or("").to_string();
        let comparisons = suite["comparisons"].as_array().cloned().unwrap_or_default();
        if comparisons.is_empty() && name != "floors" {
            s.push_str(&format!(
                "| {name} | — | — | — | — | — | {} |\n",
                suite["status"].as_str().unwrap_or("")
            ));
        }
        for c in comparisons {
            s.push_str(&format!(
                "| {name} | {} | {} vs {} | {:.2}×{} | {:.2}..{:.2} | {} | {} |\n",
                c["workload"].as_str().unwrap_or(""),
                c["askpool"].as_str().unwrap_or(""),
                c["baseline"].as_str().unwrap_or(""),
                c["ratio"].as_f64().unwrap_or(f64::NAN),
                if c["unit"] == "throughput" {
                    " thr."
                } else {
                    ""
                },
                c["min"].as_f64().unwrap_or(f64::NAN),
                c["max"].as_f64().unwrap_or(f64::NAN),
                target_text(&c),
                verdict(&c),
            ));
        }
    }
    s.push_str(&bench_notes::what_remains(r, notes, "###"));
    s
}

/// `cargo xtask bench --notes-only`: the last run's report, annotated again
/// with the current bench notes (notes written after a run need no second
/// run to reach the report and the README).
pub fn renote() -> Result<(), String> {
    let notes = bench_notes::load()?;
    let bench = root().join("target/bench");
    let text = std::fs::read_to_string(bench.join("report.json"))
        .map_err(|e| format!("no last run to annotate (target/bench/report.json): {e}"))?;
    let report: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let md = markdown(&report, &notes);
    std::fs::write(bench.join("report.md"), &md).map_err(|e| e.to_string())?;
    println!("written: target/bench/report.md");
    if covers_every_suite(&report) {
        update_readme(&report, &notes)?;
        println!("README.md performance section regenerated");
    }
    Ok(())
}

/// Whether a report is of a run of every suite with none failed (what
/// regenerates the README).
fn covers_every_suite(report: &Value) -> bool {
    let Some(suites) = report["suites"].as_array() else {
        return false;
    };
    let status = |name: &str| {
        suites
            .iter()
            .find(|s| s["suite"] == name)
            .and_then(|s| s["status"].as_str())
    };
    SUITES
        .iter()
        .all(|s| status(s.name).is_some_and(|st| !st.starts_with("failed")))
}

fn update_readme(r: &Value, notes: &[bench_notes::Note]) -> Result<(), String> {
    let path = root().join("README.md");
    let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
    let (Some(a), Some(b)) = (text.find(README_START), text.find(README_END)) else {
        return Err("README.md has no bench-report markers".into());
    };
    let new = format!(
        "{}{README_START}\n{}{}",
        &text[..a],
        readme_section(r, notes),
        &text[b..]
    );
    std::fs::write(&path, new).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory holding executables named `programs`, as a `PATH`.
    fn fake_path(test: &str, programs: &[&str]) -> std::ffi::OsString {
        let dir = std::env::temp_dir().join(format!("xtask-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for p in programs {
            let file = dir.join(p);
            std::fs::write(&file, "#!/bin/sh\n").unwrap();
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
        }
        dir.into_os_string()
    }

    fn skipped(plan: &[(&Suite, Option<String>)]) -> Vec<(&'static str, String)> {
        plan.iter()
            .filter_map(|(s, skip)| skip.clone().map(|r| (s.name, r)))
            .collect()
    }

    #[test]
    fn notes_reach_the_readme_only_from_a_run_of_every_suite() {
        let report = |statuses: Vec<(&str, &str)>| {
            json!({"suites": statuses
                .into_iter()
                .map(|(suite, status)| json!({"suite": suite, "status": status}))
                .collect::<Vec<_>>()})
        };
        let every = |status: &'static str| SUITES.iter().map(move |s| (s.name, status));
        assert!(covers_every_suite(&report(every("ran").collect())));
        let mut skipped: Vec<_> = every("ran").collect();
        skipped[0].1 = "skipped: no mvn on PATH";
        assert!(covers_every_suite(&report(skipped)), "a skip is no failure");
        let mut failed: Vec<_> = every("ran").collect();
        failed[0].1 = "failed: build phase";
        assert!(!covers_every_suite(&report(failed)));
        let one: Vec<_> = every("ran").take(1).collect();
        assert!(!covers_every_suite(&report(one)), "a run of one suite");
        assert!(!covers_every_suite(&json!({})));
    }

    #[test]
    fn a_suite_whose_toolchain_is_not_on_path_is_skipped() {
        let path = fake_path("no-mvn", &["python3", "node"]);
        let no_mvn = plan(None, &path);
        assert_eq!(no_mvn.len(), SUITES.len());
        assert_eq!(
            skipped(&no_mvn),
            vec![("kotlin", "skipped: `mvn` not found".to_string())]
        );
        let nothing = plan(None, OsStr::new(""));
        assert_eq!(
            skipped(&nothing)
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>(),
            ["python", "node", "kotlin"]
        );
        assert!(plan(Some("kotlin"), &fake_path("mvn", &["mvn"]))[0]
            .1
            .is_none());
    }

    #[test]
    fn a_skipped_suite_is_reported_as_skipped_not_failed() {
        let path = fake_path("report", &["python3", "node"]);
        let dir = std::env::temp_dir().join(format!("xtask-results-{}", std::process::id()));
        let mut outcomes = Vec::new();
        for (suite, skip) in plan(None, &path) {
            // What `run` does with a suite that did not run: no results.
            let status = skip.unwrap_or_else(|| "failed: not run in this test".into());
            outcomes.extend(outcomes_of(suite, &status, None, &dir));
        }
        let kotlin = outcomes.iter().find(|o| o.suite == "kotlin").unwrap();
        assert_eq!(kotlin.status, "skipped: `mvn` not found");
        assert!(!failures(&outcomes).contains(&"kotlin"));
        assert!(failures(&outcomes).contains(&"ask"));
        let report = compose(&outcomes, None, true, &Timings::default());
        let md = markdown(&report, &[]);
        assert!(
            md.contains("\n## kotlin — skipped: `mvn` not found\n"),
            "{md}"
        );
        let readme = readme_section(&report, &[]);
        assert!(readme.contains("| kotlin | — | — | — | — | — | skipped: `mvn` not found |"));
    }
}
