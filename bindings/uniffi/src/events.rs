//! The hot path's way back into the JVM. A uniffi callback costs tens of
//! microseconds in JNA (each builds a `Structure` for its call status; see
//! the `kotlin` bench's floors), so the two events every ask produces (a
//! request for a host handler, a host-object reply) go through this queue
//! instead: one JVM thread blocks in [`askpool_hot_wait`] and takes them in
//! batches of plain integers, and so do tells accepted. Everything rarer
//! still uses the foreign traits.

use std::cell::RefCell;
use std::panic::catch_unwind;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::payload::HostRef;

pub const REPLY: i64 = 1;
pub const HANDLE: i64 = 2;
/// The handle word of a reply of nothing (Kotlin's `null`): a tell accepted.
pub const NO_OBJECT: i64 = 0;
/// Or'ed into an event's kind when a hot call holds its object until
/// `askpool_hot_release`; a hot call with no such event needs no release.
pub const HELD_FLAG: i64 = 0x100;

pub struct Event {
    words: [i64; 4],
    /// Keeps the object in the handle table until the JVM has looked it up,
    /// unless something else keeps it that long.
    keep: Option<Arc<HostRef>>,
}

#[derive(Default)]
struct Queue {
    events: Vec<Event>,
    /// The batch the consumer is working on; dropped when it comes back.
    held: Vec<Event>,
    waiting: bool,
}

static QUEUE: Mutex<Queue> = Mutex::new(Queue {
    events: Vec::new(),
    held: Vec::new(),
    waiting: false,
});
static READY: Condvar = Condvar::new();

/// An event for the JVM: to the hot call in progress on this thread if
/// there is one (it returns the event itself), else to the event thread.
pub fn push(kind: i64, a: i64, b: i64, keep: Arc<HostRef>) {
    push_event(Event {
        words: [kind, a, b, keep.handle()],
        keep: Some(keep),
    });
}

/// An event whose object something else keeps until the JVM has looked it
/// up (a request's message stays with its running request).
pub fn push_unheld(kind: i64, a: i64, b: i64, handle: i64) {
    push_event(Event {
        words: [kind, a, b, handle],
        keep: None,
    });
}

fn push_event(event: Event) {
    if let Some(event) = crate::exec::capture(event) {
        enqueue(event);
    }
}

/// An event for the event thread.
pub fn enqueue(event: Event) {
    let mut q = QUEUE.lock();
    q.events.push(event);
    if q.waiting {
        READY.notify_one();
    }
}

thread_local! {
    /// The objects of the events a hot call returned on this thread, kept
    /// until the JVM has looked them up (`askpool_hot_release`).
    static HELD: RefCell<Vec<Event>> = const { RefCell::new(Vec::new()) };
}

/// Writes a hot call's events to `buf` (4 words each) after `skip` words;
/// those over `cap` go to the event thread. Returns how many were written.
///
/// # Safety
/// `buf` must point to `skip + 4 * cap` writable `i64`s.
pub unsafe fn hand_over(events: Vec<Event>, buf: *mut i64, skip: usize, cap: usize) -> usize {
    let mut written = 0;
    HELD.with(|held| {
        let mut held = held.borrow_mut();
        for event in events {
            if written < cap && !buf.is_null() {
                let mut words = event.words;
                if event.keep.is_some() {
                    words[0] |= HELD_FLAG;
                }
                // SAFETY: the caller provides skip + 4 * cap words.
                unsafe {
                    std::ptr::copy_nonoverlapping(words.as_ptr(), buf.add(skip + 4 * written), 4);
                }
                if event.keep.is_some() {
                    held.push(event);
                }
                written += 1;
            } else {
                enqueue(event);
            }
        }
    });
    written
}

/// The JVM has looked up the objects of this thread's last hot call.
/// Returns 0, or -2 if it panicked (a panic must not cross into the JVM).
#[no_mangle]
pub extern "C" fn askpool_hot_release() -> i32 {
    catch_unwind(|| HELD.with(|h| h.borrow_mut().clear()))
        .map(|()| 0)
        .unwrap_or(-2)
}

/// Waits up to `timeout_ms` for events and writes up to `cap` of them to
/// `buf` as 4 words each: kind, a, b, handle. Returns how many, or -2 if
/// it panicked. One caller at a time: each call releases the previous
/// batch.
///
/// # Safety
/// `buf` must point to `4 * cap` writable `i64`s.
#[no_mangle]
pub unsafe extern "C" fn askpool_hot_wait(buf: *mut i64, cap: i32, timeout_ms: i32) -> i32 {
    // SAFETY: the caller's guarantee, passed on.
    catch_unwind(|| unsafe { wait(buf, cap, timeout_ms) }).unwrap_or(-2)
}

/// [`askpool_hot_wait`] without the panic guard.
///
/// # Safety
/// `buf` must point to `4 * cap` writable `i64`s.
unsafe fn wait(buf: *mut i64, cap: i32, timeout_ms: i32) -> i32 {
    let cap = usize::try_from(cap).unwrap_or(0);
    if buf.is_null() || cap == 0 {
        return 0;
    }
    let released = {
        let mut q = QUEUE.lock();
        let released = std::mem::take(&mut q.held);
        if q.events.is_empty() {
            q.waiting = true;
            let timeout = Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(0));
            let _ = READY.wait_for(&mut q, timeout);
            q.waiting = false;
        }
        let n = q.events.len().min(cap);
        let batch: Vec<Event> = q.events.drain(..n).collect();
        for (i, e) in batch.iter().enumerate() {
            // SAFETY: the caller provides 4 * cap words and i < n <= cap.
            unsafe { std::ptr::copy_nonoverlapping(e.words.as_ptr(), buf.add(4 * i), 4) };
        }
        q.held = batch;
        released
    };
    // Dropping handles takes the release lock: outside the queue's lock.
    drop(released);
    i32::try_from(QUEUE.lock().held.len()).unwrap_or(i32::MAX)
}
