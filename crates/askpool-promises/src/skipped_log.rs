//! Warnings for the corrupt rows that sweeps and prunes skip. The store
//! reports them ([`Swept::corrupt`](crate::Swept), [`Pruned::corrupt`](crate::Pruned))
//! and does not log them: the rows stay in the file, so every later sweep
//! meets them again, and a warning per row per sweep would flood the log of
//! a process whose sweeper runs every second. The two callers that run
//! sweeps on their own log them instead: the sweeper when what its sweeps
//! skip changes, [`DurablePromises::prune`](crate::DurablePromises::prune)
//! once per call.

use std::collections::BTreeSet;

use crate::error::PromiseError;
use crate::store::MAX_REPORTED_CORRUPT;

/// What a run of sweeps (or of prunes) skipped. The rows stay listed, so
/// each call of a run meets those before it again: the count is the most
/// any call skipped, the errors the distinct ones reported (at most
/// [`MAX_REPORTED_CORRUPT`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct SkippedRows {
    count: usize,
    errors: BTreeSet<String>,
}

impl SkippedRows {
    pub(crate) fn add(&mut self, skipped: usize, corrupt: &[PromiseError]) {
        self.count = self.count.max(skipped);
        for error in corrupt {
            if self.errors.len() == MAX_REPORTED_CORRUPT {
                break;
            }
            self.errors.insert(error.to_string());
        }
    }

    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// One warning naming them (none if nothing was skipped).
    pub(crate) fn warn(&self, what: &str) {
        if self.count == 0 {
            return;
        }
        let listed: Vec<&str> = self.errors.iter().map(String::as_str).collect();
        let more = self.count.saturating_sub(listed.len());
        let more = if more > 0 {
            format!("; and {more} more")
        } else {
            String::new()
        };
        tracing::warn!(
            skipped = self.count,
            "{what} skipped {} promise(s) that read corrupt rows, left as they are until the file is repaired: {}{more}",
            self.count,
            listed.join("; "),
        );
    }
}

/// The sweeper's log of what its sweeps skip: a warning when that changes
/// (new corrupt rows, or some repaired), nothing while it stays the same,
/// and a note once none are left.
#[derive(Default)]
pub(crate) struct SweeperLog {
    last: SkippedRows,
}

impl SweeperLog {
    /// What one tick's sweeps skipped.
    pub(crate) fn tick(&mut self, now: SkippedRows) {
        if now == self.last {
            return;
        }
        if now.count == 0 {
            tracing::info!("promise sweep: the corrupt rows it skipped are gone");
        } else {
            now.warn("promise sweep");
        }
        self.last = now;
    }
}
