//! `askpool promises` on a store file written by the library.

use std::path::Path;
use std::process::{Command, Output};

use askpool_promises::{now_millis, CreateRequest, SqliteStore, Store};
use serde_json::Value;

fn askpool(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_askpool"))
        .args(args)
        .output()
        .expect("the binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn seeded(dir: &Path) -> String {
    let path = dir.join("p.db");
    let s = SqliteStore::open(&path).unwrap();
    let now = now_millis();
    for (id, param) in [
        ("order-1", &b"apples"[..]),
        ("order-2", &[0u8, 1, 2][..]),
        ("job-9", b"x"),
    ] {
        s.create(
            &CreateRequest::new(id, now + 3_600_000)
                .param(param)
                .tag("k", "v"),
            now,
        )
        .unwrap();
    }
    path.to_string_lossy().into_owned()
}

#[test]
fn list_prints_a_table_or_json() {
    let dir = tempfile::tempdir().unwrap();
    let db = seeded(dir.path());
    let out = askpool(&["promises", "list", "--db", &db, "--pattern", "order-*"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("ID") && lines[0].contains("STATE"),
        "{table}"
    );
    assert!(
        lines[1].starts_with("order-1")
            && lines[1].contains("pending")
            && lines[1].contains("apples")
    );
    assert!(
        lines[2].starts_with("order-2") && lines[2].contains("0x000102"),
        "{table}"
    );
    assert_eq!(lines[3], "(2 promises)");

    let out = askpool(&["promises", "list", "--db", &db, "--json", "--limit", "2"]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<&str> = json
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["job-9", "order-1"]);
    assert_eq!(json[1]["param"], "apples");
    assert_eq!(json[1]["tags"]["k"], "v");
}

#[test]
fn resolve_reject_and_cancel_settle_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = seeded(dir.path());
    let out = askpool(&[
        "promises", "resolve", "order-1", "--db", &db, "--value", "shipped", "--key", "op-1",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let p: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (p["state"].as_str(), p["value"].as_str()),
        (Some("resolved"), Some("shipped"))
    );
    // The same key replays; another completion is refused.
    let out = askpool(&[
        "promises", "resolve", "order-1", "--db", &db, "--key", "op-1",
    ]);
    assert!(out.status.success());
    let out = askpool(&["promises", "reject", "order-1", "--db", &db, "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let err: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(err["error"]["code"], "AlreadySettled");
    let out = askpool(&["promises", "cancel", "order-2", "--db", &db]);
    assert!(
        text(&out.stdout).contains("canceled"),
        "{}",
        text(&out.stdout)
    );
    let out = askpool(&[
        "promises", "list", "--db", &db, "--state", "pending", "--json",
    ]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json.as_array().unwrap().len(), 1);
    let out = askpool(&["promises", "get", "order-1", "--db", &db]);
    assert!(text(&out.stdout).contains("shipped"));
}

#[test]
fn bad_input_fails_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let db = seeded(dir.path());
    let out = askpool(&["promises", "get", "nope", "--db", &db]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no promise with id \"nope\""),
        "{}",
        text(&out.stderr)
    );
    let missing = dir.path().join("missing.db");
    let out = askpool(&["promises", "list", "--db", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(!missing.exists(), "inspection creates no file");
    // An empty file is not made a store by looking at it.
    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").unwrap();
    let out = askpool(&["promises", "list", "--db", empty.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("not an askpool promise store"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        std::fs::metadata(&empty).unwrap().len(),
        0,
        "left unchanged"
    );
    let junk = dir.path().join("junk.db");
    std::fs::write(&junk, "not sqlite at all ".repeat(300)).unwrap();
    let out = askpool(&["promises", "list", "--db", junk.to_str().unwrap(), "--json"]);
    let err: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(err["error"]["code"], "Corrupt");
    let out = askpool(&["promises", "list", "--db", &db, "--state", "done"]);
    assert_eq!(out.status.code(), Some(2), "clap rejects the state");
    assert!(text(&out.stderr).contains("unknown promise state"));
}
