//! "Missed targets: what remains": the explanations live in
//! `xtask/bench-notes.toml`, keyed by suite and workload, so they can be
//! updated without touching code. The report shows a note only while its
//! workload misses its target: a target that becomes met drops out, and a
//! note that matched nothing is listed so it can be retired.

use serde_json::Value;

use crate::root;

pub const FILE: &str = "xtask/bench-notes.toml";

/// One `[[missed]]` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Note {
    pub suite: String,
    pub workload: String,
    /// Matched as a substring of the comparison's baseline, when given.
    pub baseline: Option<String>,
    /// Where the time goes, from a profile.
    pub profile: String,
    /// Why it is not fixed yet.
    pub why: String,
}

impl Note {
    pub fn matches(&self, suite: &str, c: &Value) -> bool {
        self.suite == suite
            && c["workload"].as_str() == Some(self.workload.as_str())
            && self
                .baseline
                .as_deref()
                .is_none_or(|b| c["baseline"].as_str().is_some_and(|name| name.contains(b)))
    }
}

pub fn parse(text: &str) -> Result<Vec<Note>, String> {
    let table: toml::Table = toml::from_str(text).map_err(|e| format!("{FILE}: {e}"))?;
    let entries = match table.get("missed") {
        None => return Ok(Vec::new()),
        Some(toml::Value::Array(a)) => a,
        Some(_) => return Err(format!("{FILE}: `missed` must be an array of tables")),
    };
    entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let field = |key: &str| -> Result<String, String> {
                match e.get(key).and_then(toml::Value::as_str) {
                    Some(s) if !s.trim().is_empty() => Ok(s.trim().to_string()),
                    _ => Err(format!("{FILE}: entry {} has no `{key}`", i + 1)),
                }
            };
            Ok(Note {
                suite: field("suite")?,
                workload: field("workload")?,
                baseline: field("baseline").ok(),
                profile: field("profile")?,
                why: field("why")?,
            })
        })
        .collect()
}

/// The notes file; an unreadable or malformed file is an error, since the
/// report would otherwise silently lose every explanation.
pub fn load() -> Result<Vec<Note>, String> {
    let text = std::fs::read_to_string(root().join(FILE)).map_err(|e| format!("{FILE}: {e}"))?;
    parse(&text)
}

