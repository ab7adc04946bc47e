//! Identifiers carried by every frame of an ask.
//!
//! A [`RequestId`] is 128 bits: wall-clock microseconds in the high half and a
//! random nonce in the low half. The time half keeps ids roughly sortable; the
//! nonce keeps them unique across processes and restarts without coordination
//! (a process-local counter would collide after a restart or a scale-up).

use std::fmt;
use std::str::FromStr;

use rand_core::RngCore;

/// Error returned when parsing an id from text fails.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid id {input:?}: expected 32 hexadecimal digits")]
pub struct ParseIdError {
    input: String,
}

fn parse_hex128(s: &str) -> Result<u128, ParseIdError> {
    let err = || ParseIdError {
        input: s.to_owned(),
    };
    if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(err());
    }
    u128::from_str_radix(s, 16).map_err(|_| err())
}

macro_rules! id128 {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(u128);

        impl $name {
            /// Wraps a raw 128-bit value.
            pub const fn from_u128(raw: u128) -> Self {
                Self(raw)
            }
            /// The raw 128-bit value.
            pub const fn as_u128(self) -> u128 {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:032x}", self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({:032x})"), self.0)
            }
        }

        impl FromStr for $name {
            type Err = ParseIdError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                parse_hex128(s).map(Self)
            }
        }
    };
}

id128!(
    /// Identity of one ask, the same on every attempt and every frame.
    RequestId
);
id128!(
    /// Ties together all asks of one logical operation; propagated unchanged.
    CorrelationId
);
id128!(
    /// The id of the message that caused this ask; propagated unchanged.
    CausationId
);

impl RequestId {
    /// Builds an id from its two halves.
    pub const fn from_parts(time_micros: u64, nonce: u64) -> Self {
        Self(((time_micros as u128) << 64) | nonce as u128)
    }

    /// Creates a fresh id. The caller supplies the wall-clock time (this crate
    /// reads no clock) and the randomness.
    pub fn generate(time_micros: u64, rng: &mut impl RngCore) -> Self {
        Self::from_parts(time_micros, rng.next_u64())
    }

    /// The wall-clock microseconds half.
    pub const fn time_micros(self) -> u64 {
        (self.0 >> 64) as u64
    }

    /// The random half.
    pub const fn nonce(self) -> u64 {
        self.0 as u64
    }
}

impl From<RequestId> for CorrelationId {
    /// The first ask of an operation starts its correlation.
    fn from(id: RequestId) -> Self {
        Self(id.0)
    }
}

impl From<RequestId> for CausationId {
    fn from(id: RequestId) -> Self {
        Self(id.0)
    }
}

/// Identity of a caller (one per node). Part of the dedup key so that a cached
/// reply is never served to another caller.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallerId(u64);

impl CallerId {
    pub const fn from_u64(raw: u64) -> Self {
        Self(raw)
    }
    pub const fn as_u64(self) -> u64 {
        self.0
    }
    /// A random caller id.
    pub fn generate(rng: &mut impl RngCore) -> Self {
        Self(rng.next_u64())
    }
}

impl fmt::Display for CallerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl fmt::Debug for CallerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CallerId({:016x})", self.0)
    }
}

/// The dedup key of the inbound side: a reply cached for one caller is never
/// served to another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DedupKey {
    pub caller: CallerId,
    pub request: RequestId,
}

/// The ids every frame of one ask carries, unchanged, in both directions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AskIds {
    pub request_id: RequestId,
    pub correlation_id: CorrelationId,
    pub causation_id: Option<CausationId>,
    pub caller_id: CallerId,
}

impl AskIds {
    /// Ids for a new ask that starts its own correlation.
    pub fn new(request_id: RequestId, caller_id: CallerId) -> Self {
        Self {
            request_id,
            correlation_id: request_id.into(),
            causation_id: None,
            caller_id,
        }
    }

    pub fn dedup_key(&self) -> DedupKey {
        DedupKey {
            caller: self.caller_id,
            request: self.request_id,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_id_layout_and_hex_round_trip() {
        let id = RequestId::from_parts(0x0102_0304_0506_0708, 0xa0b0_c0d0_e0f0_0011);
        assert_eq!(id.time_micros(), 0x0102_0304_0506_0708);
        assert_eq!(id.nonce(), 0xa0b0_c0d0_e0f0_0011);
        let text = id.to_string();
        assert_eq!(text, "0102030405060708a0b0c0d0e0f00011");
        assert_eq!(text.parse::<RequestId>().unwrap(), id);
        assert_eq!(
            "0102030405060708A0B0C0D0E0F00011"
                .parse::<RequestId>()
                .unwrap(),
            id
        );
    }

    #[test]
    fn parse_rejects_bad_text() {
        for bad in [
            "",
            "xyz",
            "+102030405060708a0b0c0d0e0f00011",
            "0102030405060708a0b0c0d0e0f0001",
        ] {
            assert!(bad.parse::<RequestId>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn generated_ids_differ_at_the_same_instant() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let a = RequestId::generate(42, &mut rng);
        let b = RequestId::generate(42, &mut rng);
        assert_ne!(a, b);
        assert_eq!(a.time_micros(), 42);
    }
}
