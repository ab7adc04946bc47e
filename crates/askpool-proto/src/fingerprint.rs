//! Payload fingerprints guard a request id against reuse with another payload
//! (kameo's "bait and switch"): same id, different fingerprint is refused.

use std::fmt;

/// A 128-bit digest of a request payload, computed by the caller (or supplied
/// by the user for in-process objects that have no bytes).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PayloadFingerprint(u128);

impl PayloadFingerprint {
    pub const fn from_u128(raw: u128) -> Self {
        Self(raw)
    }
    pub const fn as_u128(self) -> u128 {
        self.0
    }
}

impl fmt::Debug for PayloadFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PayloadFingerprint({:032x})", self.0)
    }
}

/// What an inbound entry remembers about the payload that created it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FingerprintRecord {
    /// Created by a request that carried no fingerprint. A later checked
    /// request for the same key fails closed (kameo's fingerprint-bypass rule).
    Unchecked,
    /// Created by a request that carried this fingerprint.
    Checked(PayloadFingerprint),
    /// Created by a cancel that arrived before any request (a tombstone): there
    /// is no payload to compare, so the tombstone answers every request.
    Tombstone,
}

impl FingerprintRecord {
    pub fn of(incoming: Option<PayloadFingerprint>) -> Self {
        match incoming {
            Some(fp) => Self::Checked(fp),
            None => Self::Unchecked,
        }
    }

    /// Whether a request carrying `incoming` may be treated as a duplicate of
    /// the request that created this entry.
    pub fn admits(self, incoming: Option<PayloadFingerprint>) -> bool {
        match (self, incoming) {
            (Self::Tombstone, _) => true,
            // An unchecked duplicate opted out of the check; the key already
            // scopes it to the same caller.
            (_, None) => true,
            (Self::Checked(stored), Some(fp)) => stored == fp,
            (Self::Unchecked, Some(_)) => false,
        }
    }
}