/// The report's "Missed targets: what remains" part: every missed
/// comparison of `report` with its note, then the notes that matched no
/// missed comparison of a suite that ran.
pub fn what_remains(report: &Value, notes: &[Note], heading: &str) -> String {
    let mut md = String::new();
    let mut used = vec![false; notes.len()];
    let mut ran = Vec::new();
    for s in report["suites"].as_array().into_iter().flatten() {
        let suite = s["suite"].as_str().unwrap_or("");
        if s["status"] == "ran" {
            ran.push(suite);
        }
        for c in s["comparisons"].as_array().into_iter().flatten() {
            if c["pass"] != false {
                continue;
            }
            md.push_str(&format!(
                "- **{suite}: {}** vs {}: {:.2}×, target {}.\n",
                c["workload"].as_str().unwrap_or(""),
                c["baseline"].as_str().unwrap_or(""),
                c["ratio"].as_f64().unwrap_or(f64::NAN),
                crate::bench::target_text(c),
            ));
            match notes.iter().position(|n| n.matches(suite, c)) {
                Some(i) => {
                    used[i] = true;
                    md.push_str(&format!(
                        "  - Where the time goes: {}\n  - Why it is not fixed yet: {}\n",
                        notes[i].profile, notes[i].why
                    ));
                }
                None => md.push_str(&format!(
                    "  - No entry in `{FILE}` yet.{}\n",
                    c["note"]
                        .as_str()
                        .map(|n| format!(" The bench says: {n}"))
                        .unwrap_or_default()
                )),
            }
        }
    }
    let stale: Vec<&Note> = notes
        .iter()
        .zip(&used)
        .filter(|(n, used)| !**used && ran.contains(&n.suite.as_str()))
        .map(|(n, _)| n)
        .collect();
    if md.is_empty() && stale.is_empty() {
        return md;
    }
    let mut out = format!("\n{heading} Missed targets: what remains\n\n");
    if md.is_empty() {
        out.push_str("Every target with a measurement in this run was met.\n");
    }
    out.push_str(&md);
    if !stale.is_empty() {
        out.push_str(&format!(
            "\nNotes in `{FILE}` that matched no missed target in this run (met now, or \
             the workload was renamed): {}.\n",
            stale
                .iter()
                .map(|n| match &n.baseline {
                    Some(baseline) => format!("{}: {} (vs {baseline})", n.suite, n.workload),
                    None => format!("{}: {}", n.suite, n.workload),
                })
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOTES: &str = r#"
[[missed]]
suite = "ask"
workload = "ask round trip, current_thread"
profile = "the dedup table"
why = "needs a redesign"

[[missed]]
suite = "dedup"
workload = "insert"
baseline = "moka"
profile = "the FIFO"
why = "inline storage first"
"#;

    fn report(ask_ratio: f64, ask_pass: bool) -> Value {
        json!({"suites": [
            {"suite": "ask", "status": "ran", "comparisons": [{
                "workload": "ask round trip, current_thread", "baseline": "raw tokio",
                "ratio": ask_ratio, "pass": ask_pass,
                "target": {"op": "<=", "value": 1.5, "issue": 2}}]},
            {"suite": "dedup", "status": "ran", "comparisons": [
                {"workload": "insert", "baseline": "quick_cache", "ratio": 2.0, "pass": false,
                 "target": {"op": "<=", "value": 1.0, "issue": 3}, "note": "from the bench"},
                {"workload": "insert", "baseline": "moka_ttl", "ratio": 0.2, "pass": false,
                 "target": {"op": "<=", "value": 0.1, "issue": 3}}]},
        ]})
    }

    #[test]
    fn the_checked_in_notes_parse() {
        let notes = load().expect("xtask/bench-notes.toml parses");
        assert!(!notes.is_empty());
    }

    #[test]
    fn a_missed_target_shows_its_note_matched_by_suite_workload_and_baseline() {
        let notes = parse(NOTES).unwrap();
        let md = what_remains(&report(13.1, false), &notes, "##");
        assert!(md.contains("**ask: ask round trip, current_thread** vs raw tokio: 13.10×"));
        assert!(md.contains("Where the time goes: the dedup table"));
        assert!(md.contains("Why it is not fixed yet: needs a redesign"));
        // The moka note does not attach to the quick_cache comparison.
        let quick_cache = md.split("vs quick_cache").nth(1).unwrap();
        let quick_cache = quick_cache.split("vs moka_ttl").next().unwrap();
        assert!(quick_cache
            .contains("No entry in `xtask/bench-notes.toml` yet. The bench says: from the bench"));
        assert!(md.contains("Where the time goes: the FIFO"));
        assert!(!md.contains("matched no missed target"));
    }

    #[test]
    fn a_met_target_drops_out_and_its_note_is_listed_as_unused() {
        let notes = parse(NOTES).unwrap();
        let md = what_remains(&report(1.2, true), &notes, "##");
        assert!(!md.contains("ask round trip, current_thread** vs"));
        assert!(!md.contains("the dedup table"));
        assert!(md.contains("matched no missed target in this run (met now, or the workload was renamed): ask: ask round trip, current_thread."));
    }

    #[test]
    fn an_entry_without_an_explanation_is_rejected() {
        let err =
            parse("[[missed]]\nsuite = \"ask\"\nworkload = \"w\"\nprofile = \"p\"\n").unwrap_err();
        assert!(err.contains("entry 1 has no `why`"), "{err}");
    }
}
