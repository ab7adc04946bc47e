//! What a durable ask's promise holds: its outcome recorded in the store
//! (settling the promise), and read back as the ask's outcome.

use std::time::Duration;

use askpool::{AskError, ErrorClass, ErrorCode};

use crate::durable::Durable;
use crate::error::PromiseError;
use crate::facade::DurablePromises;
use crate::model::{Completion, Promise, State};
use crate::rules::MAX_VALUE_BYTES;
use crate::store::off_runtime;

/// How many times recording an outcome meets a store locked by another
/// writer (each time past its busy timeout), a poll apart, before the ask
/// gives up on recording it: a lock that passes must not lose an outcome,
/// and one that does not must not keep the caller waiting for good.
const RECORD_ATTEMPTS: usize = 5;

/// How an ask's outcome goes into its promise.
enum Record<R> {
    /// Not an outcome of the request: a transient failure, a cancel, and
    /// `NoRoute` (no pool of that name on this node yet: a restarted caller
    /// may await before it registers its pools again; recorded, it would
    /// refuse the request for good without any worker seeing it).
    Not(AskError),
    /// Settles the promise; `outcome` is what the caller gets if it does.
    Settle {
        outcome: Result<R, AskError>,
        completion: Completion,
        value: Vec<u8>,
    },
}

/// How the outcome of durable ask `id` goes into its promise.
fn record_of<R: Durable>(id: &str, outcome: Result<R, AskError>) -> Record<R> {
    match outcome {
        Ok(reply) => match reply.to_bytes().and_then(storable) {
            Ok(value) => Record::Settle {
                outcome: Ok(reply),
                completion: Completion::Resolve,
                value,
            },
            // Recorded as what a later await would meet: not the reply.
            Err(message) => {
                let error = AskError::DecodeFailure {
                    message: format!("the reply of durable ask {id} cannot be stored: {message}"),
                };
                let value = encode_error(&error);
                Record::Settle {
                    outcome: Err(error),
                    completion: Completion::Reject,
                    value,
                }
            }
        },
        Err(e)
            if e.class() == ErrorClass::Transient
                || matches!(e.code(), ErrorCode::AskCancelled | ErrorCode::NoRoute) =>
        {
            Record::Not(e)
        }
        Err(e) => {
            let value = encode_error(&e);
            Record::Settle {
                outcome: Err(e),
                completion: Completion::Reject,
                value,
            }
        }
    }
}

/// Settles the promise with the ask's outcome, unless the failure is worth
/// asking again; a promise someone else settled first wins. Store calls run
/// off the runtime; recording one meeting a locked store is tried again (see
/// `RECORD_ATTEMPTS`). If it still cannot be recorded, the promise stays
/// pending and the caller gets `Unavailable` saying so, not the outcome: an
/// outcome it read could differ from the one a later await records, when
/// the ask is asked again under its id (answered from the pool's reply
/// cache while it keeps it, else by the handler running again).
pub(crate) async fn record<R: Durable>(
    promises: &DurablePromises,
    id: &str,
    outcome: Result<R, AskError>,
) -> Result<R, AskError> {
    let (outcome, completion, value) = match record_of(id, outcome) {
        // Unless the promise was settled meanwhile another way: that is the
        // ask's outcome, as every later await reads it.
        Record::Not(e) => {
            return match promises.look(id).await {
                Ok(Some(p)) if p.state.is_settled() => outcome_of(&p),
                _ => Err(e),
            };
        }
        Record::Settle {
            outcome,
            completion,
            value,
        } => (outcome, completion, value),
    };
    let pause = promises.poll.max(Duration::from_millis(1));
    let mut attempts = 1;
    let settled = loop {
        let (to, key, value) = (promises.clone(), id.to_owned(), value.clone());
        match off_runtime(move || settle(&to, &key, completion, value)).await {
            Err(PromiseError::Locked { .. }) if attempts < RECORD_ATTEMPTS => {
                attempts += 1;
                tokio::time::sleep(pause).await;
            }
            settled => break settled,
        }
    };
    match settled {
        Ok(None) => outcome,
        Ok(Some(p)) => outcome_of(&p),
        Err(e @ PromiseError::Locked { .. }) => Err(AskError::Unavailable {
            reason: format!(
                "the outcome of durable ask {id} was not recorded ({e}); it stays pending, \
                 and the next await of it asks again"
            ),
        }),
        Err(e) => Err(e.into()),
    }
}

/// Completes the promise under the ask's id as its key. `Some`: the
/// promise as someone else settled it first (by hand, by another
/// process's ask), or as an earlier attempt of this one did; its outcome
/// is the ask's, as every later await reads it.
fn settle(
    promises: &DurablePromises,
    id: &str,
    completion: Completion,
    value: Vec<u8>,
) -> crate::store::Result<Option<Promise>> {
    match promises.complete(id, completion, value, Some(id.to_owned())) {
        Ok(done) => Ok(done.replayed.then_some(done.promise)),
        Err(PromiseError::AlreadySettled { .. }) => promises.get(id).map(Some),
        Err(e) => Err(e),
    }
}

