//! Property tests: random event sequences through the inbound table and the
//! caller state machine, checked against small independent models.

use std::collections::HashMap;
use std::time::Duration;

use askpool_proto::inbound::step;
use askpool_proto::{
    AskError, CallerAsk, CallerPhase, CallerSend, CallerStep, CancelReason, InboundAction,
    InboundEvent, InboundState, Outcome, PayloadFingerprint, Resolution, RetryPolicy, Timestamp,
};
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;

const CASES: u32 = 2_000;

fn reason_strategy() -> impl Strategy<Value = CancelReason> {
    prop_oneof![
        Just(CancelReason::Caller),
        Just(CancelReason::CallerTimeout),
        Just(CancelReason::Worker),
        Just(CancelReason::ProcessingTimeout),
        Just(CancelReason::Shutdown),
    ]
}

// ===================================================================== inbound

const KEYS: usize = 3;
const FP1: PayloadFingerprint = PayloadFingerprint::from_u128(1);
const FP2: PayloadFingerprint = PayloadFingerprint::from_u128(2);

/// One generated inbound event.
///
/// Decision on `HandlerFinished`: it is generated for any key. The harness
/// knows which handlers are running (a `RunHandlerAndAck` was answered and
/// the handler has not finished); a finish for such a key is a real one. A
/// finish for a key without a running handler is "stray" (e.g. a handler that
/// outlived a restart): it is fed too, and must send nothing and change
/// nothing. A running handler finishes at most once: after its finish, a
/// later finish for the key is stray again.
#[derive(Clone, Debug)]
enum InEv {
    Request(usize, Option<PayloadFingerprint>),
    Cancel(usize, CancelReason),
    Finish(usize, Outcome<u32>),
}

fn inbound_event_strategy() -> impl Strategy<Value = InEv> {
    let key = 0..KEYS;
    let fp = prop_oneof![Just(None), Just(Some(FP1)), Just(Some(FP2))];
    let outcome = prop_oneof![
        (0u32..4).prop_map(Ok),
        Just(Err(AskError::handler_failed("E", "m"))),
        Just(Err(AskError::internal("boom"))),
    ];
    prop_oneof![
        4 => (key.clone(), fp).prop_map(|(k, f)| InEv::Request(k, f)),
        2 => (key.clone(), reason_strategy()).prop_map(|(k, r)| InEv::Cancel(k, r)),
        3 => (key, outcome).prop_map(|(k, o)| InEv::Finish(k, o)),
    ]
}

/// What the independent model remembers about one key.
#[derive(Clone, Debug, Default)]
struct KeyModel {
    /// The payload check of the entry: `None` = no entry yet; `Some(None)` =
    /// tombstone (admits all); `Some(Some(fp))` = the creating request's
    /// fingerprint (`None` inside = unchecked).
    creator: Option<Option<Option<PayloadFingerprint>>>,
    handler_runs: u32,
    running: bool,
    replies_sent: u32,
    reply: Option<Outcome<u32>>,
    /// The first cancel's reason, once the key is cancelled (tombstone or not).
    cancelled: Option<CancelReason>,
}

impl KeyModel {
    fn admits(&self, incoming: Option<PayloadFingerprint>) -> bool {
        match self.creator {
            None | Some(None) => true,
            Some(Some(_)) if incoming.is_none() => true,
            Some(Some(None)) => false,
            Some(Some(Some(stored))) => incoming == Some(stored),
        }
    }
    fn terminal(&self) -> bool {
        self.reply.is_some() || self.cancelled.is_some()
    }
}

