//! Suite `promises` (`cargo xtask bench promises [--quick]`): create +
//! resolve throughput of the SQLite store against raw rusqlite doing an
//! insert + update of the same rows, in the same run, interleaved per trial.
//! Both sides: WAL, synchronous = NORMAL, one `BEGIN IMMEDIATE` transaction
//! per operation. Issue 9's target: at least 0.5x the raw rate.

use std::path::Path;
use std::time::Instant;

use askpool_benchkit::{interleave, Comparison, Mode, SuiteResults, Target};
use askpool_promises::{CompleteRequest, Completion, CreateRequest, SqliteStore, Store};
use rusqlite::{params, Connection, TransactionBehavior};

const NOW: u64 = 1_700_000_000_000;

fn param() -> Vec<u8> {
    b"{\"order\":42,\"items\":[\"apples\",\"pears\"]}".to_vec()
}

/// ns per create + resolve pair through the store.
fn store_pairs(store: &SqliteStore, trial: &mut u64, n: u64) -> f64 {
    *trial += 1;
    let start = Instant::now();
    for i in 0..n {
        let id = format!("t{trial}-{i:08}");
        store
            .create(
                &CreateRequest::new(&id, NOW + 60_000)
                    .param(param())
                    .key(&id),
                NOW,
            )
            .expect("create");
        store
            .complete(
                &CompleteRequest::new(&id, Completion::Resolve)
                    .value(b"done".to_vec())
                    .key(&id),
                NOW + 1,
            )
            .expect("resolve");
    }
    start.elapsed().as_nanos() as f64 / n as f64
}

fn raw_connection(path: &Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.pragma_update_and_check(None, "journal_mode", "WAL", |_| Ok(()))
        .unwrap();
    conn.pragma_update(None, "synchronous", "NORMAL").unwrap();
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS promises (
            id TEXT PRIMARY KEY NOT NULL, state INTEGER NOT NULL, param BLOB NOT NULL, value BLOB,
            timeout_at INTEGER NOT NULL, create_key TEXT, complete_key TEXT, strict INTEGER NOT NULL,
            tags TEXT NOT NULL, created_at INTEGER NOT NULL, settled_at INTEGER,
            resume_epoch INTEGER NOT NULL)",
    )
    .unwrap();
    conn
}

/// ns per insert + update pair of the same rows, straight through rusqlite.
fn raw_pairs(conn: &mut Connection, trial: &mut u64, n: u64) -> f64 {
    *trial += 1;
    let start = Instant::now();
    for i in 0..n {
        let id = format!("t{trial}-{i:08}");
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        tx.prepare_cached(
            "INSERT INTO promises VALUES (?1, 0, ?2, NULL, ?3, ?1, NULL, 0, '{}', ?4, NULL, 0)",
        )
        .unwrap()
        .execute(params![id, param(), (NOW + 60_000) as i64, NOW as i64])
        .unwrap();
        tx.commit().unwrap();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        tx.prepare_cached(
            "UPDATE promises SET state = 1, value = ?2, complete_key = ?1, settled_at = ?3 WHERE id = ?1",
        )
        .unwrap()
        .execute(params![id, b"done".to_vec(), (NOW + 1) as i64])
        .unwrap();
        tx.commit().unwrap();
    }
    start.elapsed().as_nanos() as f64 / n as f64
}

fn main() {
    let mode = Mode::from_env();
    let n = mode.scale(4_000);
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("store.db")).unwrap();
    let mut raw = raw_connection(&dir.path().join("raw.db"));
    let (mut t1, mut t2) = (0, 0);
    let trials = interleave(
        mode.trials(),
        &mut [&mut || store_pairs(&store, &mut t1, n), &mut || {
            raw_pairs(&mut raw, &mut t2, n)
        }],
    );
    let mut results = SuiteResults::new("promises", mode);
    results.comparisons.push(
        Comparison::throughput(
            format!("promise create + resolve, SQLite file ({n} per trial)"),
            "SqliteStore create+resolve",
            &trials[0],
            "raw rusqlite insert+update",
            &trials[1],
        )
        .target(Target::at_least(0.5, 9))
        .note(
            "the store also looks the promise up before each write, checks for its \
             invoke task and callbacks when it settles, and encodes tags",
        ),
    );
    results
        .facts
        .push(("sqlite".into(), rusqlite::version().to_owned()));
    results.facts.push((
        "durability".into(),
        "WAL, synchronous=NORMAL, one BEGIN IMMEDIATE per operation, both sides".into(),
    ));
    results.finish(mode);
}
