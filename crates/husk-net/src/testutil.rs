//! What the crate's tests share.

/// A small deterministic generator (xorshift64), so fuzz-style garbage is the same on every
/// run and a failure can be replayed.
pub struct XorShift(pub u64);

impl XorShift {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}
