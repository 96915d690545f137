//! [`Proof`]: an admin request carried over the bus proves that its sender holds the admin
//! token, without sending the token.
//!
//! A gateway authorises an admin request at its HTTP edge (the `Authorization` header), then
//! forwards it over NATS to the process that carries it out (the tick-by-tick host). Anyone who
//! can publish on the bus could send the same request, so the forwarded request carries an
//! HMAC-SHA256, keyed by the admin token, over what it asks (its purpose and canonical JSON),
//! when it was issued and a random nonce. The receiver, configured with the same token, checks
//! the MAC in constant time, that it was issued within [`FRESH_MS`] of its own clock, and that
//! the nonce was not seen in that time (a captured request cannot be replayed). A receiver
//! without an admin token refuses every admin request, as the HTTP API does.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Mutex;

use ring::hmac;
use serde::{Deserialize, Serialize};

use crate::lock::lock;

/// How far apart the issuer's and the receiver's clocks and the request's transit may be.
pub const FRESH_MS: i64 = 30_000;

/// Most nonces remembered (requests within [`FRESH_MS`]); beyond it requests are refused until
/// older ones age out.
const MAX_SEEN: usize = 100_000;

/// The proof a request carries (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Proof {
    pub issued_ms: i64,
    pub nonce: u64,
    /// HMAC-SHA256 of the signed text, hex.
    pub mac: String,
}

/// Why a proof was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    #[error("admin requests are disabled here (no server.admin_token)")]
    NoToken,
    #[error("the request carries no proof of the admin token")]
    Missing,
    #[error("the request was issued {0} ms from this host's clock (at most {FRESH_MS} ms)")]
    Stale(i64),
    #[error("the request's nonce was seen already (a replay)")]
    Replayed,
    #[error("too many admin requests within {FRESH_MS} ms")]
    TooMany,
    #[error("the request's proof does not match the admin token")]
    Mismatch,
}

fn text(purpose: &str, body: &[u8], issued_ms: i64, nonce: u64) -> Vec<u8> {
    let mut t = Vec::with_capacity(body.len() + purpose.len() + 48);
    t.extend_from_slice(b"millrace admin request\n");
    t.extend_from_slice(purpose.as_bytes());
    t.push(b'\n');
    t.extend_from_slice(body);
    t.extend_from_slice(format!("\n{issued_ms}\n{nonce}").as_bytes());
    t
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 || s.len() > 128 {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

/// Signs `body` (canonical JSON of what is asked) for `purpose` with `token`, issued at
/// `now_ms`.
pub fn sign(token: &str, purpose: &str, body: &[u8], now_ms: i64) -> Proof {
    let mut nonce = [0u8; 8];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut nonce)
        .expect("the system's random numbers");
    let nonce = u64::from_le_bytes(nonce);
    let key = hmac::Key::new(hmac::HMAC_SHA256, token.as_bytes());
    let mac = hmac::sign(&key, &text(purpose, body, now_ms, nonce));
    Proof { issued_ms: now_ms, nonce, mac: hex(mac.as_ref()) }
}

/// A receiver's check of proofs (see the module docs).
pub struct Verifier {
    key: Option<hmac::Key>,
    /// Nonces seen within [`FRESH_MS`]. Guards short updates.
    seen: Mutex<Seen>,
}

/// Nonces seen: (when, nonce) oldest first, and the nonces as a set.
type Seen = (VecDeque<(i64, u64)>, BTreeSet<u64>);

impl Verifier {
    /// Checks proofs against `token` (`None`: admin requests are refused).
    pub fn new(token: Option<&str>) -> Self {
        Verifier {
            key: token.map(|t| hmac::Key::new(hmac::HMAC_SHA256, t.as_bytes())),
            seen: Mutex::default(),
        }
    }

    /// Checks `proof` of `body` for `purpose` at `now_ms`; a proof that passes is remembered
    /// (its nonce cannot pass again).
    pub fn verify(
        &self,
        purpose: &str,
        body: &[u8],
        proof: Option<&Proof>,
        now_ms: i64,
    ) -> Result<(), ProofError> {
        let key = self.key.as_ref().ok_or(ProofError::NoToken)?;
        let proof = proof.ok_or(ProofError::Missing)?;
        let skew = now_ms.saturating_sub(proof.issued_ms);
        if skew.abs() > FRESH_MS {
            return Err(ProofError::Stale(skew));
        }
        let mac = unhex(&proof.mac).ok_or(ProofError::Mismatch)?;
        hmac::verify(key, &text(purpose, body, proof.issued_ms, proof.nonce), &mac)
            .map_err(|_| ProofError::Mismatch)?;
        let mut seen = lock(&self.seen);
        let (order, set) = &mut *seen;
        while order.front().is_some_and(|(at, _)| *at < now_ms - 2 * FRESH_MS) {
            if let Some((_, n)) = order.pop_front() {
                set.remove(&n);
            }
        }
        if set.contains(&proof.nonce) {
            return Err(ProofError::Replayed);
        }
        if order.len() >= MAX_SEEN {
            return Err(ProofError::TooMany);
        }
        order.push_back((now_ms, proof.nonce));
        set.insert(proof.nonce);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_fresh_unseen_request_signed_with_the_token_passes() {
        let v = Verifier::new(Some("the admin token"));
        let now = 1_700_000_000_000;
        let body = br#"{"symbol":"600000","target":1}"#;
        let p = sign("the admin token", "migrate", body, now);
        assert_eq!(v.verify("migrate", body, Some(&p), now + 5), Ok(()));
        assert_eq!(v.verify("migrate", body, Some(&p), now + 6), Err(ProofError::Replayed));
        // another token, another body, another purpose
        let wrong = sign("a guess", "migrate", body, now);
        assert_eq!(v.verify("migrate", body, Some(&wrong), now), Err(ProofError::Mismatch));
        let p = sign("the admin token", "migrate", body, now);
        assert_eq!(
            v.verify("migrate", br#"{"symbol":"600000","target":2}"#, Some(&p), now),
            Err(ProofError::Mismatch)
        );
        assert_eq!(v.verify("hotspot", body, Some(&p), now), Err(ProofError::Mismatch));
        // too old, from the future, without a proof, a mangled MAC
        let old = sign("the admin token", "migrate", body, now - FRESH_MS - 1);
        assert!(matches!(v.verify("migrate", body, Some(&old), now), Err(ProofError::Stale(_))));
        let ahead = sign("the admin token", "migrate", body, now + FRESH_MS + 1);
        assert!(matches!(v.verify("migrate", body, Some(&ahead), now), Err(ProofError::Stale(_))));
        assert_eq!(v.verify("migrate", body, None, now), Err(ProofError::Missing));
        let mut bad = sign("the admin token", "migrate", body, now);
        bad.mac = "zz".repeat(32);
        assert_eq!(v.verify("migrate", body, Some(&bad), now), Err(ProofError::Mismatch));
        // a receiver without a token refuses everything
        let none = Verifier::new(None);
        let p = sign("the admin token", "migrate", body, now);
        assert_eq!(none.verify("migrate", body, Some(&p), now), Err(ProofError::NoToken));
        // nonces are forgotten once no request that old could pass
        let p = sign("the admin token", "x", body, now);
        assert_eq!(v.verify("x", body, Some(&p), now), Ok(()));
        let later = now + 3 * FRESH_MS;
        let q = sign("the admin token", "x", body, later);
        assert_eq!(v.verify("x", body, Some(&q), later), Ok(()));
        assert!(lock(&v.seen).0.len() <= 2);
    }
}
