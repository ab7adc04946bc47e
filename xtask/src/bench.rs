//! `cargo xtask bench`: runs every benchmark suite, then merges their
//! results (`target/bench/results/<suite>.json`, the `askpool-benchkit`
//! schema) into `target/bench/report.md` and `report.json`, and, after a
//! run of every suite (full or quick), the README's performance section.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

use crate::{cargo_with_env, root};

/// A suite: its name, the program it needs besides cargo (skipped when
/// missing), how to run it, and the result files it writes besides its own
/// (one bench binary may measure two suites in the same trials).
struct Suite {
    name: &'static str,
    needs: Option<&'static str>,
    run: fn() -> Result<(), String>,
    also: &'static [&'static str],
}

fn cargo_bench(package: &str, bench: &str) -> Result<(), String> {
    cargo_with_env(
        &[
            "bench", "-q", "-p", package, "--bench", bench, "--", "--bench",
        ],
        &quick_env(),
    )
}

fn quick_env() -> Vec<(&'static str, &'static str)> {
    if std::env::var_os("ASKPOOL_BENCH_QUICK").is_some_and(|v| v == "1") {
        vec![("ASKPOOL_BENCH_QUICK", "1")]
    } else {
        vec![]
    }
}

const SUITES: &[Suite] = &[
    Suite {
        name: "floors",
        needs: None,
        run: || cargo_bench("askpool-benchkit", "floors"),
        also: &[],
    },
    Suite {
        name: "dedup",
        needs: None,
        run: || cargo_bench("askpool-dedup", "dedup"),
        also: &[],
    },
    Suite {
        name: "ask",
        needs: None,
        run: || cargo_bench("askpool", "ask"),
        also: &["ack"],
    },
    Suite {
        name: "promises",
        needs: None,
        run: || cargo_bench("askpool-promises", "promises"),
        also: &[],
    },
    Suite {
        name: "python",
        needs: Some("python3"),
        run: crate::python::bench,
        also: &[],
    },
    Suite {
        name: "node",
        needs: Some("node"),
        run: crate::node::bench,
        also: &[],
    },
    Suite {
        name: "kotlin",
        needs: Some("mvn"),
        run: crate::kotlin::bench,
        also: &[],
    },
];

pub fn names() -> Vec<&'static str> {
    SUITES.iter().map(|s| s.name).collect()
}

fn results_dir() -> PathBuf {
    root().join("target/bench/results")
}

fn has_program(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// What became of one suite in this run.
struct Outcome {
    suite: &'static str,
    status: String,
    results: Option<Value>,
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
    if quick {
        std::env::set_var("ASKPOOL_BENCH_QUICK", "1");
    }
    let dir = results_dir();
    let mut outcomes = Vec::new();
    for suite in SUITES.iter().filter(|s| only.is_none_or(|n| n == s.name)) {
        let names: Vec<&'static str> = std::iter::once(suite.name)
            .chain(suite.also.iter().copied())
            .collect();
        for name in &names {
            let _ = std::fs::remove_file(dir.join(format!("{name}.json")));
        }
        let status = match suite.needs.filter(|p| !has_program(p)) {
            Some(program) => format!("skipped: `{program}` not found"),
            None => match (suite.run)() {
                Ok(()) => "ran".to_string(),
                Err(e) => format!("failed: {e}"),
            },
        };
        for name in names {
            let file = dir.join(format!("{name}.json"));
            let (status, results) = match (status.as_str(), read_json(&file)) {
                ("ran", Some(v)) => (status.clone(), Some(v)),
                ("ran", None) => (format!("failed: wrote no {}", file.display()), None),
                _ => (status.clone(), None),
            };
            if status != "ran" {
                eprintln!("\nxtask bench: {name}: {status}");
            }
            outcomes.push(Outcome {
                suite: name,
                status,
                results,
            });
        }
    }
    let report = compose(&outcomes, quick);
    let bench = root().join("target/bench");
    std::fs::create_dir_all(&bench).map_err(|e| e.to_string())?;
    std::fs::write(
        bench.join("report.json"),
        serde_json::to_string_pretty(&report).expect("json"),
    )
    .map_err(|e| e.to_string())?;
    let md = markdown(&report);
    std::fs::write(bench.join("report.md"), &md).map_err(|e| e.to_string())?;
    println!("\n{md}");
    println!("written: target/bench/report.md, target/bench/report.json");
    let complete = only.is_none() && outcomes.iter().all(|o| !o.status.starts_with("failed"));
    if complete {
        update_readme(&report)?;
        println!("README.md performance section regenerated");
    }
    let failed: Vec<_> = outcomes
        .iter()
        .filter(|o| o.status.starts_with("failed"))
        .map(|o| o.suite)
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("bench suites failed: {}", failed.join(", ")))
    }
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