fn run_inbound(events: &[InEv]) -> Result<(), TestCaseError> {
    let mut store: HashMap<usize, InboundState<u32>> = HashMap::new();
    let mut model: Vec<KeyModel> = vec![KeyModel::default(); KEYS];

    for (i, ev) in events.iter().enumerate() {
        let (key, event) = match ev {
            InEv::Request(k, fp) => (*k, InboundEvent::Request { fingerprint: *fp }),
            InEv::Cancel(k, r) => (*k, InboundEvent::Cancel { reason: *r }),
            InEv::Finish(k, o) => (*k, InboundEvent::HandlerFinished { outcome: o.clone() }),
        };
        let before = store.get(&key).cloned();
        let t = step(before.as_ref(), event);
        let m = &mut model[key];
        let ctx = format!("event #{i} {ev:?} on {before:?} -> {t:?}");

        // Terminal states never change.
        if let Some(b) = &before {
            if b.is_terminal() {
                prop_assert!(t.next.is_none(), "terminal state moved: {}", ctx);
            }
        }
        // The store only ever moves absent -> InProgress/Cancelled and
        // InProgress -> Replied/Cancelled.
        if let (Some(b), Some(n)) = (&before, &t.next) {
            prop_assert!(!b.is_terminal() && n.is_terminal(), "bad move: {}", ctx);
            prop_assert_eq!(
                b.fingerprint(),
                n.fingerprint(),
                "fingerprint changed: {}",
                &ctx
            );
        }

        match (ev, &t.action) {
            (InEv::Request(_, fp), action) => {
                let expected_mismatch = m.creator.is_some() && !m.admits(*fp);
                if expected_mismatch {
                    prop_assert_eq!(action, &InboundAction::RejectMismatch, "{}", &ctx);
                    prop_assert!(t.next.is_none(), "mismatch changed state: {}", ctx);
                } else if m.creator.is_none() {
                    prop_assert_eq!(action, &InboundAction::RunHandlerAndAck, "{}", &ctx);
                    m.creator = Some(Some(*fp));
                    m.handler_runs += 1;
                    m.running = true;
                } else if let Some(reason) = m.cancelled {
                    prop_assert_eq!(action, &InboundAction::SendCancelled(reason), "{}", &ctx);
                } else if let Some(reply) = &m.reply {
                    prop_assert_eq!(action, &InboundAction::Replay(reply.clone()), "{}", &ctx);
                } else {
                    prop_assert_eq!(action, &InboundAction::Ack, "{}", &ctx);
                }
            }
            (InEv::Cancel(_, reason), action) => {
                if m.terminal() {
                    prop_assert_eq!(action, &InboundAction::Ignore, "{}", &ctx);
                } else if m.creator.is_none() {
                    prop_assert_eq!(action, &InboundAction::RecordTombstone, "{}", &ctx);
                    m.creator = Some(None);
                    m.cancelled = Some(*reason);
                } else {
                    prop_assert_eq!(action, &InboundAction::SendCancelled(*reason), "{}", &ctx);
                    m.cancelled = Some(*reason);
                }
            }
            (InEv::Finish(_, outcome), action) => {
                if m.running {
                    m.running = false;
                    if m.cancelled.is_some() {
                        prop_assert_eq!(action, &InboundAction::SuppressReply, "{}", &ctx);
                    } else {
                        prop_assert_eq!(
                            action,
                            &InboundAction::SendReply(outcome.clone()),
                            "{}",
                            &ctx
                        );
                        m.reply = Some(outcome.clone());
                    }
                } else {
                    // Stray finish: nothing may be sent and nothing change.
                    prop_assert!(
                        matches!(action, InboundAction::Ignore | InboundAction::SuppressReply),
                        "stray finish acted: {}",
                        ctx
                    );
                    prop_assert!(t.next.is_none(), "stray finish changed state: {}", ctx);
                }
            }
        }

        // Counting invariants, independent of which branch ran above.
        match &t.action {
            InboundAction::RunHandlerAndAck => {
                prop_assert!(m.handler_runs <= 1, "handler started twice: {}", ctx);
            }
            InboundAction::SendReply(o) => {
                m.replies_sent += 1;
                prop_assert!(m.replies_sent <= 1, "second SendReply: {}", ctx);
                prop_assert!(m.cancelled.is_none(), "reply after cancel: {}", ctx);
                prop_assert_eq!(Some(o), m.reply.as_ref());
            }
            InboundAction::Replay(o) => {
                prop_assert!(m.cancelled.is_none(), "replay after cancel: {}", ctx);
                prop_assert_eq!(m.replies_sent, 1, "replay without a reply: {}", &ctx);
                prop_assert_eq!(Some(o), m.reply.as_ref(), "replay differs: {}", &ctx);
            }
            _ => {}
        }

        if let Some(next) = t.next {
            store.insert(key, next);
        }
    }

    // The final store agrees with the model.
    for (key, m) in model.iter().enumerate() {
        let stored = store.get(&key);
        match (stored, &m.reply, m.cancelled) {
            (None, None, None) => prop_assert!(m.creator.is_none()),
            (Some(InboundState::InProgress { .. }), None, None) => prop_assert!(m.running),
            (Some(InboundState::Replied { outcome, .. }), Some(r), None) => {
                prop_assert_eq!(outcome, r)
            }
            (Some(InboundState::Cancelled { reason, .. }), None, Some(r)) => {
                prop_assert_eq!(*reason, r)
            }
            (s, r, c) => prop_assert!(false, "key {key}: store {s:?}, model {r:?} {c:?}"),
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn inbound_random_sequences_match_the_model(
        events in prop::collection::vec(inbound_event_strategy(), 0..40)
    ) {
        run_inbound(&events)?;
    }
}

// ====================================================================== caller

#[derive(Clone, Debug)]
enum CallEv {
    Ack,
    ReplyOk,
    /// A reply whose error is transient (a handler's, cached): final.
    ReplyTransient,
    ReplyPermanent,
    /// The pool turned an attempt away with a transient error.
    RefusedTransient,
    WorkerCancelled(CancelReason),
    LocalCancel,
    /// Applies to the send just made; ignored (not fed) if there is none.
    SendFailedTransient,
    SendFailedPermanent,
    /// The driver's timer fires at `next_wakeup()`.
    TimerFires,
    /// Time passes; if a wakeup was passed, the (late) timer fires at the new time.
    Advance(u64),
    /// `on_timer` at the current time whether or not anything is due.
    SpuriousTimer,
}

fn caller_event_strategy() -> impl Strategy<Value = CallEv> {
    prop_oneof![
        2 => Just(CallEv::Ack),
        1 => Just(CallEv::ReplyOk),
        1 => Just(CallEv::ReplyTransient),
        1 => Just(CallEv::ReplyPermanent),
        2 => Just(CallEv::RefusedTransient),
        1 => reason_strategy().prop_map(CallEv::WorkerCancelled),
        1 => Just(CallEv::LocalCancel),
        2 => Just(CallEv::SendFailedTransient),
        1 => Just(CallEv::SendFailedPermanent),
        5 => Just(CallEv::TimerFires),
        3 => (0u64..800).prop_map(CallEv::Advance),
        1 => Just(CallEv::SpuriousTimer),
    ]
}

fn policy_strategy() -> impl Strategy<Value = RetryPolicy> {
    (1u32..6, 0.0f64..0.5, 1u64..500, 1.0f64..3.0, 1u64..10).prop_map(
        |(max_attempts, jitter, initial_ms, multiplier, cap_factor)| RetryPolicy {
            max_attempts,
            initial_delay: Duration::from_millis(initial_ms),
            multiplier,
            max_delay: Duration::from_millis(initial_ms * cap_factor),
            jitter,
            ..RetryPolicy::default()
        },
    )
}

fn transient() -> AskError {
    AskError::BufferFull {
        pool: "p".into(),
        limit: 1,
    }
}

struct CallerHarness {
    ask: CallerAsk,
    policy: RetryPolicy,
    rng: SmallRng,
    now: Timestamp,
    deadline: Timestamp,
    resolutions: Vec<Resolution>,
    last_attempt: u32,
    /// A request send whose transport result has not been reported yet.
    pending_send: bool,
    /// Acked, and no transient reply has re-opened the re-sends since.
    acked: bool,
    log: Vec<String>,
}

impl CallerHarness {
    /// Checks one step's output against the model and records it.
    fn check(&mut self, what: &str, was_done: bool, step: CallerStep) -> Result<(), TestCaseError> {
        self.log.push(format!("{what} @{:?} -> {step:?}", self.now));
        let ctx = || self.log.join("\n  ");
        if was_done {
            prop_assert_eq!(
                &step,
                &CallerStep::default(),
                "event after Done:\n  {}",
                ctx()
            );
            prop_assert!(self.ask.is_done());
            prop_assert_eq!(
                self.ask.next_wakeup(),
                None,
                "wakeup after Done:\n  {}",
                ctx()
            );
            return Ok(());
        }
        match step.send {
            Some(CallerSend::Request { attempt }) => {
                prop_assert_eq!(
                    attempt,
                    self.last_attempt + 1,
                    "attempt skipped:\n  {}",
                    ctx()
                );
                prop_assert!(
                    attempt <= self.policy.max_attempts,
                    "over max:\n  {}",
                    ctx()
                );
                prop_assert!(
                    self.now < self.deadline,
                    "send at/after deadline:\n  {}",
                    ctx()
                );
                prop_assert!(!self.acked, "re-send after Ack:\n  {}", ctx());
                prop_assert!(step.resolution.is_none(), "send + resolve:\n  {}", ctx());
                self.last_attempt = attempt;
                self.pending_send = true;
            }
            Some(CallerSend::Cancel { reason }) => {
                let expected = match &step.resolution {
                    Some(Resolution::Failed(AskError::AskTimeout { .. })) => {
                        CancelReason::CallerTimeout
                    }
                    Some(Resolution::Failed(AskError::AskCancelled {
                        reason: CancelReason::Caller,
                    })) => CancelReason::Caller,
                    other => {
                        return Err(TestCaseError::fail(format!(
                            "cancel sent with {other:?}:\n  {}",
                            ctx()
                        )));
                    }
                };
                prop_assert_eq!(reason, expected, "{}", ctx());
            }
            None => {}
        }
        prop_assert_eq!(self.ask.attempts_sent(), self.last_attempt, "{}", ctx());
        if let Some(r) = step.resolution {
            if let Resolution::Failed(AskError::AskTimeout { .. }) = r {
                prop_assert!(self.now >= self.deadline, "early timeout:\n  {}", ctx());
            }
            self.resolutions.push(r);
            prop_assert_eq!(self.resolutions.len(), 1, "second resolution:\n  {}", ctx());
            prop_assert!(self.ask.is_done(), "resolved but not Done:\n  {}", ctx());
            prop_assert_eq!(self.ask.next_wakeup(), None, "{}", ctx());
            self.pending_send = false;
        } else {
            prop_assert!(
                !self.ask.is_done(),
                "Done without a resolution:\n  {}",
                ctx()
            );
            let wake = self.ask.next_wakeup();
            prop_assert!(
                wake.is_some_and(|w| w <= self.deadline),
                "pending ask without a wakeup, or one past the deadline ({wake:?}):\n  {}",
                ctx()
            );
        }
        Ok(())
    }

    fn apply(&mut self, ev: &CallEv) -> Result<(), TestCaseError> {
        // The driver reports the transport result of a send before anything
        // else happens: a failure if the event says so, otherwise success.
        let is_send_failure = matches!(
            ev,
            CallEv::SendFailedTransient | CallEv::SendFailedPermanent
        );
        if self.pending_send && !is_send_failure {
            self.ask.on_sent();
            self.pending_send = false;
        }
        let was_done = self.ask.is_done();
        let now = self.now;
        match ev {
            CallEv::Ack => {
                let before = self.ask.phase();
                self.ask.on_ack();
                if !was_done {
                    self.acked = true;
                    prop_assert_eq!(self.ask.phase(), CallerPhase::Acked);
                    prop_assert_eq!(self.ask.next_wakeup(), Some(self.deadline));
                } else {
                    prop_assert_eq!(before, CallerPhase::Done);
                }
                self.check("ack", was_done, CallerStep::default())
            }
            CallEv::ReplyOk | CallEv::ReplyPermanent | CallEv::ReplyTransient => {
                // Whatever its error, an outcome is final.
                let step = self.ask.on_reply();
                if !was_done {
                    prop_assert_eq!(&step.resolution, &Some(Resolution::Replied), "{:?}", ev);
                    prop_assert_eq!(step.send, None);
                }
                self.check(&format!("{ev:?}"), was_done, step)
            }
            CallEv::RefusedTransient => {
                let before = self.ask.phase();
                let step = self.ask.on_refused(now, &transient(), &mut self.rng);
                if before == CallerPhase::Acked {
                    // A late answer to an earlier attempt: the pool holds
                    // the request, nothing changes.
                    prop_assert_eq!(&step, &CallerStep::default());
                    prop_assert_eq!(self.ask.phase(), CallerPhase::Acked);
                } else if !was_done {
                    prop_assert_eq!(step.send, None);
                    match &step.resolution {
                        Some(r) => prop_assert_eq!(r, &Resolution::Replied),
                        None => {
                            // Re-opened: only while attempts and time remain,
                            // and a re-send is then due before the deadline.
                            prop_assert!(self.last_attempt < self.policy.max_attempts);
                            prop_assert!(now < self.deadline);
                            prop_assert_eq!(self.ask.phase(), CallerPhase::Unacked);
                            prop_assert!(self.ask.next_wakeup().unwrap() < self.deadline);
                            self.acked = false;
                        }
                    }
                }
                self.check("refused transient", was_done, step)
            }
            CallEv::WorkerCancelled(reason) => {
                let step = self.ask.on_cancelled(*reason);
                if !was_done {
                    prop_assert_eq!(
                        &step,
                        &CallerStep {
                            send: None,
                            resolution: Some(Resolution::Failed(AskError::AskCancelled {
                                reason: *reason
                            })),
                        }
                    );
                }
                self.check("worker cancelled", was_done, step)
            }
            CallEv::LocalCancel => {
                let step = self.ask.cancel();
                if !was_done {
                    prop_assert_eq!(
                        &step,
                        &CallerStep {
                            send: Some(CallerSend::Cancel {
                                reason: CancelReason::Caller
                            }),
                            resolution: Some(Resolution::Failed(AskError::AskCancelled {
                                reason: CancelReason::Caller
                            })),
                        }
                    );
                }
                self.check("local cancel", was_done, step)
            }
            CallEv::SendFailedTransient | CallEv::SendFailedPermanent => {
                if !self.pending_send {
                    // No send to fail: a driver never reports this.
                    return Ok(());
                }
                self.pending_send = false;
                let permanent_failure = matches!(ev, CallEv::SendFailedPermanent);
                let error = if permanent_failure {
                    AskError::NoRoute { pool: "p".into() }
                } else {
                    AskError::unavailable("down")
                };
                let phase = self.ask.phase();
                let step = self.ask.on_send_failed(now, error.clone(), &mut self.rng);
                prop_assert_eq!(step.send, None);
                if phase == CallerPhase::Unacked && permanent_failure {
                    prop_assert_eq!(&step.resolution, &Some(Resolution::Failed(error)));
                } else if phase != CallerPhase::Unacked {
                    prop_assert_eq!(&step, &CallerStep::default());
                }
                self.check(&format!("{ev:?}"), was_done, step)
            }
            CallEv::TimerFires => {
                if let Some(w) = self.ask.next_wakeup() {
                    self.now = self.now.max(w);
                }
                self.fire_timer("timer")
            }
            CallEv::Advance(ms) => {
                self.now = self.now + Duration::from_millis(*ms);
                match self.ask.next_wakeup() {
                    Some(w) if w <= self.now => self.fire_timer("late timer"),
                    _ => Ok(()),
                }
            }
            CallEv::SpuriousTimer => {
                let due = self.ask.next_wakeup().is_some_and(|w| w <= self.now);
                let step = self.ask.on_timer(self.now, &mut self.rng);
                if !due {
                    prop_assert_eq!(&step, &CallerStep::default(), "timer fired early");
                }
                self.check("spurious timer", was_done, step)
            }
        }
    }

    fn fire_timer(&mut self, what: &str) -> Result<(), TestCaseError> {
        let was_done = self.ask.is_done();
        let step = self.ask.on_timer(self.now, &mut self.rng);
        if !was_done && self.now >= self.deadline {
            prop_assert!(
                matches!(
                    step.resolution,
                    Some(Resolution::Failed(AskError::AskTimeout { .. }))
                ),
                "timer at/after the deadline did not time out: {step:?}"
            );
        }
        self.check(what, was_done, step)
    }
}

fn run_caller(
    policy: RetryPolicy,
    start_ms: u64,
    timeout_ms: u64,
    seed: u64,
    events: &[CallEv],
) -> Result<(), TestCaseError> {
    let started = Timestamp::from_nanos(1_000_000) + Duration::from_millis(start_ms);
    let timeout = Duration::from_millis(timeout_ms);
    let mut h = CallerHarness {
        ask: CallerAsk::new(policy, started, timeout),
        policy,
        rng: SmallRng::seed_from_u64(seed),
        now: started,
        deadline: started + timeout,
        resolutions: Vec::new(),
        last_attempt: 0,
        pending_send: false,
        acked: false,
        log: Vec::new(),
    };
    let step = h.ask.start(h.now, &mut h.rng);
    if timeout_ms == 0 {
        prop_assert_eq!(step.send, None, "sent with no time at all");
        let timed_out = matches!(
            step.resolution,
            Some(Resolution::Failed(AskError::AskTimeout { .. }))
        );
        prop_assert!(timed_out, "start past the deadline: {:?}", step);
    } else {
        prop_assert_eq!(step.send, Some(CallerSend::Request { attempt: 1 }));
    }
    h.check("start", false, step)?;

    for ev in events {
        h.apply(ev)?;
    }

    // End of the run: the clock passes the deadline and the timer fires.
    if h.pending_send {
        h.ask.on_sent();
        h.pending_send = false;
    }
    h.now = h.now.max(h.deadline) + Duration::from_millis(1);
    h.fire_timer("final timer")?;

    prop_assert!(
        h.ask.is_done(),
        "ask never terminated:\n  {}",
        h.log.join("\n  ")
    );
    prop_assert_eq!(
        h.resolutions.len(),
        1,
        "resolutions {:?}:\n  {}",
        &h.resolutions,
        h.log.join("\n  ")
    );
    prop_assert_eq!(h.ask.next_wakeup(), None);
    // And stays inert.
    for ev in [
        CallEv::Ack,
        CallEv::ReplyOk,
        CallEv::ReplyTransient,
        CallEv::RefusedTransient,
        CallEv::WorkerCancelled(CancelReason::Worker),
        CallEv::LocalCancel,
        CallEv::SpuriousTimer,
    ] {
        h.apply(&ev)?;
    }
    prop_assert_eq!(h.resolutions.len(), 1);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn caller_random_sequences_resolve_exactly_once(
        policy in policy_strategy(),
        start_ms in 0u64..10_000,
        timeout_ms in prop_oneof![1 => Just(0u64), 20 => 1u64..3_000],
        seed in any::<u64>(),
        events in prop::collection::vec(caller_event_strategy(), 0..40),
    ) {
        prop_assert!(policy.validate().is_ok(), "generated an invalid policy {:?}", policy);
        run_caller(policy, start_ms, timeout_ms, seed, &events)?;
    }
}
