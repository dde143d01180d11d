//! API keys: their format, their hash, and the short public id used to name them.
//!
//! A key is `e2b_` followed by 40 lowercase hex digits (20 bytes from the OS random number
//! generator, 160 bits). The prefix and shape match the keys E2B issues, so the stock SDKs and
//! tooling that sniff for `e2b_…` accept ours unchanged.
//!
//! **Storage.** Only `SHA-256(full key string)` in hex is stored. A plain hash (no salt, no slow
//! KDF) is the right tool here: the input is 160 random bits, not a password, so there is
//! nothing to brute force and every request can afford the check. Lookup goes by this hash; the
//! store then re-compares the hashes with [`hashes_equal`] in constant time. The database
//! lookup itself is not constant time, but what it could leak is a property of the *hash* of the
//! presented string, which says nothing useful about any stored key.
//!
//! **Key id.** Keys are listed and revoked by a short public id: the first 8 hex digits after
//! `e2b_`, shown as `e2b_1a2b3c4d…`. An operator who holds a key can recognise it in
//! `husk key list` at a glance, and logs can name a key without holding it. The id gives away 32
//! of the 160 random bits, which leaves 128 unknown bits: still far beyond guessing. With 32 bits a
//! new key's id collides with probability n/2³² (one in 43 000 with 10⁵ keys); the store
//! draws a new key when the id is already taken, revoked keys included, so an id names one key
//! forever.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// What every key starts with.
pub const PREFIX: &str = "e2b_";

/// Random bytes in a key (shown as twice as many hex digits).
const RANDOM_BYTES: usize = 20;

/// Length of a whole key: the prefix and 40 hex digits.
pub const KEY_LEN: usize = PREFIX.len() + 2 * RANDOM_BYTES;

/// Hex digits of the random part that form the public key id.
pub const ID_LEN: usize = 8;

/// Why a key could not be made.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The OS random number generator failed. husk never falls back to weaker randomness.
    #[error("the system random number generator failed: {0}")]
    Random(getrandom::Error),
}

/// Generates a new key: `e2b_` and 40 lowercase hex digits from the OS random number generator.
///
/// This is the only time the secret exists in clear; callers store [`hash`] of it.
pub fn generate() -> Result<String, KeyError> {
    let mut bytes = [0u8; RANDOM_BYTES];
    getrandom::fill(&mut bytes).map_err(KeyError::Random)?;
    let mut key = String::with_capacity(KEY_LEN);
    key.push_str(PREFIX);
    key.push_str(&hex::encode(bytes));
    Ok(key)
}

/// Whether `s` has the exact shape of a key (`e2b_` and 40 lowercase hex digits).
///
/// Checked before hashing, so malformed or oversized input is turned away cheaply; it says
/// nothing about whether the key exists.
pub fn looks_like_key(s: &str) -> bool {
    s.len() == KEY_LEN && s.starts_with(PREFIX) && is_lower_hex(&s[PREFIX.len()..])
}

/// SHA-256 of the full key string, as 64 lowercase hex digits: the only form a key is stored in.
pub fn hash(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// Compares two hashes in constant time (for equal lengths; the length of a hash is public).
pub fn hashes_equal(a: &str, b: &str) -> bool {
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

/// The public id of a well-formed key (the 8 hex digits after `e2b_`), or `None`.
pub fn key_id(key: &str) -> Option<&str> {
    looks_like_key(key).then(|| &key[PREFIX.len()..PREFIX.len() + ID_LEN])
}

/// How an id is shown to people: `e2b_1a2b3c4d…`, visibly a truncated key.
pub fn display_id(id: &str) -> String {
    format!("{PREFIX}{id}…")
}

/// What an operator can name a key by, e.g. in `husk key revoke`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyRef<'a> {
    /// A public id (8 lowercase hex digits).
    Id(String),
    /// A whole key: it names exactly the key whose hash matches, never another key that merely
    /// shares its id.
    Key(&'a str),
}

/// Parses the forms an operator may use to name a key: the id (`1a2b3c4d`), the id as displayed
/// (`e2b_1a2b3c4d…`, also with `...` or without the ellipsis), or the whole key. Hex digits of an
/// id are accepted in either case. Anything else is `None`.
pub fn parse_ref(s: &str) -> Option<KeyRef<'_>> {
    let s = s.trim();
    if looks_like_key(s) {
        return Some(KeyRef::Key(s));
    }
    let rest = s.strip_prefix(PREFIX).unwrap_or(s);
    let rest = rest
        .strip_suffix('…')
        .or_else(|| rest.strip_suffix("..."))
        .unwrap_or(rest);
    let id = rest.to_ascii_lowercase();
    (id.len() == ID_LEN && is_lower_hex(&id)).then_some(KeyRef::Id(id))
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_have_the_e2b_shape_and_differ() {
        let a = generate().expect("rng");
        let b = generate().expect("rng");
        assert_eq!(a.len(), 44);
        assert!(a.starts_with("e2b_"));
        assert!(looks_like_key(&a) && looks_like_key(&b));
        assert_ne!(a, b);
    }

    #[test]
    fn malformed_strings_do_not_look_like_keys() {
        let good = "e2b_0123456789abcdef0123456789abcdef01234567";
        assert!(looks_like_key(good));
        for bad in [
            "",
            "e2b_",
            "e2b_0123456789abcdef0123456789abcdef0123456", // short
            "e2b_0123456789abcdef0123456789abcdef012345678", // long
            "e2b_0123456789ABCDEF0123456789abcdef01234567", // upper case
            "e2b_0123456789abcdeg0123456789abcdef01234567", // not hex
            "E2B_0123456789abcdef0123456789abcdef01234567",
            "xyz_0123456789abcdef0123456789abcdef01234567",
            "e2b_0123456789abcdef0123456789abcdef012345é", // multi-byte, same byte length
        ] {
            assert!(!looks_like_key(bad), "{bad:?}");
            assert_eq!(key_id(bad), None);
        }
        assert!(!looks_like_key(&"a".repeat(10_000)));
    }

    #[test]
    fn hash_is_sha256_hex_of_the_whole_string() {
        // SHA-256("abc"), FIPS 180-2 test vector.
        assert_eq!(
            hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let k = generate().expect("rng");
        assert_eq!(hash(&k).len(), 64);
        assert!(hashes_equal(&hash(&k), &hash(&k)));
        assert!(!hashes_equal(&hash(&k), &hash("e2b_")));
        assert!(!hashes_equal(&hash(&k), ""));
    }

    #[test]
    fn ids_and_references() {
        let key = "e2b_1a2b3c4d56789abcdef0123456789abcdef01234";
        assert_eq!(key_id(key), Some("1a2b3c4d"));
        assert_eq!(display_id("1a2b3c4d"), "e2b_1a2b3c4d…");
        assert_eq!(parse_ref(key), Some(KeyRef::Key(key)));
        let id = Some(KeyRef::Id("1a2b3c4d".to_owned()));
        for form in [
            "1a2b3c4d",
            "1A2B3C4D",
            "e2b_1a2b3c4d",
            "e2b_1a2b3c4d…",
            "e2b_1a2b3c4d...",
            " e2b_1a2b3c4d… ",
        ] {
            assert_eq!(parse_ref(form), id, "{form:?}");
        }
        for bad in [
            "",
            "e2b_",
            "1a2b3c4",
            "1a2b3c4d5",
            "zzzzzzzz",
            "e2b_1a2b…",
            "e2b_e2b_1a2b3c4d",
        ] {
            assert_eq!(parse_ref(bad), None, "{bad:?}");
        }
    }
}