fn compose(outcomes: &[Outcome], quick: bool) -> Value {
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
            "comparisons": comparisons,
            "facts": o.results.as_ref().map(|r| r["facts"].clone()),
        }));
    }
    json!({
        "quick": quick,
        "command": if quick { "cargo xtask bench --quick" } else { "cargo xtask bench" },
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
        "allocator": "the system allocator (glibc malloc); no global allocator override",
        "crates": crate_versions()
            .into_iter()
            .map(|(n, v)| json!({"name": n, "version": v}))
            .collect::<Vec<_>>(),
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

fn target_text(c: &Value) -> String {
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

fn markdown(r: &Value) -> String {
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
    md.push_str(
        "## Floors (measured in this run)\n\n| primitive | median | spread |\n|---|---|---|\n",
    );
    for f in r["floors"].as_array().cloned().unwrap_or_default() {
        md.push_str(&format!(
            "| {} | {} | {}..{} |\n",
            f["name"].as_str().unwrap_or(""),
            fmt_ns(f["ns"].as_f64().unwrap_or(f64::NAN)),
            fmt_ns(f["min"].as_f64().unwrap_or(f64::NAN)),
            fmt_ns(f["max"].as_f64().unwrap_or(f64::NAN)),
        ));
    }
    let mut missed = Vec::new();
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
            if c["pass"] == false {
                missed.push(c);
            }
        }
    }
    if !missed.is_empty() {
        md.push_str("\n## Missed targets: what remains and why\n\n");
        for c in missed {
            md.push_str(&format!(
                "- **{}** ({:.2}×, target {}): {}\n",
                c["workload"].as_str().unwrap_or(""),
                c["ratio"].as_f64().unwrap_or(f64::NAN),
                target_text(&c),
                c["note"].as_str().unwrap_or("no analysis recorded")
            ));
        }
    }
    md
}

const README_START: &str = "<!-- bench-report:start -->";
const README_END: &str = "<!-- bench-report:end -->";

/// The README's table of ratios (not absolute times), from the report.
fn readme_section(r: &Value) -> String {
    let mut s = format!(
        "Ratios from the last `{}` of every suite on {} CPUs (interleaved trials, \
         median of per-trial ratios; the whole report with absolute figures, floors \
         and spreads is `target/bench/report.md`). Time ratios: below 1 askpool is \
         faster; `thr.` rows are throughput ratios (above 1 is better).\n\n\
         | suite | workload | askpool vs baseline | ratio | target | |\n|---|---|---|---|---|---|\n",
        r["command"].as_str().unwrap_or("cargo xtask bench"),
        r["machine"]["cpus"],
    );
    for suite in r["suites"].as_array().cloned().unwrap_or_default() {
        let name = suite["suite"].as_str().unwrap_or("").to_string();
        let comparisons = suite["comparisons"].as_array().cloned().unwrap_or_default();
        if comparisons.is_empty() && name != "floors" {
            s.push_str(&format!(
                "| {name} | — | — | — | — | {} |\n",
                suite["status"].as_str().unwrap_or("")
            ));
        }
        for c in comparisons {
            s.push_str(&format!(
                "| {name} | {} | {} vs {} | {:.2}×{} | {} | {} |\n",
                c["workload"].as_str().unwrap_or(""),
                c["askpool"].as_str().unwrap_or(""),
                c["baseline"].as_str().unwrap_or(""),
                c["ratio"].as_f64().unwrap_or(f64::NAN),
                if c["unit"] == "throughput" {
                    " thr."
                } else {
                    ""
                },
                target_text(&c),
                verdict(&c),
            ));
        }
    }
    s
}

fn update_readme(r: &Value) -> Result<(), String> {
    let path = root().join("README.md");
    let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
    let (Some(a), Some(b)) = (text.find(README_START), text.find(README_END)) else {
        return Err("README.md has no bench-report markers".into());
    };
    let new = format!(
        "{}{README_START}\n{}{}",
        &text[..a],
        readme_section(r),
        &text[b..]
    );
    std::fs::write(&path, new).map_err(|e| e.to_string())
}
