//! Corrupt rows among the promises a sweep or a prune meets (the file
//! altered by hand, by another program): each is skipped and reported,
//! never the end of every later sweep. The well-formed promises around it
//! still time out (or are pruned), however many corrupt rows come first.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use askpool_promises::{
    now_millis, spawn_sweeper, CallbackRequest, CompleteRequest, Completion, CrashHook,
    CreateRequest, PromiseError, SearchQuery, SqliteStore, Store, Target, MAX_REPORTED_CORRUPT,
};
use rusqlite::Connection;

mod expired_rows;
use expired_rows::{corrupt, expired_store, raw_states, ODD, PENDING, T, TIMED_OUT};

/// One sweep: how many it timed out, and the corrupt rows it skipped.
fn sweep(
    s: &SqliteStore,
    now: u64,
    batch: usize,
) -> Result<(usize, Vec<PromiseError>), PromiseError> {
    s.sweep(now, batch).map(|r| {
        assert_eq!(r.skipped, r.corrupt.len(), "{r:?}");
        (r.timed_out, r.corrupt)
    })
}

/// One prune: how many it deleted, and the corrupt rows it skipped.
fn prune(
    s: &SqliteStore,
    before: u64,
    batch: usize,
) -> Result<(usize, Vec<PromiseError>), PromiseError> {
    s.prune(before, batch).map(|r| {
        assert_eq!(r.skipped, r.corrupt.len(), "{r:?}");
        (r.pruned, r.corrupt)
    })
}

/// Each skipped row is reported as `Corrupt`, naming its promise (or, for
/// an id that cannot be read, its rowid) and the column.
fn assert_reports_corrupt_rows(skipped: &[PromiseError], expected: usize) {
    assert_eq!(skipped.len(), expected, "{skipped:#?}");
    for e in skipped {
        match e {
            PromiseError::Corrupt { message, .. }
                if message.contains("column")
                    && (message.contains("promise \"bad-") || message.contains("rowid")) => {}
            other => panic!("not a corrupt row named: {other:?}"),
        }
    }
}

/// Sweeps in batches of `batch` until one comes back short, as the
/// sweeper does; every sweep must report the `bad` corrupt rows it met.
fn sweep_all(s: &SqliteStore, batch: usize, bad: usize) -> usize {
    let mut timed_out = 0;
    for _ in 0..100 {
        let (n, skipped) = sweep(s, T + 200, batch).unwrap();
        assert_reports_corrupt_rows(&skipped, bad);
        timed_out += n;
        if n < batch {
            return timed_out;
        }
    }
    panic!("the sweeps never came back short");
}

fn assert_good_timed_out_bad_untouched(path: &Path, good: usize, bad: usize) {
    let states = raw_states(path);
    assert_eq!(states.len(), good + bad + 3);
    for (id, state) in &states {
        let expected = if id.starts_with("good-") {
            TIMED_OUT
        } else {
            PENDING
        };
        assert_eq!(*state, expected, "{id}: {states:?}");
    }
}

#[test]
fn a_sweep_times_out_the_good_promises_past_fewer_corrupt_rows_than_a_batch() {
    let dir = tempfile::tempdir().unwrap();
    let (good, bad, batch) = (5, 4, 10);
    let path = expired_store(&dir, good, bad);
    let s = SqliteStore::open(&path).unwrap();
    let (timed_out, skipped) = sweep(&s, T + 200, batch).unwrap();
    assert_eq!(timed_out, good);
    assert_reports_corrupt_rows(&skipped, bad);
    assert_good_timed_out_bad_untouched(&path, good, bad);
    // Nothing left to time out; the corrupt rows are still reported.
    let (timed_out, skipped) = sweep(&s, T + 200, batch).unwrap();
    assert_eq!(timed_out, 0);
    assert_reports_corrupt_rows(&skipped, bad);
}

/// More corrupt rows ahead than a batch holds: the sweep goes on past
/// them (in the same call) instead of meeting the same rows every time.
#[test]
fn sweeps_time_out_the_good_promises_past_more_corrupt_rows_than_a_batch() {
    for (good, bad, batch) in [(5, 3, 3), (5, 7, 3), (2, 12, 1), (7, 6, 2)] {
        let dir = tempfile::tempdir().unwrap();
        let path = expired_store(&dir, good, bad);
        let s = SqliteStore::open(&path).unwrap();
        assert_eq!(sweep_all(&s, batch, bad), good, "{good} {bad} {batch}");
        assert_good_timed_out_bad_untouched(&path, good, bad);
    }
}

