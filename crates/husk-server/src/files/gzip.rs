//! gzip for downloads, adaptive per chunk.
//!
//! HTTP clients (the SDKs' transports among them) ask for gzip by default, and much of what is
//! downloaded from a sandbox does not compress (binaries, archives, images, random data):
//! deflating those at level 1 runs at tens of MB/s and saves nothing. So each chunk is
//! deflated only if a sample of it compresses; otherwise it goes out as stored blocks, at the
//! speed of a copy. The result is one ordinary gzip stream either way.
//!
//! How the two mix in one deflate stream: every deflated chunk ends with a sync flush, which
//! leaves the stream byte-aligned, so stored blocks can follow directly. The deflater is reset
//! after stored data, so its back-references never reach across data it did not see (a
//! reference counts back from the current position, and it only refers to what came after the
//! reset). The stream ends with an empty final stored block.

use std::io;

use flate2::{Compress, Compression, Crc, FlushCompress, Status};

/// The gzip member header: magic, deflate, no flags, no mtime, no extra flags, unknown OS.
const HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
/// How much of a chunk is compressed to decide whether the chunk is worth compressing.
const SAMPLE: usize = 16 << 10;
/// A sample must shrink to this fraction (in percent) or less for its chunk to be deflated.
const WORTH_IT_PERCENT: usize = 90;

/// A gzip stream built chunk by chunk.
pub struct AdaptiveGzip {
    deflate: Compress,
    crc: Crc,
    started: bool,
    /// Stored blocks were written since the deflater last ran: reset it before it runs again.
    reset: bool,
}

impl Default for AdaptiveGzip {
    fn default() -> Self {
        AdaptiveGzip {
            deflate: Compress::new(Compression::fast(), false),
            crc: Crc::new(),
            started: false,
            reset: false,
        }
    }
}

fn run(
    c: &mut Compress,
    mut input: &[u8],
    out: &mut Vec<u8>,
    flush: FlushCompress,
) -> io::Result<()> {
    loop {
        out.reserve(input.len() + 1024);
        let before = c.total_in();
        let status = c
            .compress_vec(input, out, flush)
            .map_err(io::Error::other)?;
        input = &input[(c.total_in() - before) as usize..];
        let room_left = out.len() < out.capacity();
        match status {
            Status::StreamEnd => return Ok(()),
            // All input taken and the flush complete (it stopped with output space to spare).
            _ if input.is_empty() && room_left => return Ok(()),
            _ => {}
        }
    }
}

/// Appends `data` as stored (uncompressed) deflate blocks of at most 65535 bytes, starting at a
/// byte boundary; with `last`, the final one is marked final (an empty one if `data` is empty).
fn stored(data: &[u8], last: bool, out: &mut Vec<u8>) {
    let mut blocks = data.chunks(u16::MAX as usize).peekable();
    if data.is_empty() {
        if last {
            out.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
        }
        return;
    }
    while let Some(block) = blocks.next() {
        let fin = last && blocks.peek().is_none();
        let len = block.len() as u16;
        out.push(u8::from(fin));
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(block);
    }
}

/// Whether `data` compresses enough to be worth deflating (judged on its first [`SAMPLE`]
/// bytes).
fn compressible(data: &[u8]) -> bool {
    let sample = &data[..data.len().min(SAMPLE)];
    if sample.len() < 512 {
        return true;
    }
    let mut c = Compress::new(Compression::fast(), false);
    let mut out = Vec::with_capacity(sample.len() + 64);
    if run(&mut c, sample, &mut out, FlushCompress::Finish).is_err() {
        return false;
    }
    out.len() * 100 <= sample.len() * WORTH_IT_PERCENT
}

impl AdaptiveGzip {
    /// The gzip bytes for the next chunk of input (the header first). Each chunk ends with a
    /// sync flush, so the client can decompress everything sent so far.
    pub fn chunk(&mut self, data: &[u8]) -> io::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(data.len() + 64);
        if !self.started {
            out.extend_from_slice(&HEADER);
            self.started = true;
        }
        self.crc.update(data);
        if compressible(data) {
            if std::mem::take(&mut self.reset) {
                self.deflate.reset();
            }
            run(&mut self.deflate, data, &mut out, FlushCompress::Sync)?;
        } else {
            stored(data, false, &mut out);
            self.reset = true;
        }
        Ok(out)
    }

    /// The end of the stream: the last deflate block and the gzip trailer.
    pub fn finish(self) -> io::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(64);
        if !self.started {
            out.extend_from_slice(&HEADER);
        }
        stored(&[], true, &mut out);
        out.extend_from_slice(&self.crc.sum().to_le_bytes());
        out.extend_from_slice(&self.crc.amount().to_le_bytes());
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn gunzip(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(data)
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    fn random(n: usize) -> Vec<u8> {
        let mut x: u64 = 0x9e3779b97f4a7c15;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    fn gzip(chunks: &[&[u8]]) -> Vec<u8> {
        let mut g = AdaptiveGzip::default();
        let mut out = Vec::new();
        for c in chunks {
            out.extend(g.chunk(c).unwrap());
        }
        out.extend(g.finish().unwrap());
        out
    }

    #[test]
    fn mixed_chunks_make_one_valid_gzip_stream() {
        let text = b"hello husk\n".repeat(100_000);
        let noise = random(1 << 20);
        // Text after noise repeats earlier text: the deflater, reset after the stored noise,
        // must not refer back to it.
        let chunks: [&[u8]; 6] = [&text, &noise, &text, &text[..1000], &noise[..10], &text];
        let out = gzip(&chunks);
        assert_eq!(gunzip(&out), chunks.concat());
        // And the system's gzip reads it too.
        let mut child = std::process::Command::new("gzip")
            .arg("-dc")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let writer = std::thread::spawn(move || std::io::Write::write_all(&mut stdin, &out));
        let result = child.wait_with_output().unwrap();
        writer.join().unwrap().unwrap();
        assert!(result.status.success());
        assert_eq!(result.stdout, chunks.concat());
    }

    #[test]
    fn text_is_compressed_and_noise_is_stored() {
        let text = b"hello husk\n".repeat(100_000);
        assert!(gzip(&[&text]).len() < text.len() / 20);
        let noise = random(1 << 20);
        let out = gzip(&[&noise]);
        // Stored blocks: 5 bytes per 64 KiB block plus header, flush and trailer.
        assert!(out.len() < noise.len() + 200, "{}", out.len());
        assert_eq!(gunzip(&out), noise);
    }

    #[test]
    fn an_empty_download_is_an_empty_gzip_stream() {
        assert_eq!(gunzip(&gzip(&[])), b"");
        assert_eq!(gunzip(&gzip(&[b""])), b"");
    }
}
