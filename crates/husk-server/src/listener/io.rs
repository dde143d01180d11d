//! A connection's first bytes, read by husk under a deadline, and the stream hyper then reads:
//! those bytes again, then the socket.
//!
//! hyper-util's `auto` builder tells HTTP/2 (prior knowledge) from HTTP/1.1 by reading until the
//! bytes either make the 24-byte HTTP/2 preface or differ from it, with no deadline: a peer that
//! sends nothing, or a piece of the preface, would hold the connection for ever. husk reads them
//! first, under the header timeout; the builder's own look then ends at once.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

use super::admit::Slot;

const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The first bytes of a connection: either the whole HTTP/2 preface or bytes that cannot start
/// it (HTTP/1.1); none when the peer closed first.
pub(super) struct Prefix {
    buf: [u8; 24],
    len: usize,
    pos: usize,
}

impl Prefix {
    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Reads until the bytes decide the protocol (or the peer closes). The caller bounds it in time.
pub(super) async fn sniff<IO: AsyncRead + Unpin>(tcp: &mut IO) -> io::Result<Prefix> {
    let mut p = Prefix {
        buf: [0; 24],
        len: 0,
        pos: 0,
    };
    while p.len < H2_PREFACE.len() {
        let n = tcp.read(&mut p.buf[p.len..]).await?;
        if n == 0 {
            break;
        }
        p.len += n;
        if p.buf[..p.len] != H2_PREFACE[..p.len] {
            break;
        }
    }
    Ok(p)
}

/// The stream hyper serves: the sniffed bytes, then the socket (or the TLS session on it). It
/// holds the connection's slot, so an upgraded connection (which takes this stream along)
/// stays counted until it ends.
pub(super) struct Sniffed<IO> {
    // First, so that it is free by the time the peer sees the socket close.
    _slot: Slot,
    prefix: Prefix,
    tcp: IO,
}

impl<IO> Sniffed<IO> {
    pub(super) fn new(prefix: Prefix, tcp: IO, slot: Slot) -> Sniffed<IO> {
        Sniffed {
            _slot: slot,
            prefix,
            tcp,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Sniffed<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let p = &mut self.prefix;
        if p.pos < p.len {
            let n = (p.len - p.pos).min(buf.remaining());
            buf.put_slice(&p.buf[p.pos..p.pos + n]);
            p.pos += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Sniffed<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;

    async fn pair() -> (TcpStream, TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (server, _) = l.accept().await.unwrap();
        (client, server)
    }

    async fn sniffed(sent: &[u8], close: bool) -> Vec<u8> {
        let (mut c, mut s) = pair().await;
        c.write_all(sent).await.unwrap();
        if close {
            c.shutdown().await.unwrap();
        }
        let p = sniff(&mut s).await.unwrap();
        p.buf[..p.len].to_vec()
    }

    #[tokio::test]
    async fn sniffing_stops_at_the_first_byte_that_is_not_the_preface() {
        let got = sniffed(b"GET / HTTP/1.1\r\n", false).await;
        assert!(got.starts_with(b"G") && b"GET / HTTP/1.1\r\n".starts_with(&got));
        // A piece of the preface followed by something else is HTTP/1.1 too.
        let got = sniffed(b"PRI * HTTP/1.1\r\n", false).await;
        assert_ne!(got.as_slice(), &H2_PREFACE[..got.len()]);
    }

    #[tokio::test]
    async fn sniffing_reads_the_whole_preface_and_no_more() {
        let mut sent = H2_PREFACE.to_vec();
        sent.extend_from_slice(b"\0\0\0\x04\0\0\0\0\0");
        assert_eq!(sniffed(&sent, false).await, H2_PREFACE);
        assert_eq!(sniffed(b"PRI * HTTP/2", true).await, b"PRI * HTTP/2");
        assert!(sniffed(b"", true).await.is_empty());
    }

    #[tokio::test]
    async fn the_sniffed_bytes_are_read_again_before_the_socket() {
        let (mut c, mut s) = pair().await;
        c.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        c.shutdown().await.unwrap();
        let p = sniff(&mut s).await.unwrap();
        let admission = super::super::admit::Admission::new(1, 1);
        let slot = admission.admit([127, 0, 0, 1].into()).unwrap();
        let mut io = Sniffed::new(p, s, slot);
        let mut all = Vec::new();
        io.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, b"GET / HTTP/1.1\r\n\r\n");
    }
}