/// More corrupt rows than a report holds: all are counted and skipped, the
/// first `MAX_REPORTED_CORRUPT` reported with their errors (a file with
/// many corrupt rows does not make a report of them all).
#[test]
fn a_sweep_reports_at_most_its_bound_of_corrupt_rows_and_counts_them_all() {
    let dir = tempfile::tempdir().unwrap();
    let (good, bad, batch) = (4, MAX_REPORTED_CORRUPT + 9, 10);
    let path = expired_store(&dir, good, bad);
    let s = SqliteStore::open(&path).unwrap();
    let swept = s.sweep(T + 200, batch).unwrap();
    assert_eq!(swept.timed_out, good);
    assert_eq!(swept.skipped, bad);
    assert_reports_corrupt_rows(&swept.corrupt, MAX_REPORTED_CORRUPT);
    assert_good_timed_out_bad_untouched(&path, good, bad);
}

/// A well-formed expired promise whose timeout has to read a corrupt row
/// (an awaiter's, to resume it) is skipped whole: none of its timeout is
/// written, and the error names the row that stopped it.
#[test]
fn a_timeout_that_meets_a_corrupt_row_is_skipped_whole() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.db");
    {
        let s = SqliteStore::open(&path).unwrap();
        let invoked = Target::pool("workers");
        s.create(
            &CreateRequest::new("awaited", T + 10).target(invoked.clone()),
            T,
        )
        .unwrap();
        s.create(&CreateRequest::new("awaiter", T + 1_000).target(invoked), T)
            .unwrap();
        s.create(&CreateRequest::new("good-0", T + 20), T).unwrap();
        let awaits = CallbackRequest {
            awaited: "awaited".into(),
            awaiter: "awaiter".into(),
            pool: "workers".into(),
            preferred_worker: None,
        };
        s.register_callback(&awaits, T).unwrap();
    }
    corrupt(&path, "awaiter", "tags = '[]'");
    let s = SqliteStore::open(&path).unwrap();
    let (timed_out, skipped) = sweep(&s, T + 200, 10).unwrap();
    assert_eq!(timed_out, 1);
    match skipped.as_slice() {
        [PromiseError::Corrupt { message, .. }]
            if message.contains("promise \"awaiter\": column tags") => {}
        other => panic!("{other:?}"),
    }
    let states = raw_states(&path);
    assert_eq!(states["good-0"], TIMED_OUT);
    assert_eq!(states["awaited"], PENDING, "its timeout was undone");
    let conn = Connection::open(&path).unwrap();
    let count = |sql: &str| conn.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap();
    assert_eq!(
        count("SELECT COUNT(*) FROM tasks WHERE promise_id = 'awaited'"),
        1,
        "its invoke task was kept"
    );
    assert_eq!(count("SELECT COUNT(*) FROM callbacks"), 1);
}

/// A failure that is not a corrupt row (here the crash hook, standing for
/// an I/O error) still fails the sweep, and undoes every timeout of it.
#[test]
fn a_storage_failure_still_fails_the_sweep_past_corrupt_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = expired_store(&dir, 3, 2);
    let s = SqliteStore::open(&path).unwrap();
    // Each timeout here passes one crash point: fail at the second.
    s.set_crash_hook(Some(CrashHook::FailAt(1)));
    assert_eq!(sweep(&s, T + 200, 10), Err(PromiseError::Crashed));
    let states = raw_states(&path);
    assert!(states.values().all(|&s| s == PENDING), "{states:?}");
    s.set_crash_hook(None);
    assert_eq!(sweep(&s, T + 200, 10).unwrap().0, 3);
}

