//! Byte plumbing shared by pull and export: sha256 while reading or writing, a bridge from an
//! async download to a blocking reader (so a layer streams into the unpacker without ever being
//! held in memory), and unique temporary names.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::error::OciError;

/// `sha256:<hex>` of everything hashed so far.
pub(crate) fn finish_digest(hasher: Sha256) -> String {
    format!("sha256:{}", hex::encode(hasher.finalize()))
}

/// The hex part of a sha256 digest, refusing other algorithms and malformed hex (the hex ends
/// up in file names, so it must be exactly 64 lowercase hex digits).
pub(crate) fn sha256_hex(digest: &str) -> Result<&str, OciError> {
    match digest.strip_prefix("sha256:") {
        Some(hex)
            if hex.len() == 64
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
        {
            Ok(hex)
        }
        _ => Err(OciError::UnsupportedDigest {
            digest: digest.to_string(),
        }),
    }
}

/// A reader that hashes and counts what passes through it.
pub(crate) struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    bytes: u64,
}

impl<R: Read> HashingReader<R> {
    pub(crate) fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: Sha256::new(),
            bytes: 0,
        }
    }

    /// Reads the rest of the stream (a tar's trailing padding is part of the blob's digest),
    /// then returns the digest and the byte count.
    pub(crate) fn finish(mut self) -> io::Result<(String, u64)> {
        io::copy(&mut self, &mut io::sink())?;
        Ok((finish_digest(self.hasher), self.bytes))
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}

/// A writer that hashes and counts what passes through it.
pub(crate) struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    bytes: u64,
}

impl<W: Write> HashingWriter<W> {
    pub(crate) fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            bytes: 0,
        }
    }

    pub(crate) fn into_parts(self) -> (W, String, u64) {
        (self.inner, finish_digest(self.hasher), self.bytes)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// The blocking end of a download: reads the chunks an async task sends. The sender dropping
/// is the end of the stream; an `Err` chunk is a network failure.
pub(crate) struct ChannelReader {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    current: Bytes,
}

impl ChannelReader {
    pub(crate) fn new(rx: mpsc::Receiver<io::Result<Bytes>>) -> Self {
        ChannelReader {
            rx,
            current: Bytes::new(),
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            // Only ever called from a spawn_blocking thread, where blocking_recv is allowed.
            match self.rx.blocking_recv() {
                Some(chunk) => self.current = chunk?,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

/// A name no other process or call will pick: random per process, counted within it.
pub(crate) fn unique_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    // RandomState is seeded from the OS's random source; hashing the pid and a counter through
    // it gives an unpredictable, collision-free suffix without another dependency.
    let mut h = RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    format!("{:016x}", h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests() {
        let empty = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        let (d, n) = HashingReader::new(&b""[..]).finish().unwrap();
        assert_eq!((d.as_str(), n), (empty, 0));
        assert!(sha256_hex(empty).is_ok());
        for bad in ["sha512:00", "sha256:../../etc", "sha256:E3B0", "e3b0"] {
            assert!(sha256_hex(bad).is_err(), "{bad}");
        }
        assert_ne!(unique_suffix(), unique_suffix());
    }

    #[test]
    fn channel_reader_reassembles_chunks() {
        let (tx, rx) = mpsc::channel(4);
        tx.try_send(Ok(Bytes::from_static(b"hel"))).unwrap();
        tx.try_send(Ok(Bytes::from_static(b""))).unwrap();
        tx.try_send(Ok(Bytes::from_static(b"lo"))).unwrap();
        drop(tx);
        let mut s = String::new();
        ChannelReader::new(rx).read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello");
    }
}
