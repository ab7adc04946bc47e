//! What a sweep or a prune that meets corrupt rows logs. The rows stay in
//! the file, so every later sweep meets them again: the store reports them
//! without logging, the sweeper warns when what it skips changes (not at
//! every tick), `DurablePromises::prune` once per call.
//!
//! One subscriber for the whole binary (a thread's own would miss what the
//! runtime's other threads log, and tracing caches per call site whether
//! anyone listens), and one test at a time.

use std::sync::{Arc, Mutex, MutexGuard, Once};
use std::time::Duration;

use askpool_promises::{
    now_millis, spawn_sweeper, CompleteRequest, Completion, CreateRequest, DurablePromises,
    SqliteStore, Store,
};
use rusqlite::Connection;

mod expired_rows;
use expired_rows::{corrupt, expired_store, T};

/// Every log line of this binary, at debug level and up.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    /// The lines of `level` that contain `text`.
    fn lines(&self, level: &str, text: &str) -> Vec<String> {
        String::from_utf8(self.0.lock().unwrap().clone())
            .unwrap()
            .lines()
            .filter(|l| l.contains(level) && l.contains(text))
            .map(str::to_owned)
            .collect()
    }
}

/// The binary's log, emptied, for a test that holds the guard.
fn capture() -> (MutexGuard<'static, ()>, Log) {
    static INSTALL: Once = Once::new();
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    static LOG: std::sync::OnceLock<Log> = std::sync::OnceLock::new();
    let log = LOG.get_or_init(Log::default).clone();
    INSTALL.call_once(|| {
        let writer = log.clone();
        tracing::subscriber::set_global_default(
            tracing_subscriber::fmt()
                .with_ansi(false)
                .with_max_level(tracing::Level::DEBUG)
                .with_writer(move || writer.clone())
                .finish(),
        )
        .unwrap();
    });
    let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    log.0.lock().unwrap().clear();
    (guard, log)
}

/// A store asked directly reports what it skipped and logs nothing: its
/// caller decides (the corrupt rows stay, and every sweep meets them).
#[test]
fn a_sweep_or_prune_reports_corrupt_rows_without_logging_them() {
    let (_one, log) = capture();
    let dir = tempfile::tempdir().unwrap();
    let path = expired_store(&dir, 2, 3);
    let s = SqliteStore::open(&path).unwrap();
    for _ in 0..3 {
        assert_eq!(s.sweep(T + 200, 10).unwrap().skipped, 3);
    }
    s.complete(&CompleteRequest::new("later-1", Completion::Resolve), T)
        .unwrap();
    corrupt(&path, "later-1", "id = CAST(id AS BLOB)");
    let pruned = s.prune(T + 1_000_000, 10).unwrap();
    // The two timed out; the settled one whose id cannot be read, skipped.
    assert_eq!((pruned.pruned, pruned.skipped), (2, 1), "{pruned:?}");
    assert_eq!(log.lines("WARN", ""), Vec::<String>::new());
}

/// The sweeper meets the same corrupt rows at every tick: it warns of them
/// once, again only when what it skips changes, and says when none are
/// left (before, every tick logged every row).
#[test]
fn the_sweeper_warns_of_the_corrupt_rows_it_skips_when_they_change() {
    let (_one, log) = capture();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(sweeper_warns_when_what_it_skips_changes(log));
}

async fn sweeper_warns_when_what_it_skips_changes(log: Log) {
    let dir = tempfile::tempdir().unwrap();
    // All past their timeouts by the wall clock the sweeper reads.
    let path = expired_store(&dir, 2, 3);
    let store = Arc::new(SqliteStore::open(&path).unwrap());
    let sweeper = spawn_sweeper(
        Arc::clone(&store) as Arc<dyn Store>,
        Duration::from_millis(2),
        10,
    );
    let ticks = |log: &Log| log.lines("DEBUG", "promise sweep").len();
    let warnings = |log: &Log| log.lines("WARN", "promise sweep skipped");
    let wait_ticks = |n: usize| {
        let log = log.clone();
        async move {
            let start = ticks(&log);
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            while ticks(&log) < start + n {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the sweeper stopped"
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    };
    wait_ticks(20).await;
    let first = warnings(&log);
    assert_eq!(first.len(), 1, "{first:#?}");
    assert!(
        first[0].contains("skipped 3 promise(s)") && first[0].contains("bad-0"),
        "{}",
        first[0]
    );
    // One more corrupt expired row: one more warning, naming the four. Made
    // due and corrupt in one write: a sweep between the two would time it
    // out as a well-formed promise.
    let now = now_millis();
    store
        .create(&CreateRequest::new("bad-new", now + 3_600_000), now)
        .unwrap();
    corrupt(
        &path,
        "bad-new",
        &format!("tags = 'not json', timeout_at = {}", T + 5),
    );
    wait_ticks(20).await;
    let second = warnings(&log);
    assert_eq!(second.len(), 2, "{second:#?}");
    assert!(
        second[1].contains("skipped 4 promise(s)") && second[1].contains("bad-new"),
        "{}",
        second[1]
    );
    // Repaired (here: removed): said once, and no warning after it.
    Connection::open(&path)
        .unwrap()
        // The corrupt rows: the sweeps timed out every other promise.
        .execute("DELETE FROM promises WHERE state = 0", [])
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while log
        .lines("INFO", "corrupt rows it skipped are gone")
        .is_empty()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no note of the repair"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    tokio::time::sleep(Duration::from_millis(40)).await;
    assert_eq!(warnings(&log).len(), 2);
    assert_eq!(
        log.lines("INFO", "corrupt rows it skipped are gone").len(),
        1
    );
    sweeper.abort();
}

/// `DurablePromises::prune` warns once per call of what it skipped, its
/// sweep's and its prune's, however many batches met them.
#[test]
fn durable_prune_warns_once_of_what_it_skipped() {
    let (_one, log) = capture();
    let dir = tempfile::tempdir().unwrap();
    let path = expired_store(&dir, 2, 3);
    {
        let s = SqliteStore::open(&path).unwrap();
        s.create(&CreateRequest::new("settled", T + 100), T)
            .unwrap();
        s.complete(&CompleteRequest::new("settled", Completion::Resolve), T)
            .unwrap();
    }
    corrupt(&path, "settled", "id = CAST(id AS BLOB)");
    let promises = DurablePromises::open(&path).unwrap();
    for call in 1..=2 {
        // The five well-formed promises timed out, then pruned, by the
        // first call; the four corrupt rows stay.
        let pruned = promises.prune(Duration::ZERO).unwrap();
        assert_eq!(pruned, if call == 1 { 5 } else { 0 });
        let swept = log.lines("WARN", "prune's sweep skipped 3 promise(s)");
        let skipped = log.lines("WARN", "prune skipped 1 promise(s)");
        assert_eq!(
            (swept.len(), skipped.len()),
            (call, call),
            "{:#?}",
            log.lines("WARN", "")
        );
    }
}
