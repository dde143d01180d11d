//! Output redaction: every occurrence of a secret's value in a process's output stream becomes
//! `****`, also when a value is split across chunks (the stream holds back the end of a chunk
//! that could begin a value, at most the longest value's length minus one byte).

use zeroize::Zeroizing;

/// What a secret's value is replaced by.
pub const MASK: &[u8] = b"****";

/// A streaming redactor for one output stream.
pub struct Redactor {
    values: Vec<Zeroizing<Vec<u8>>>,
    carry: Zeroizing<Vec<u8>>,
}

impl Redactor {
    /// Redacts `values` (empty ones are ignored).
    pub fn new(values: &[Zeroizing<Vec<u8>>]) -> Redactor {
        let mut values: Vec<Zeroizing<Vec<u8>>> =
            values.iter().filter(|v| !v.is_empty()).cloned().collect();
        // The longest first: a value that contains another is masked whole.
        values.sort_by_key(|v| std::cmp::Reverse(v.len()));
        Redactor {
            values,
            carry: Zeroizing::new(Vec::new()),
        }
    }

    /// Whether there is anything to redact.
    pub fn is_active(&self) -> bool {
        !self.values.is_empty()
    }

    /// The redacted bytes of `chunk` that can be sent now.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        if self.values.is_empty() {
            return chunk.to_vec();
        }
        let mut buf = Zeroizing::new(std::mem::take(&mut *self.carry));
        buf.extend_from_slice(chunk);
        let (out, held) = self.scan(&buf, false);
        self.carry.extend_from_slice(&buf[held..]);
        out
    }

    /// What is held back, at the end of the stream, redacted: no value can complete any more,
    /// but a shorter one may lie inside what was held back for a longer one.
    pub fn finish(&mut self) -> Vec<u8> {
        let rest = Zeroizing::new(std::mem::take(&mut *self.carry));
        self.scan(&rest, true).0
    }

    /// `text` redacted whole, as a stream of its own that ends with it (this redactor's own
    /// stream is left as it was).
    pub fn mask(&self, text: &[u8]) -> Vec<u8> {
        self.scan(text, true).0
    }

    /// `buf` with every value masked, and where the held-back tail starts (`buf.len()` when
    /// nothing is): before the `end` of the stream, a tail that could begin a value is held
    /// back instead.
    fn scan(&self, buf: &[u8], end: bool) -> (Vec<u8>, usize) {
        let mut out = Vec::with_capacity(buf.len());
        let mut i = 0;
        'scan: while i < buf.len() {
            let rest = &buf[i..];
            for v in &self.values {
                if rest.starts_with(v) {
                    out.extend_from_slice(MASK);
                    i += v.len();
                    continue 'scan;
                }
            }
            // The rest could be the start of a value: wait for more.
            if !end
                && self
                    .values
                    .iter()
                    .any(|v| v.len() > rest.len() && v.starts_with(rest))
            {
                return (out, i);
            }
            out.push(buf[i]);
            i += 1;
        }
        (out, buf.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(values: &[&str]) -> Redactor {
        let v: Vec<Zeroizing<Vec<u8>>> = values
            .iter()
            .map(|s| Zeroizing::new(s.as_bytes().to_vec()))
            .collect();
        Redactor::new(&v)
    }

    fn run(red: &mut Redactor, chunks: &[&str]) -> String {
        let mut out = Vec::new();
        for c in chunks {
            out.extend(red.push(c.as_bytes()));
        }
        out.extend(red.finish());
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn values_are_masked_within_and_across_chunks() {
        assert_eq!(run(&mut r(&["s3cr3t"]), &["key=s3cr3t;"]), "key=****;");
        assert_eq!(
            run(&mut r(&["s3cr3t"]), &["key=s3", "cr", "3t!"]),
            "key=****!"
        );
        // Every split point of a stream with two occurrences.
        let text = "a s3cr3t b s3cr3t c";
        for cut in 0..=text.len() {
            let (x, y) = text.split_at(cut);
            assert_eq!(
                run(&mut r(&["s3cr3t"]), &[x, y]),
                "a **** b **** c",
                "cut {cut}"
            );
        }
        // Byte by byte.
        let bytes: Vec<String> = text.chars().map(String::from).collect();
        let parts: Vec<&str> = bytes.iter().map(String::as_str).collect();
        assert_eq!(run(&mut r(&["s3cr3t"]), &parts), "a **** b **** c");
    }

    #[test]
    fn near_misses_pass_through_and_longer_values_win() {
        assert_eq!(run(&mut r(&["s3cr3t"]), &["s3cr3", "x"]), "s3cr3x");
        assert_eq!(run(&mut r(&["s3cr3t"]), &["s3cr"]), "s3cr");
        assert_eq!(
            run(&mut r(&["abc", "abcdef"]), &["abcdef abc"]),
            "**** ****"
        );
        assert_eq!(run(&mut r(&[]), &["nothing"]), "nothing");
        // Overlapping starts: "aab" in "aaab".
        assert_eq!(run(&mut r(&["aab"]), &["a", "a", "a", "b"]), "a****");
    }

    /// Found with the `agent_client` fuzz target's check that no secret reaches a process's
    /// output: a stream ending in a prefix of one value ("abc" of "abcd") held it back and
    /// then sent it unredacted, with a shorter value ("bc") inside.
    #[test]
    fn a_shorter_value_inside_the_held_back_end_is_masked() {
        assert_eq!(run(&mut r(&["abcd", "bc"]), &["xabc"]), "xa****");
        assert_eq!(run(&mut r(&["abcd", "bc"]), &["xa", "b", "c"]), "xa****");
        assert_eq!(run(&mut r(&["abcd", "bc"]), &["xabcd"]), "x****");
        assert_eq!(run(&mut r(&["s3cr3t", "cr"]), &["s3cr3"]), "s3****3");
    }
}
