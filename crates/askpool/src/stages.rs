//! Stage streams: an ask's ACK lifecycle as it happens (DESIGN section 4,
//! "every caller can watch its ask's stages as a stream"), and a
//! [`StageRelay`] that streams the asks of one request made more than once
//! (a durable ask asked again after a transient failure) one after another.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use askpool_proto::StageEvent;
use parking_lot::Mutex;

use crate::ask::AskHandle;
use crate::pending::AskSlot;

/// The stage events of one ask, as they happen: SENT, RECEIVED, READ,
/// PARTIAL progress, then one terminal stage, after which the stream ends.
/// Events carry their time and the time since the previous stage. Empty when
/// the node does not track stages. One stream per ask at a time: a second
/// one opened while the first is open ends at once (two would split the
/// events between them, and one would wait forever); once the first is
/// dropped, the next opened starts from the ask's record.
///
/// Opened on a [`StageRelay`], it gives each relayed ask's events in turn
/// (each from its SENT to its terminal stage) and ends after the last one's
/// once the relay has ended.
pub struct StageStream<R>(Streaming<R>);

enum Streaming<R> {
    Ask(AskStream<R>),
    Relay(RelayStream<R>),
}

impl<R> StageStream<R> {
    pub(crate) fn of_ask(slot: Arc<AskSlot<R>>) -> Self {
        Self(Streaming::Ask(AskStream::open(slot)))
    }
}

impl<R> futures::Stream for StageStream<R> {
    type Item = StageEvent;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<StageEvent>> {
        match &mut self.get_mut().0 {
            Streaming::Ask(ask) => ask.poll_next(cx),
            Streaming::Relay(relay) => relay.poll_next(cx),
        }
    }
}

struct AskStream<R> {
    slot: Arc<AskSlot<R>>,
    /// Whether this is the ask's one open stream (else it is empty).
    first: bool,
}

impl<R> AskStream<R> {
    fn open(slot: Arc<AskSlot<R>>) -> Self {
        let first = slot.open_stream();
        Self { slot, first }
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<StageEvent>> {
        if !self.first {
            return Poll::Ready(None);
        }
        self.slot.poll_stage(cx)
    }
}

impl<R> Drop for AskStream<R> {
    fn drop(&mut self) {
        if self.first {
            self.slot.close_stream();
        }
    }
}

/// An ask's stage record, from which its [`StageStream`] can be opened
/// later. What a binding keeps when it hands the [`AskHandle`] itself to an
/// executor: opening a stream for every ask would copy every stage event
/// into a queue nobody reads. A stream opened late starts with the record so
/// far: SENT, RECEIVED, READ, the most recent
/// [`MAX_PARTIAL_EVENTS`](askpool_proto::ack::MAX_PARTIAL_EVENTS) progress
/// events and the terminal stage. The source of a [`StageRelay`] opens the
/// relay's stream.
pub struct StageSource<R>(Origin<R>);

enum Origin<R> {
    Ask(Arc<AskSlot<R>>),
    Relay(Arc<StageRelay<R>>),
}

impl<R> StageSource<R> {
    pub(crate) fn of_ask(slot: Arc<AskSlot<R>>) -> Self {
        Self(Origin::Ask(slot))
    }