/// The two queries that list ids alone (the due promises, the prunable
/// ones) name an id they cannot read by its rowid and column, as the other
/// readers name a row.
#[test]
fn the_id_listings_name_an_unreadable_id_by_rowid_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.db");
    {
        let s = SqliteStore::open(&path).unwrap();
        s.create(&CreateRequest::new("due", T + 10), T).unwrap();
        s.create(&CreateRequest::new("done", T + 10), T).unwrap();
        s.complete(&CompleteRequest::new("done", Completion::Resolve), T)
            .unwrap();
    }
    corrupt(&path, "due", "id = x'ff00'");
    corrupt(&path, "done", "id = CAST(x'64ff' AS TEXT)");
    let rowid = |blob: &str| -> i64 {
        Connection::open(&path)
            .unwrap()
            .query_row(
                &format!("SELECT rowid FROM promises WHERE id = {blob}"),
                [],
                |r| r.get(0),
            )
            .unwrap()
    };
    let due = format!(
        "promise at rowid {} (its id cannot be read): column id holds a 2-byte blob (expected text)",
        rowid("x'ff00'")
    );
    let done = format!(
        "promise at rowid {} (its id cannot be read): column id holds text \"d\u{fffd}\" (not UTF-8)",
        rowid("CAST(x'64ff' AS TEXT)")
    );
    let s = SqliteStore::open(&path).unwrap();
    let names = |e: &PromiseError, expected: &str| matches!(e, PromiseError::Corrupt { message, .. } if message == expected);
    // A read lists the due promises to time them out first: it fails.
    let found = s.search(&SearchQuery::new("*").limit(10), T + 200);
    assert!(
        found.as_ref().is_err_and(|e| names(e, &due)),
        "{found:?}\nexpected {due}"
    );
    // A sweep and a prune skip the row, and report it.
    let (timed_out, skipped) = sweep(&s, T + 200, 10).unwrap();
    assert_eq!(timed_out, 0);
    assert!(
        matches!(skipped.as_slice(), [e] if names(e, &due)),
        "{skipped:?}\nexpected {due}"
    );
    let (pruned, skipped) = prune(&s, T + 200, 10).unwrap();
    assert_eq!(pruned, 0);
    assert!(
        matches!(skipped.as_slice(), [e] if names(e, &done)),
        "{skipped:?}\nexpected {done}"
    );
}

/// Prune lists ids, then deletes them: an id it cannot read is skipped
/// and reported, however many come first, and the rest are pruned.
#[test]
fn prune_deletes_the_good_promises_past_unreadable_ids() {
    for (good, bad, batch) in [(5, 2, 10), (5, 3, 3), (5, 8, 3), (3, 5, 1)] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.db");
        {
            let s = SqliteStore::open(&path).unwrap();
            let ids = (0..bad)
                .map(|i| format!("bad-{i}"))
                .chain((0..good).map(|i| format!("good-{i}")));
            for id in ids {
                s.create(&CreateRequest::new(&id, T + 100), T).unwrap();
                s.complete(&CompleteRequest::new(&id, Completion::Resolve), T)
                    .unwrap();
            }
        }
        for i in 0..bad {
            // Text that is not UTF-8 sorts with the text ids, before the
            // good ones; a blob after them.
            let set = if i % 2 == 0 { ODD[3] } else { ODD[1] };
            corrupt(&path, &format!("bad-{i}"), set);
        }
        let s = SqliteStore::open(&path).unwrap();
        let mut pruned = 0;
        for round in 0.. {
            assert!(round < 100, "the prunes never came back short");
            let (n, skipped) = prune(&s, T + 1, batch).unwrap();
            pruned += n;
            if n < batch {
                // The listing went to its end: every corrupt row is in it.
                assert_reports_corrupt_rows(&skipped, bad);
                break;
            }
            // A full prune stops where it has pruned `batch`, maybe
            // before some corrupt rows.
            assert!(skipped.len() <= bad, "{skipped:#?}");
            assert_reports_corrupt_rows(&skipped, skipped.len());
        }
        assert_eq!(pruned, good, "{good} {bad} {batch}");
        let left = raw_states(&path);
        assert!(
            left.len() == bad && left.keys().all(|id| id.starts_with("bad-")),
            "{left:?}"
        );
    }
}

/// The background sweeper goes on timing out new promises while a corrupt
/// expired row stays in the file (it met that row first on every sweep).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweeper_keeps_timing_out_new_promises_past_a_corrupt_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.db");
    let store = Arc::new(SqliteStore::open(&path).unwrap());
    let now = now_millis();
    store
        .create(&CreateRequest::new("bad", now + 3_600_000), now)
        .unwrap();
    corrupt(&path, "bad", "timeout_at = 1, tags = 'not json'");
    let sweeper = spawn_sweeper(
        Arc::clone(&store) as Arc<dyn Store>,
        Duration::from_millis(10),
        2,
    );
    for round in 0..3 {
        let now = now_millis();
        let ids: Vec<String> = (0..5).map(|i| format!("p{round}-{i}")).collect();
        for id in &ids {
            store
                .create(&CreateRequest::new(id, now + 20), now)
                .unwrap();
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            // Raw states: only the sweeper can have timed them out.
            let states = raw_states(&path);
            if ids.iter().all(|id| states[id] == TIMED_OUT) {
                assert_eq!(states["bad"], PENDING);
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "round {round} not swept: {states:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    sweeper.abort();
}