/// What a replay of the ask's dead letter got (whoever replays it: the
/// node's `replay_dead_letter`, in any binding) is recorded as the ask's
/// own outcome would have been, so that a pending promise is not asked,
/// and its handler run, again later. Recorded where the replay ends, once:
/// the hook must not block for long. A store that fails here leaves the
/// promise pending, as a transient failure does.
pub(crate) fn recorder<R: Durable + Send + 'static>(
    promises: &DurablePromises,
    key: &str,
) -> impl Fn(Result<R, AskError>) + Send + Sync + 'static {
    let promises = promises.clone();
    let key = key.to_owned();
    move |outcome| {
        if let Record::Settle {
            completion, value, ..
        } = record_of(&key, outcome)
        {
            let _ = settle(&promises, &key, completion, value);
        }
    }
}

/// `bytes`, if a promise can hold them.
fn storable(bytes: Vec<u8>) -> Result<Vec<u8>, String> {
    if bytes.len() > MAX_VALUE_BYTES {
        return Err(format!(
            "it is {} bytes; a promise holds at most {MAX_VALUE_BYTES}",
            bytes.len()
        ));
    }
    Ok(bytes)
}

pub(crate) fn outcome_of<R: Durable>(p: &Promise) -> Result<R, AskError> {
    let value = p.value.as_deref().unwrap_or_default();
    match p.state {
        State::Resolved => {
            R::from_bytes(value).map_err(|message| AskError::DecodeFailure { message })
        }
        State::Rejected => Err(decode_error(value)),
        State::Canceled => Err(AskError::FailedPrecondition {
            message: format!(
                "durable ask {} was canceled{}",
                p.id,
                settled_by_hand(value)
            ),
        }),
        State::TimedOut => Err(AskError::DeadlineExceeded),
        State::Pending => Err(AskError::internal("outcome of a pending promise")),
    }
}

/// The value a promise was settled with by hand, for an error's message:
/// `": TEXT"` for printable UTF-8, its size for other bytes, nothing if empty.
fn settled_by_hand(value: &[u8]) -> String {
    match std::str::from_utf8(value) {
        _ if value.is_empty() => String::new(),
        Ok(text) if !text.chars().any(char::is_control) => format!(": {text}"),
        _ => format!(" (a value of {} bytes)", value.len()),
    }
}

fn encode_error(e: &AskError) -> Vec<u8> {
    // The bare message of a code `decode_error` rebuilds, so that the
    // error reads back as it was first raised.
    let (type_name, message) = match e {
        AskError::HandlerFailed { type_name, message } => (type_name.clone(), message.clone()),
        AskError::DecodeFailure { message }
        | AskError::InvalidArgument { message }
        | AskError::ValidationError { message }
        | AskError::PermissionDenied { message }
        | AskError::FailedPrecondition { message }
        | AskError::Internal { message } => (String::new(), message.clone()),
        e => (String::new(), e.to_string()),
    };
    serde_json::json!({ "code": e.code().as_str(), "type": type_name, "message": message })
        .to_string()
        .into_bytes()
}

/// A stored rejection as an error: a handler's failure, a taxonomy error a
/// handler may raise (`ValidationError`, `PermissionDenied`, ...: the same
/// exception class in every binding as when first raised), or a value that
/// cannot be stored or read, comes back as it was; any other code as
/// `FailedPrecondition` naming it. A value that is no stored error (a
/// promise rejected by hand: `askpool promises reject ID --value TEXT`, a
/// store's `reject`) is `FailedPrecondition` carrying its text.
fn decode_error(bytes: &[u8]) -> AskError {
    let v: serde_json::Value = serde_json::from_slice(bytes).unwrap_or_default();
    if !v.get("code").is_some_and(serde_json::Value::is_string) {
        return AskError::FailedPrecondition {
            message: format!("durable ask rejected{}", settled_by_hand(bytes)),
        };
    }
    let s = |k: &str| {
        v.get(k)
            .and_then(|x| x.as_str())
            .unwrap_or_default()
            .to_owned()
    };
    let code = ErrorCode::from_name(&s("code"));
    if code == Some(ErrorCode::HandlerFailed) {
        AskError::handler_failed(s("type"), s("message"))
    } else if let Some(error) = code.and_then(|code| AskError::of_message(code, s("message"))) {
        // Rebuilt as stored (`DecodeFailure` is about the value itself: the
        // same answer every time it is read).
        error
    } else {
        AskError::FailedPrecondition {
            message: format!("durable ask rejected with {}: {}", s("code"), s("message")),
        }
    }
}
