//! Model-based test: random operation sequences on a simulated clock, the
//! lock-free table against a `HashMap` + TTL + FIFO model.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use askpool_dedup::{DedupConfig, DedupState, DedupStats, DedupTable};
use askpool_proto::{CallerId, DedupKey, RequestId, Timestamp};
use proptest::prelude::*;

#[derive(Clone, Debug, PartialEq)]
enum St {
    Running(u8),
    Done(u8),
}

impl DedupState for St {
    fn is_terminal(&self) -> bool {
        matches!(self, St::Done(_))
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// A transition: what the closure stores given what it sees.
    Apply {
        key: u8,
        to: Option<St>,
    },
    Get {
        key: u8,
    },
    Evict,
    Clear,
}

fn op() -> impl Strategy<Value = (u64, Op)> {
    let key = 0u8..12;
    let st = prop_oneof![(0u8..4).prop_map(St::Running), (0u8..4).prop_map(St::Done)];
    let op = prop_oneof![
        8 => (key.clone(), proptest::option::weighted(0.8, st)).prop_map(|(key, to)| Op::Apply { key, to }),
        4 => key.prop_map(|key| Op::Get { key }),
        1 => Just(Op::Evict),
        1 => Just(Op::Clear),
    ];
    // Time advances by 0..4 s per step (often not at all).
    (prop_oneof![3 => Just(0u64), 2 => 1u64..4], op)
}

fn dkey(k: u8) -> DedupKey {
    DedupKey {
        caller: CallerId::from_u64(u64::from(k % 3)),
        request: RequestId::from_parts(7, u64::from(k)),
    }
}

/// The reference: a map, and terminal entries in the order they became
/// terminal with their expiry.
struct Model {
    config: DedupConfig,
    map: HashMap<DedupKey, (St, u64)>,
    fifo: VecDeque<(DedupKey, u64, Timestamp)>,
    next_gen: u64,
    stats: DedupStats,
}

impl Model {
    fn expire(&mut self, now: Timestamp) {
        while let Some(&(key, gen, expires)) = self.fifo.front() {
            if expires > now {
                break;
            }
            self.fifo.pop_front();
            if self.map.get(&key).is_some_and(|(_, g)| *g == gen) {
                self.map.remove(&key);
                self.stats.terminal -= 1;
                self.stats.evicted_ttl += 1;
            }
        }
    }

    fn apply(&mut self, key: DedupKey, now: Timestamp, to: Option<St>) -> Option<St> {
        self.expire(now);
        let seen = self.map.get(&key).map(|(s, _)| s.clone());
        let Some(next) = to else { return seen };
        if seen.as_ref().is_some_and(St::is_terminal) {
            return seen;
        }
        let gen = self.next_gen;
        self.next_gen += 1;
        if next.is_terminal() {
            if seen.is_some() {
                self.stats.in_progress -= 1;
            }
            self.stats.terminal += 1;
            self.fifo
                .push_back((key, gen, now + self.config.terminal_ttl));
        } else if seen.is_none() {
            self.stats.in_progress += 1;
        }
        self.map.insert(key, (next, gen));
        while self.stats.terminal > self.config.max_terminal {
            let (key, gen, _) = self.fifo.pop_front().expect("terminal entries are queued");
            if self.map.get(&key).is_some_and(|(_, g)| *g == gen) {
                self.map.remove(&key);
                self.stats.terminal -= 1;
                self.stats.evicted_capacity += 1;
            }
        }
        seen
    }

    fn clear(&mut self) {
        self.map.clear();
        self.fifo.clear();
        self.stats.in_progress = 0;
        self.stats.terminal = 0;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn table_matches_the_model(
        max_terminal in 1usize..6,
        ttl in 1u64..8,
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        let config = DedupConfig { max_terminal, terminal_ttl: Duration::from_secs(ttl) };
        let table: DedupTable<St> = DedupTable::new(config);
        let mut model = Model {
            config,
            map: HashMap::new(),
            fifo: VecDeque::new(),
            next_gen: 0,
            stats: DedupStats::default(),
        };
        let mut now = Timestamp::ZERO;
        for (step, (advance, op)) in ops.into_iter().enumerate() {
            now = now + Duration::from_secs(advance);
            match op {
                Op::Apply { key, to } => {
                    let want = model.apply(dkey(key), now, to.clone());
                    let got = table.apply(dkey(key), now, |cur| {
                        // A terminal state is never asked to change.
                        let next = if cur.is_some_and(St::is_terminal) { None } else { to };
                        (next, cur.cloned())
                    });
                    prop_assert_eq!(got, want, "step {}", step);
                }
                Op::Get { key } => {
                    model.expire(now);
                    let want = model.map.get(&dkey(key)).map(|(s, _)| s.clone());
                    prop_assert_eq!(table.get(&dkey(key), now), want, "step {}", step);
                }
                Op::Evict => {
                    model.expire(now);
                    table.evict_expired(now);
                }
                Op::Clear => {
                    model.clear();
                    table.clear();
                }
            }
            prop_assert_eq!(table.stats(), model.stats, "step {}", step);
            prop_assert_eq!(table.len(), model.map.len(), "step {}", step);
        }
    }
}