    /// The stage stream (one at a time: a second one ends at once, see
    /// [`StageStream`]).
    pub fn open(&self) -> StageStream<R> {
        match &self.0 {
            Origin::Ask(slot) => StageStream::of_ask(Arc::clone(slot)),
            Origin::Relay(relay) => StageRelay::open(relay),
        }
    }
}

impl<R> Clone for StageSource<R> {
    fn clone(&self) -> Self {
        Self(match &self.0 {
            Origin::Ask(slot) => Origin::Ask(Arc::clone(slot)),
            Origin::Relay(relay) => Origin::Relay(Arc::clone(relay)),
        })
    }
}

/// The asks relayed and not yet dropped for newer ones: a request asked
/// again after every transient failure (a durable ask whose pool is
/// missing, for an hour) would otherwise keep every ask's record.
pub const MAX_RELAYED_ASKS: usize = 16;

/// The stages of one request asked more than once, ask after ask: each
/// [`relay`](Self::relay)ed ask's events from its SENT to its terminal
/// stage, then the next one's, and the end of the stream after
/// [`end`](Self::end). A stream opened late starts with the most recent
/// [`MAX_RELAYED_ASKS`] asks' records. One stream at a time, as for one ask.
pub struct StageRelay<R> {
    state: Mutex<RelayState<R>>,
}

struct RelayState<R> {
    /// The most recent asks, oldest first.
    asks: VecDeque<Arc<AskSlot<R>>>,
    /// How many asks were dropped off the front: the index of `asks[0]`
    /// among all the asks relayed.
    dropped: usize,
    ended: bool,
    /// A stream is open (a second one ends at once).
    open: bool,
    waker: Option<Waker>,
}

impl<R> Default for StageRelay<R> {
    fn default() -> Self {
        Self {
            state: Mutex::new(RelayState {
                asks: VecDeque::new(),
                dropped: 0,
                ended: false,
                open: false,
                waker: None,
            }),
        }
    }
}

impl<R> StageRelay<R> {
    /// A relay with no asks yet.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Streams `ask`'s stages after those of the asks relayed before it.
    /// Ignored once the relay has ended. One stream per ask holds here
    /// too: while the ask's own stream (`AskHandle::stages`) is open, the
    /// relay's gives nothing of that ask, and the other way round.
    pub fn relay<M>(&self, ask: &AskHandle<M, R>)
    where
        M: Clone + Send + 'static,
        R: Clone + Send + 'static,
    {
        let (waker, dropped) = {
            let mut state = self.state.lock();
            if state.ended {
                return;
            }
            let dropped = if state.asks.len() == MAX_RELAYED_ASKS {
                state.dropped += 1;
                state.asks.pop_front()
            } else {
                None
            };
            state.asks.push_back(ask.slot());
            (state.waker.take(), dropped)
        };
        // Outside the lock: a waker may run code that takes it again, and
        // the last hold of an ask's record lets go of what it holds.
        drop(dropped);
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// No more asks: a stream ends after the last one's terminal stage.
    pub fn end(&self) {
        let waker = {
            let mut state = self.state.lock();
            state.ended = true;
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// The relay's [`StageSource`].
    pub fn source(self: &Arc<Self>) -> StageSource<R> {
        StageSource(Origin::Relay(Arc::clone(self)))
    }

    /// The relay's stream (see [`StageStream`]).
    pub fn open(self: &Arc<Self>) -> StageStream<R> {
        let first = !std::mem::replace(&mut self.state.lock().open, true);
        StageStream(Streaming::Relay(RelayStream {
            relay: Arc::clone(self),
            first,
            ask: None,
            next: 0,
        }))
    }
}

struct RelayStream<R> {
    relay: Arc<StageRelay<R>>,
    /// Whether this is the relay's one open stream (else it is empty).
    first: bool,
    /// The stream of the ask being read.
    ask: Option<AskStream<R>>,
    /// The index (among all the asks relayed) of the next ask to read.
    next: usize,
}

impl<R> RelayStream<R> {
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<StageEvent>> {
        if !self.first {
            return Poll::Ready(None);
        }
        loop {
            if let Some(ask) = &mut self.ask {
                match ask.poll_next(cx) {
                    Poll::Ready(None) => self.ask = None,
                    other => return other,
                }
            }
            let mut state = self.relay.state.lock();
            // Asks dropped for newer ones before this stream read them are
            // skipped.
            let next = self.next.max(state.dropped);
            if let Some(slot) = state.asks.get(next - state.dropped) {
                let slot = Arc::clone(slot);
                drop(state);
                self.next = next + 1;
                self.ask = Some(AskStream::open(slot));
                continue;
            }
            if state.ended {
                return Poll::Ready(None);
            }
            let replaced = state.waker.replace(cx.waker().clone());
            drop(state);
            drop(replaced);
            return Poll::Pending;
        }
    }
}

impl<R> Drop for RelayStream<R> {
    fn drop(&mut self) {
        if self.first {
            let waker = {
                let mut state = self.relay.state.lock();
                state.open = false;
                state.waker.take()
            };
            drop(waker);
        }
    }
}
