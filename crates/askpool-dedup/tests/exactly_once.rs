//! The exactly-once helpers of seed 001.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use askpool_dedup::{
    fingerprint, DedupConfig, ExactlyOnce, ExactlyOnceBytesDedup, ExactlyOnceDedup, PayloadMismatch,
};
use askpool_proto::{CallerId, DedupKey, PayloadFingerprint, RequestId};
use bytes::Bytes;

fn config() -> DedupConfig {
    DedupConfig {
        max_terminal: 1_000,
        terminal_ttl: Duration::from_secs(60),
    }
}

fn msg(n: u64, payload: &'static [u8]) -> ExactlyOnce<&'static [u8]> {
    ExactlyOnce::new(RequestId::from_parts(1, n), payload)
}

const CALLER: CallerId = CallerId::from_u64(9);

#[test]
fn the_second_call_returns_the_cached_result_without_running() {
    let dedup = ExactlyOnceDedup::<String>::new(config());
    let runs = AtomicU32::new(0);
    let m = msg(1, b"pay");
    let run = || {
        runs.fetch_add(1, Ordering::SeqCst);
        format!("reply {}", runs.load(Ordering::SeqCst))
    };
    assert_eq!(dedup.resolve(m.key(CALLER), run), "reply 1");
    assert_eq!(dedup.resolve(m.key(CALLER), run), "reply 1");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // Another caller with the same request id is another key.
    assert_eq!(dedup.resolve(m.key(CallerId::from_u64(10)), run), "reply 2");
}

#[test]
fn a_different_fingerprint_is_a_payload_mismatch_and_does_not_run() {
    let dedup = ExactlyOnceDedup::<u32>::new(config());
    let a = msg(1, b"a");
    let b = msg(1, b"b");
    assert_ne!(a.fingerprint(), b.fingerprint());
    assert_eq!(
        dedup.resolve_checked(a.key(CALLER), a.fingerprint(), || 1),
        Ok(1)
    );
    assert_eq!(
        dedup.resolve_checked(a.key(CALLER), a.fingerprint(), || 2),
        Ok(1)
    );
    let err = dedup.resolve_checked(b.key(CALLER), b.fingerprint(), || panic!("must not run"));
    assert_eq!(err, Err(PayloadMismatch { key: a.key(CALLER) }));
    assert!(matches!(
        askpool_proto::AskError::from(err.unwrap_err()),
        askpool_proto::AskError::PayloadMismatch
    ));
    assert_eq!(dedup.resolve_payload(a.key(CALLER), b"a", || 3), Ok(1));
    assert!(dedup.resolve_payload(a.key(CALLER), b"z", || 3).is_err());
}

#[test]
fn an_entry_stored_unchecked_fails_a_checked_call_closed() {
    let dedup = ExactlyOnceDedup::<u32>::new(config());
    let m = msg(2, b"x");
    assert_eq!(dedup.resolve(m.key(CALLER), || 5), 5);
    let err = dedup.resolve_checked(m.key(CALLER), m.fingerprint(), || panic!("must not run"));
    assert!(err.is_err());
    // An unchecked duplicate still replays.
    assert_eq!(dedup.resolve(m.key(CALLER), || 6), 5);
}

#[test]
fn error_results_are_cached_and_replayed() {
    let dedup = ExactlyOnceDedup::<Result<u32, String>>::new(config());
    let key = msg(3, b"").key(CALLER);
    assert_eq!(
        dedup.resolve(key, || Err("nope".into())),
        Err("nope".to_string())
    );
    assert_eq!(dedup.resolve(key, || Ok(1)), Err("nope".to_string()));
}

/// Panics when cloned while armed.
struct Fragile {
    value: u32,
    arm: Arc<AtomicU32>,
}

impl Clone for Fragile {
    fn clone(&self) -> Self {
        if self.arm.load(Ordering::SeqCst) > 0 {
            self.arm.fetch_sub(1, Ordering::SeqCst);
            panic!("clone panicked");
        }
        Self {
            value: self.value,
            arm: self.arm.clone(),
        }
    }
}

#[test]
fn a_panicking_clone_leaves_the_record_in_place() {
    let dedup = ExactlyOnceDedup::<Fragile>::new(config());
    let key = msg(4, b"").key(CALLER);
    let arm = Arc::new(AtomicU32::new(1));
    let runs = AtomicU32::new(0);
    let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        dedup.resolve(key, || {
            runs.fetch_add(1, Ordering::SeqCst);
            Fragile {
                value: 42,
                arm: arm.clone(),
            }
        })
    }));
    assert!(first.is_err(), "the clone for return panicked");
    // The side effect is recorded: the retry replays, it does not re-run.
    let again = dedup.resolve(key, || unreachable!("the record was lost"));
    assert_eq!(again.value, 42);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[test]
fn a_panicking_computation_records_nothing_and_may_run_again() {
    let dedup = ExactlyOnceDedup::<u32>::new(config());
    let key = msg(5, b"").key(CALLER);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        dedup.resolve(key, || panic!("handler failed"))
    }));
    assert!(r.is_err());
    assert!(dedup.is_empty());
    assert_eq!(dedup.resolve(key, || 7), 7);
}

#[test]
fn the_bytes_variant_replays_the_same_buffer() {
    let dedup = ExactlyOnceBytesDedup::new(config());
    let key = msg(6, b"").key(CALLER);
    let first = dedup.resolve(key, || Bytes::from(vec![7u8; 4096]));
    let second = dedup.resolve(key, || Bytes::from_static(b"other"));
    let third = dedup.resolve(key, || Bytes::from_static(b"other"));
    assert_eq!(first.as_ptr(), second.as_ptr(), "a replay copied the bytes");
    assert_eq!(second.as_ptr(), third.as_ptr());
    assert_eq!(second.len(), 4096);
}

#[test]
fn a_duplicate_waits_for_the_original_outcome() {
    let dedup = Arc::new(ExactlyOnceDedup::<u32>::new(config()));
    let key = DedupKey {
        caller: CALLER,
        request: RequestId::from_parts(1, 99),
    };
    let started = Arc::new(std::sync::Barrier::new(2));
    let runs = Arc::new(AtomicU32::new(0));
    let first = {
        let (dedup, started, runs) = (dedup.clone(), started.clone(), runs.clone());
        std::thread::spawn(move || {
            dedup.resolve(key, || {
                started.wait();
                std::thread::sleep(Duration::from_millis(50));
                runs.fetch_add(1, Ordering::SeqCst);
                11
            })
        })
    };
    started.wait();
    // The original is running: this call waits for it.
    assert_eq!(dedup.resolve(key, || 12), 11);
    assert_eq!(first.join().unwrap(), 11);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[test]
fn fingerprints_are_128_bit_and_stable() {
    assert_eq!(fingerprint(b"abc"), fingerprint(b"abc"));
    assert_ne!(fingerprint(b"abc"), fingerprint(b"abd"));
    assert_ne!(fingerprint(b""), PayloadFingerprint::from_u128(0));
    // Both halves are used.
    let fp = fingerprint(b"askpool").as_u128();
    assert!(fp >> 64 != 0 && fp as u64 != 0);
}
