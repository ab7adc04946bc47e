//! What a worker queue's ends share besides the flume channel: the `Notify`
//! its workers wait on, and a count of the work it holds.
//!
//! A worker looks at its own inbox and at the pool's queue several times per
//! request (before it waits, once more after registering its wake-up, and
//! when woken), and most of those looks find nothing. flume's `try_recv`
//! takes the channel's lock even when it is empty; the count answers "empty"
//! with one atomic load. It is a hint, never the truth about an item: it is
//! raised after the item is in the channel and before the wake-up, so a
//! worker that saw zero and then waits is woken by the same push; a taker
//! may briefly lower it below an item not yet counted, which only costs a
//! `try_recv` that finds nothing.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::futures::Notified;
use tokio::sync::Notify;

#[derive(Default)]
pub(crate) struct QueueSignal {
    ready: Notify,
    /// Items pushed and not yet taken (wrapping: see the module docs).
    len: AtomicUsize,
}

impl QueueSignal {
    /// Sends `item` on `tx` and wakes one waiting worker; gives the item
    /// back if the receiving end is gone.
    pub(crate) fn push<T>(&self, tx: &flume::Sender<T>, item: T) -> Result<(), T> {
        tx.send(item).map_err(|flume::SendError(back)| back)?;
        self.len.fetch_add(1, Ordering::Release);
        // The worker that went idle last: its state is likely still in the
        // cache of the thread pushing now (the longest idle one's is not).
        self.ready.notify_last();
        Ok(())
    }

    /// The next item on `rx`, skipping the channel when the count says it
    /// is empty.
    pub(crate) fn take<T>(&self, rx: &flume::Receiver<T>) -> Option<T> {
        if self.len.load(Ordering::Acquire) == 0 {
            return None;
        }
        let item = rx.try_recv().ok()?;
        self.len.fetch_sub(1, Ordering::AcqRel);
        Some(item)
    }

    pub(crate) fn notified(&self) -> Notified<'_> {
        self.ready.notified()
    }

    pub(crate) fn notify_waiters(&self) {
        self.ready.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_follows_pushes_and_takes() {
        let signal = QueueSignal::default();
        let (tx, rx) = flume::unbounded();
        assert_eq!(signal.take(&rx), None::<u32>);
        signal.push(&tx, 1).unwrap();
        signal.push(&tx, 2).unwrap();
        assert_eq!(signal.take(&rx), Some(1));
        assert_eq!(signal.take(&rx), Some(2));
        assert_eq!(signal.take(&rx), None);
        assert_eq!(signal.len.load(Ordering::Relaxed), 0);
        drop(rx);
        assert_eq!(signal.push(&tx, 3), Err(3), "a closed queue gives it back");
        assert_eq!(signal.len.load(Ordering::Relaxed), 0);
    }

    /// An item pushed by another thread is never missed: a taker that sees
    /// nothing and then waits (its wake-up registered before a second look)
    /// gets every item.
    #[test]
    fn no_push_is_missed_across_threads() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let signal = std::sync::Arc::new(QueueSignal::default());
            let (tx, rx) = flume::unbounded::<u32>();
            const N: u32 = 20_000;
            let taker = {
                let signal = std::sync::Arc::clone(&signal);
                tokio::spawn(async move {
                    let mut got = 0;
                    while got < N {
                        if signal.take(&rx).is_some() {
                            got += 1;
                            continue;
                        }
                        let notified = signal.notified();
                        tokio::pin!(notified);
                        notified.as_mut().enable();
                        if signal.take(&rx).is_some() {
                            got += 1;
                            continue;
                        }
                        notified.await;
                    }
                    got
                })
            };
            let pusher = tokio::task::spawn_blocking(move || {
                for i in 0..N {
                    signal.push(&tx, i).unwrap();
                }
            });
            pusher.await.unwrap();
            let got = tokio::time::timeout(std::time::Duration::from_secs(30), taker)
                .await
                .expect("the taker saw every push")
                .unwrap();
            assert_eq!(got, N);
        });
    }
}
