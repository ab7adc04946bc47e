//! A store this process cannot write is refused at open, as a bad path
//! (`InvalidArgument`) naming the file or its folder and why: SQLite opened
//! a file it may not write read-only, without a word, and the first write
//! failed as an untyped storage error; in a folder it may not write, where
//! a store in WAL mode cannot make its -wal and -shm files, it failed with
//! "attempt to write a readonly database".
//!
//! Permissions do not stop root: run as root, the test runs its checks in
//! a copy of itself as `nobody` (with util-linux's `setpriv`).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use askpool_promises::{CreateRequest, PromiseError, SqliteStore, State, Store};

const TEST: &str = "stores_this_process_cannot_write_are_refused_at_open";
/// Set in the copy that runs the checks: the folder laid out for them.
const CHECK_IN: &str = "ASKPOOL_READ_ONLY_CHECK_IN";
const NOBODY: &str = "65534";
const T: u64 = 1_000_000;

#[test]
fn stores_this_process_cannot_write_are_refused_at_open() {
    if let Some(base) = std::env::var_os(CHECK_IN) {
        return check(Path::new(&base));
    }
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path();
    lay_out(base);
    if std::fs::metadata(base.join("writable/ok.db"))
        .unwrap()
        .uid()
        == 0
    {
        // A copy in the laid-out folder: the build's own folder may be one
        // `nobody` cannot enter (a checkout under /root).
        let copy = base.join("read_only_check");
        std::fs::copy(std::env::current_exe().unwrap(), &copy).unwrap();
        chmod(&copy, 0o755);
        let run = Command::new("setpriv")
            .args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups"])
            .arg(&copy)
            .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
            .env(CHECK_IN, base)
            .output()
            .expect("setpriv runs the checks as nobody (as root, no permission stops a write)");
        let out = String::from_utf8_lossy(&run.stdout);
        let err = String::from_utf8_lossy(&run.stderr);
        assert!(run.status.success(), "as nobody:\n{out}\n{err}");
        assert!(out.contains("1 passed"), "the checks ran as nobody:\n{out}");
    } else {
        check(base);
    }
    chmod(&base.join("rodir"), 0o755);
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// `writable/ok.db`: a store anyone may write. `rofile/p.db`: a store no
/// one but root may write, in a folder anyone may write. `rodir/`: a folder
/// no one but root may write, holding a store and an empty file that
/// anyone may write.
fn lay_out(base: &Path) {
    chmod(base, 0o755);
    for (folder, store) in [("writable", "ok.db"), ("rofile", "p.db"), ("rodir", "p.db")] {
        let folder = base.join(folder);
        std::fs::create_dir(&folder).unwrap();
        chmod(&folder, 0o777);
        let path = folder.join(store);
        SqliteStore::open(&path)
            .unwrap()
            .create(&CreateRequest::new("kept", T + 100), T)
            .unwrap();
        chmod(&path, 0o666);
    }
    std::fs::write(base.join("rodir/empty.db"), b"").unwrap();
    chmod(&base.join("rodir/empty.db"), 0o666);
    chmod(&base.join("rofile/p.db"), 0o444);
    chmod(&base.join("rodir"), 0o555);
}

/// The message `open` refuses `path` with.
fn refused(opened: Result<SqliteStore, PromiseError>, path: &Path) -> String {
    match opened {
        Err(PromiseError::InvalidArgument { message }) => message,
        other => panic!("{}: {:?}", path.display(), other.map(|_| ())),
    }
}

fn check(base: &Path) {
    let ok = SqliteStore::open(base.join("writable/ok.db")).unwrap();
    ok.create(&CreateRequest::new("new", T + 100), T).unwrap();
    assert_eq!(ok.get("kept", T).unwrap().state, State::Pending);

    let file = base.join("rofile/p.db");
    let before = std::fs::read(&file).unwrap();
    for opened in [SqliteStore::open(&file), SqliteStore::open_existing(&file)] {
        let message = refused(opened, &file);
        assert!(message.contains(&*file.to_string_lossy()), "{message}");
        assert!(message.contains("read-only"), "{message}");
    }
    assert_eq!(std::fs::read(&file).unwrap(), before, "left untouched");

    let folder = base.join("rodir");
    for name in ["p.db", "empty.db", "new.db"] {
        let path = folder.join(name);
        let message = refused(SqliteStore::open(&path), &path);
        assert!(
            message.contains(&format!("folder {}", folder.display())),
            "{message}"
        );
        assert!(message.contains("-wal"), "{message}");
    }
    assert!(!folder.join("new.db").exists());
}
