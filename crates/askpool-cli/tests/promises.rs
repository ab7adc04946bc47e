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

/// A completion that wrote nothing says so: a replay of the same key shows
/// `replayed`, and one whose promise is in another state than asked for
/// (timed out first, or settled another way under this key) fails.
#[test]
fn a_completion_that_changed_nothing_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let db = seeded(dir.path());
    let resolve = |value: &str| {
        askpool(&[
            "promises", "resolve", "order-1", "--db", &db, "--value", value, "--key", "k", "--json",
        ])
    };
    let first: Value = serde_json::from_slice(&resolve("one").stdout).unwrap();
    assert_eq!(first["replayed"], false);
    let again = resolve("two");
    assert!(again.status.success(), "{}", text(&again.stderr));
    let again: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(
        (again["replayed"].as_bool(), again["value"].as_str()),
        (Some(true), Some("one"))
    );
    let table = askpool(&["promises", "resolve", "order-1", "--db", &db, "--key", "k"]);
    assert!(
        text(&table.stdout).contains("replayed"),
        "{}",
        text(&table.stdout)
    );
    let other = askpool(&["promises", "reject", "order-1", "--db", &db, "--key", "k"]);
    assert_eq!(other.status.code(), Some(1));
    assert!(
        text(&other.stderr).contains("order-1 is already resolved: not rejected"),
        "{}",
        text(&other.stderr)
    );
    // Timed out before the completion came.
    let store = SqliteStore::open(Path::new(&db)).unwrap();
    let now = now_millis();
    store
        .create(&CreateRequest::new("late", now + 1), now)
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let out = askpool(&["promises", "resolve", "late", "--db", &db, "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let err: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already timedout"),
        "{err}"
    );
}

/// Ids are shown with their control characters escaped, a full page says
/// where the next starts, a path starting with `file:` is that file (not a
/// URI), and output cut short by the reader ends quietly.
#[test]
fn listing_is_safe_to_read_and_to_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let db = seeded(dir.path());
    let store = SqliteStore::open(Path::new(&db)).unwrap();
    let now = now_millis();
    store
        .create(&CreateRequest::new("x\ny\u{1b}[2J", now + 3_600_000), now)
        .unwrap();
    let out = askpool(&["promises", "list", "--db", &db]);
    let table = text(&out.stdout);
    assert!(table.contains("x\\ny\\u{1b}[2J"), "{table}");
    assert_eq!(table.lines().count(), 1 + 4 + 1, "{table}");
    // A page ending on an id that needed escaping names no --after.
    let out = askpool(&["promises", "list", "--db", &db, "--limit", "4"]);
    assert!(
        text(&out.stdout).contains("--after the last id, as --json shows it"),
        "{}",
        text(&out.stdout)
    );
    let out = askpool(&["promises", "list", "--db", &db, "--limit", "2"]);
    assert!(
        text(&out.stdout).contains("the next one starts with --after order-1"),
        "{}",
        text(&out.stdout)
    );

    // `file:u.db` in the working folder, beside a `u.db` that is another store.
    SqliteStore::open(dir.path().join("u.db")).unwrap();
    std::fs::copy(&db, dir.path().join("file:u.db")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_askpool"))
        .args(["promises", "get", "order-1", "--db", "file:u.db"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));

    // Enough output to fill the pipe; the reader stops after a few bytes.
    let big = dir.path().join("big.db");
    let store = SqliteStore::open(&big).unwrap();
    for i in 0..400 {
        let param = vec![b'a'; 400];
        store
            .create(
                &CreateRequest::new(format!("p{i:04}"), now + 3_600_000).param(param),
                now,
            )
            .unwrap();
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_askpool"))
        .args([
            "promises",
            "list",
            "--db",
            big.to_str().unwrap(),
            "--limit",
            "1000",
            "--json",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut head = [0u8; 16];
    std::io::Read::read_exact(&mut stdout, &mut head).unwrap();
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    assert!(
        !text(&out.stderr).contains("panicked"),
        "{}",
        text(&out.stderr)
    );
    assert_ne!(out.status.code(), Some(101));
}
