//! Reading the packets nftables logs with `log group G prefix "…"` (the router namespace logs each
//! connection it rejects that way, rate limited), over netlink (`NETLINK_NETFILTER`, the
//! `nfnetlink_log` subsystem). A [`NflogReader`] binds one group in one namespace: the kernel
//! allows one reader per group and namespace, and forgets the binding when the socket closes.
//!
//! Everything the kernel sends is parsed with bounds checks; a malformed message is skipped, never
//! a panic. Only the first [`COPY_RANGE`] bytes of each packet are copied: the IP header (v4 or
//! v6, a few IPv6 extension headers) and the transport ports.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use husk_runtime::sys;
use std::time::{Duration, Instant};

use crate::netns::NetNs;

/// Bytes of each logged packet the kernel copies to us: an IPv4 header with options (≤ 60) or
/// the IPv6 header (40) and some extension headers, then the transport header's ports.
pub const COPY_RANGE: u32 = 128;

/// The kernel's receive buffer for the socket: a burst of logged packets (the rules limit it to
/// about a hundred) fits; past it the kernel drops messages and [`NflogReader::overruns`] counts.
const SOCKET_BUFFER: usize = 4 << 20;

/// Our receive buffer: larger than any one datagram the kernel builds (it batches up to
/// `NLBUFSIZ` bytes, set below, or one packet's message when that is larger).
const RECV_BUFFER: usize = 64 << 10;
const NLBUFSIZ: u32 = 16 << 10;

/// How long `open` waits for the kernel to acknowledge the configuration.
const ACK_TIMEOUT: Duration = Duration::from_secs(5);

// Netlink framing, from `linux/netlink.h`.
const NLMSG_HDRLEN: usize = 16;
const NLMSG_NOOP: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLA_HDRLEN: usize = 4;
const NLA_TYPE_MASK: u16 = 0x3fff; // !(NLA_F_NESTED | NLA_F_NET_BYTEORDER)

// nfnetlink, from `linux/netfilter/nfnetlink.h` and `linux/netfilter/nfnetlink_compat.h`.
const NFGENMSG_LEN: usize = 4; // struct nfgenmsg { u8 family; u8 version; be16 res_id; }
const NFNETLINK_V0: u8 = 0;
const NFNL_SUBSYS_ULOG: u16 = 4;

// nfnetlink_log, from `linux/netfilter/nfnetlink_log.h`.
const NFULNL_MSG_PACKET: u16 = 0;
const NFULNL_MSG_CONFIG: u16 = 1;
const NFULA_PAYLOAD: u16 = 9;
const NFULA_PREFIX: u16 = 10;
const NFULA_CFG_CMD: u16 = 1; // struct nfulnl_msg_config_cmd { u8 command; }
const NFULA_CFG_MODE: u16 = 2; // struct nfulnl_msg_config_mode { be32 range; u8 mode; u8 pad; } packed
const NFULA_CFG_NLBUFSIZ: u16 = 3; // be32
const NFULA_CFG_QTHRESH: u16 = 5; // be32
const NFULNL_CFG_CMD_BIND: u8 = 1;
const NFULNL_COPY_PACKET: u8 = 2;

// IP protocol numbers (`netinet/in.h`).
const IPPROTO_ICMP: u8 = 1;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_DCCP: u8 = 33;
const IPPROTO_ICMPV6: u8 = 58;
const IPPROTO_SCTP: u8 = 132;
const IPPROTO_UDPLITE: u8 = 136;
// IPv6 extension headers.
const IPV6_HOPOPTS: u8 = 0;
const IPV6_ROUTING: u8 = 43;
const IPV6_FRAGMENT: u8 = 44;
const IPV6_AH: u8 = 51;
const IPV6_DSTOPTS: u8 = 60;

/// One packet a `log group` rule logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedPacket {
    /// The rule's `prefix` (empty when it had none).
    pub prefix: String,
    pub src: IpAddr,
    pub dst: IpAddr,
    /// `IPPROTO_*`; for IPv6, the header after the extension headers (or the last extension
    /// header when they did not fit the copied bytes).
    pub protocol: u8,
    /// 0 when the protocol has no ports (ICMP), for a later fragment, or when cut off.
    pub dst_port: u16,
}

/// A protocol's name for the denial log: `tcp`, `udp`, `icmp`, `icmpv6`, `sctp`, `udplite`,
/// `dccp`, or `other`.
pub fn protocol_name(protocol: u8) -> &'static str {
    match protocol {
        IPPROTO_TCP => "tcp",
        IPPROTO_UDP => "udp",
        IPPROTO_ICMP => "icmp",
        IPPROTO_ICMPV6 => "icmpv6",
        IPPROTO_SCTP => "sctp",
        IPPROTO_UDPLITE => "udplite",
        IPPROTO_DCCP => "dccp",
        _ => "other",
    }
}

/// A netlink socket bound to one `nfnetlink_log` group in one namespace.
///
/// [`next`](Self::next) blocks until packets come; to stop a reader from another thread, loop on
/// [`recv_timeout`](Self::recv_timeout) and check a flag between calls. The socket is
/// non-blocking, so [`AsFd`] also serves an async reactor: wait for readability, then call
/// `recv_timeout(Duration::ZERO)`.
#[derive(Debug)]
pub struct NflogReader {
    fd: OwnedFd,
    group: u16,
    buf: Vec<u8>,
    /// Packets that came while `open` waited for its acknowledgement.
    pending: Vec<LoggedPacket>,
    overruns: u64,
}

impl NflogReader {
    /// Binds `group` in `ns`, copying the first [`COPY_RANGE`] bytes of each packet, delivered
    /// as soon as logged. Fails (`EPERM`/`EBUSY`) when another socket has the group.
    pub fn open(ns: &NetNs, group: u16) -> io::Result<NflogReader> {
        let fd = ns.run(socket)?;
        let mut reader = NflogReader {
            fd,
            group,
            buf: vec![0; RECV_BUFFER],
            pending: Vec::new(),
            overruns: 0,
        };
        let seq = 1;
        reader.send(&config_message(group, seq))?;
        reader.wait_ack(seq)?;
        Ok(reader)
    }

    pub fn group(&self) -> u16 {
        self.group
    }

    /// How many times the kernel reported dropping messages because the socket's buffer was
    /// full (each time may be many packets).
    pub fn overruns(&self) -> u64 {
        self.overruns
    }

    /// Waits for, and returns, the packets of the next datagram that carries any.
    // Not an Iterator: it never ends, and an error (the socket's) is not the end either.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> io::Result<Vec<LoggedPacket>> {
        self.wait(None)
    }

    /// As [`next`](Self::next), but returns an empty list when nothing came within `timeout`.
    pub fn recv_timeout(&mut self, timeout: Duration) -> io::Result<Vec<LoggedPacket>> {
        self.wait(Some(Instant::now() + timeout))
    }

    fn wait(&mut self, deadline: Option<Instant>) -> io::Result<Vec<LoggedPacket>> {
        if !self.pending.is_empty() {
            return Ok(std::mem::take(&mut self.pending));
        }
        loop {
            if let Some(n) = self.recv()? {
                let mut out = Vec::new();
                for m in messages(&self.buf[..n]) {
                    if let Message::Packet(p) = m {
                        out.push(p);
                    }
                }
                if !out.is_empty() {
                    return Ok(out);
                }
                continue;
            }
            if !self.poll(deadline)? {
                return Ok(Vec::new());
            }
        }
    }

    /// Waits for the kernel's answer to request `seq`; packets read meanwhile are kept.
    fn wait_ack(&mut self, seq: u32) -> io::Result<()> {
        let deadline = Instant::now() + ACK_TIMEOUT;
        loop {
            if let Some(n) = self.recv()? {
                let mut answer = None;
                for m in messages(&self.buf[..n]) {
                    match m {
                        Message::Packet(p) => self.pending.push(p),
                        Message::Ack { seq: s, error } if s == seq => answer = Some(error),
                        _ => {}
                    }
                }
                match answer {
                    Some(0) => return Ok(()),
                    Some(e) => return Err(io::Error::from_raw_os_error(e.saturating_neg())),
                    None => continue,
                }
            }
            if !self.poll(Some(deadline))? {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "nfnetlink_log: no answer to the group's configuration",
                ));
            }
        }
    }

    /// Waits until the socket is readable (true) or `deadline` passed (false).
    fn poll(&self, deadline: Option<Instant>) -> io::Result<bool> {
        loop {
            let ms = match deadline {
                None => -1,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    // Round up: a poll of 0 ms for 0.5 ms left would spin.
                    let ms = left.as_micros().div_ceil(1000);
                    i32::try_from(ms).unwrap_or(i32::MAX)
                }
            };
            let mut pfd = [libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            match sys::poll(&mut pfd, ms) {
                Ok(0) => {}
                Ok(_) => return Ok(true),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            if ms == 0 || deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(false);
            }
        }
    }

    /// One datagram from the kernel into `buf`: its length, or None when none is queued.
    /// Overruns are counted and skipped; datagrams not from the kernel are dropped.
    fn recv(&mut self) -> io::Result<Option<usize>> {
        loop {
            match sys::netlink_recv(self.fd.as_fd(), &mut self.buf) {
                // Another process in the namespace wrote to our port: not the kernel's word.
                Ok((_, from)) if from != 0 => continue,
                Ok((n, _)) => return Ok(Some(n)),
                Err(e) => match e.raw_os_error() {
                    Some(libc::ENOBUFS) => self.overruns += 1,
                    Some(libc::EINTR) => {}
                    Some(libc::EAGAIN) => return Ok(None),
                    _ => return Err(e),
                },
            }
        }
    }

    fn send(&self, msg: &[u8]) -> io::Result<()> {
        sys::netlink_send(self.fd.as_fd(), msg)
    }
}

impl AsFd for NflogReader {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for NflogReader {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// A non-blocking `NETLINK_NETFILTER` socket, bound, with a large receive buffer; in the
/// calling thread's namespace.
fn socket() -> io::Result<OwnedFd> {
    let fd = sys::netlink_socket(libc::NETLINK_NETFILTER)?;
    let size = libc::c_int::try_from(SOCKET_BUFFER).unwrap_or(libc::c_int::MAX);
    // Past the rmem_max sysctl only with CAP_NET_ADMIN (FORCE); else as much as it allows.
    if sys::set_socket_int(fd.as_fd(), libc::SO_RCVBUFFORCE, size).is_err() {
        let _ = sys::set_socket_int(fd.as_fd(), libc::SO_RCVBUF, size);
    }
    Ok(fd)
}

const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn push_attr(msg: &mut Vec<u8>, ty: u16, data: &[u8]) {
    let len = NLA_HDRLEN + data.len();
    msg.extend_from_slice(&(len as u16).to_ne_bytes());
    msg.extend_from_slice(&ty.to_ne_bytes());
    msg.extend_from_slice(data);
    msg.resize(align4(msg.len()), 0);
}

/// One `NFULNL_MSG_CONFIG` request that binds `group` and sets its copy mode, batch size and
/// queue threshold (1: each packet is sent at once, not after the default second). Modern
/// kernels need no `PF_BIND` first.
fn config_message(group: u16, seq: u32) -> Vec<u8> {
    let mut msg = vec![0u8; NLMSG_HDRLEN];
    // nfgenmsg: family AF_UNSPEC, version 0, res_id = the group (big-endian).
    msg.push(libc::AF_UNSPEC as u8);
    msg.push(NFNETLINK_V0);
    msg.extend_from_slice(&group.to_be_bytes());
    push_attr(&mut msg, NFULA_CFG_CMD, &[NFULNL_CFG_CMD_BIND]);
    let mut mode = COPY_RANGE.to_be_bytes().to_vec();
    mode.extend_from_slice(&[NFULNL_COPY_PACKET, 0]);
    push_attr(&mut msg, NFULA_CFG_MODE, &mode);
    push_attr(&mut msg, NFULA_CFG_NLBUFSIZ, &NLBUFSIZ.to_be_bytes());
    push_attr(&mut msg, NFULA_CFG_QTHRESH, &1u32.to_be_bytes());
    let len = msg.len() as u32;
    msg[0..4].copy_from_slice(&len.to_ne_bytes());
    msg[4..6].copy_from_slice(&((NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG).to_ne_bytes());
    msg[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    msg[8..12].copy_from_slice(&seq.to_ne_bytes());
    // nlmsg_pid 0: the kernel fills in our port.
    msg
}

#[derive(Debug, PartialEq, Eq)]
enum Message {
    Packet(LoggedPacket),
    /// `NLMSG_ERROR`: `error` 0 is an acknowledgement, else `-errno`.
    Ack {
        seq: u32,
        error: i32,
    },
    Other,
}

fn u16_ne(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_ne(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u16_be(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

/// The messages of one datagram; stops at the first whose length does not fit.
fn messages(buf: &[u8]) -> impl Iterator<Item = Message> + '_ {
    let mut rest = buf;
    std::iter::from_fn(move || {
        let len = u32_ne(rest, 0)? as usize;
        if len < NLMSG_HDRLEN || len > rest.len() {
            rest = &[];
            return None;
        }
        let ty = u16_ne(rest, 4)?;
        let seq = u32_ne(rest, 8)?;
        let body = &rest[NLMSG_HDRLEN..len];
        rest = rest.get(align4(len)..).unwrap_or(&[]);
        Some(match ty {
            NLMSG_ERROR => match u32_ne(body, 0) {
                Some(e) => Message::Ack {
                    seq,
                    error: e as i32,
                },
                None => Message::Other,
            },
            NLMSG_NOOP => Message::Other,
            t if t == (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET => {
                packet(body).map_or(Message::Other, Message::Packet)
            }
            _ => Message::Other,
        })
    })
}

/// The attributes after a message's fixed header; stops at the first whose length does not fit.
fn attributes(buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> + '_ {
    let mut rest = buf;
    std::iter::from_fn(move || {
        let len = u16_ne(rest, 0)? as usize;
        if len < NLA_HDRLEN || len > rest.len() {
            rest = &[];
            return None;
        }
        let ty = u16_ne(rest, 2)? & NLA_TYPE_MASK;
        let data = &rest[NLA_HDRLEN..len];
        rest = rest.get(align4(len)..).unwrap_or(&[]);
        Some((ty, data))
    })
}

/// An `NFULNL_MSG_PACKET` body (nfgenmsg, then attributes); None without a readable IP header.
fn packet(body: &[u8]) -> Option<LoggedPacket> {
    let attrs = body.get(NFGENMSG_LEN..)?;
    let mut prefix = String::new();
    let mut ip = None;
    for (ty, data) in attributes(attrs) {
        match ty {
            NFULA_PREFIX => {
                let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
                prefix = String::from_utf8_lossy(&data[..end]).into_owned();
            }
            NFULA_PAYLOAD => ip = parse_ip(data),
            _ => {}
        }
    }
    let (src, dst, protocol, dst_port) = ip?;
    Some(LoggedPacket {
        prefix,
        src,
        dst,
        protocol,
        dst_port,
    })
}

fn has_ports(protocol: u8) -> bool {
    matches!(
        protocol,
        IPPROTO_TCP | IPPROTO_UDP | IPPROTO_UDPLITE | IPPROTO_SCTP | IPPROTO_DCCP
    )
}

/// The destination port at `at` in `b` (source port first, as in TCP, UDP, SCTP, DCCP), or 0.
fn dst_port(b: &[u8], at: usize, protocol: u8) -> u16 {
    if !has_ports(protocol) {
        return 0;
    }
    at.checked_add(2).and_then(|p| u16_be(b, p)).unwrap_or(0)
}

/// Source, destination, protocol and destination port of an IP packet's first bytes.
fn parse_ip(b: &[u8]) -> Option<(IpAddr, IpAddr, u8, u16)> {
    match b.first()? >> 4 {
        4 => {
            let h = b.get(..20)?;
            let ihl = usize::from(h[0] & 0x0f) * 4;
            if ihl < 20 {
                return None;
            }
            let protocol = h[9];
            let src = Ipv4Addr::new(h[12], h[13], h[14], h[15]);
            let dst = Ipv4Addr::new(h[16], h[17], h[18], h[19]);
            let fragment_offset = u16_be(h, 6)? & 0x1fff;
            let port = if fragment_offset == 0 {
                dst_port(b, ihl, protocol)
            } else {
                0
            };
            Some((src.into(), dst.into(), protocol, port))
        }
        6 => {
            let h = b.get(..40)?;
            let src: [u8; 16] = h[8..24].try_into().ok()?;
            let dst: [u8; 16] = h[24..40].try_into().ok()?;
            let (src, dst) = (Ipv6Addr::from(src), Ipv6Addr::from(dst));
            let mut next = h[6];
            let mut at = 40usize;
            let mut first_fragment = true;
            // At most a few extension headers: they must fit COPY_RANGE anyway.
            for _ in 0..8 {
                let len = match next {
                    IPV6_HOPOPTS | IPV6_ROUTING | IPV6_DSTOPTS => {
                        (usize::from(*b.get(at + 1).unwrap_or(&255)) + 1) * 8
                    }
                    IPV6_AH => (usize::from(*b.get(at + 1).unwrap_or(&255)) + 2) * 4,
                    IPV6_FRAGMENT => {
                        if let Some(off) = u16_be(b, at + 2) {
                            first_fragment = off >> 3 == 0;
                        }
                        8
                    }
                    _ => break,
                };
                // The whole header must be there, else the protocol stays this header's number.
                match (b.get(at), b.get(at..at + len)) {
                    (Some(&n), Some(_)) => {
                        next = n;
                        at += len;
                    }
                    _ => break,
                }
                if !first_fragment {
                    break;
                }
            }
            let port = if first_fragment {
                dst_port(b, at, next)
            } else {
                0
            };
            Some((src.into(), dst.into(), next, port))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nlmsg(ty: u16, seq: u32, body: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&((NLMSG_HDRLEN + body.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&ty.to_ne_bytes());
        m.extend_from_slice(&0u16.to_ne_bytes());
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(body);
        m.resize(align4(m.len()), 0);
        m
    }

    fn packet_msg(family: u8, prefix: Option<&[u8]>, payload: &[u8]) -> Vec<u8> {
        let mut body = vec![family, 0, 0, 7];
        // NFULA_PACKET_HDR (hw_protocol, hook, pad): present in real messages, ignored.
        push_attr(&mut body, 1, &[0x08, 0x00, 3, 0]);
        if let Some(p) = prefix {
            push_attr(&mut body, NFULA_PREFIX, p);
        }
        push_attr(&mut body, NFULA_PAYLOAD, payload);
        nlmsg((NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET, 0, &body)
    }

    fn ipv4(protocol: u8, ihl: u8, transport: &[u8]) -> Vec<u8> {
        let mut h = vec![0u8; (usize::from(ihl) * 4).max(20)];
        h[0] = 0x40 | ihl;
        h[9] = protocol;
        h[12..16].copy_from_slice(&[10, 0, 0, 2]);
        h[16..20].copy_from_slice(&[10, 9, 9, 9]);
        h.extend_from_slice(transport);
        h
    }

    fn ipv6(next: u8, rest: &[u8]) -> Vec<u8> {
        let mut h = vec![0u8; 40];
        h[0] = 0x60;
        h[6] = next;
        h[8..24].copy_from_slice(&"fd00::2".parse::<Ipv6Addr>().unwrap().octets());
        h[24..40].copy_from_slice(&"fd00:9::9".parse::<Ipv6Addr>().unwrap().octets());
        h.extend_from_slice(rest);
        h
    }

    fn parse(buf: &[u8]) -> Vec<LoggedPacket> {
        messages(buf)
            .filter_map(|m| match m {
                Message::Packet(p) => Some(p),
                _ => None,
            })
            .collect()
    }

    const PORTS_443: [u8; 8] = [0xc0, 0x00, 0x01, 0xbb, 0, 0, 0, 0];

    #[test]
    fn parses_ipv4_tcp_with_options_and_several_messages_per_datagram() {
        let mut buf = packet_msg(2, Some(b"always\0"), &ipv4(IPPROTO_TCP, 6, &PORTS_443));
        buf.extend(packet_msg(
            2,
            Some(b"policy\0"),
            &ipv4(IPPROTO_ICMP, 5, &[8, 0]),
        ));
        buf.extend(nlmsg(3 /* NLMSG_DONE */, 0, &[0; 4]));
        let got = parse(&buf);
        assert_eq!(
            got,
            vec![
                LoggedPacket {
                    prefix: "always".into(),
                    src: "10.0.0.2".parse().unwrap(),
                    dst: "10.9.9.9".parse().unwrap(),
                    protocol: IPPROTO_TCP,
                    dst_port: 443,
                },
                LoggedPacket {
                    prefix: "policy".into(),
                    src: "10.0.0.2".parse().unwrap(),
                    dst: "10.9.9.9".parse().unwrap(),
                    protocol: IPPROTO_ICMP,
                    dst_port: 0,
                }
            ]
        );
        assert_eq!(protocol_name(got[0].protocol), "tcp");
        assert_eq!(protocol_name(got[1].protocol), "icmp");
        assert_eq!(protocol_name(IPPROTO_ICMPV6), "icmpv6");
        assert_eq!(protocol_name(47), "other");
    }

    #[test]
    fn parses_ipv6_udp_through_extension_headers() {
        // Hop-by-hop (8 bytes) then UDP to port 53.
        let mut rest = vec![IPPROTO_UDP, 0, 0, 0, 0, 0, 0, 0];
        rest.extend_from_slice(&[0x30, 0x39, 0x00, 0x35]);
        let got = parse(&packet_msg(10, Some(b"always"), &ipv6(IPV6_HOPOPTS, &rest)));
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].dst, "fd00:9::9".parse::<IpAddr>().unwrap());
        assert_eq!(got[0].src, "fd00::2".parse::<IpAddr>().unwrap());
        assert_eq!((got[0].protocol, got[0].dst_port), (IPPROTO_UDP, 53));
        // No NUL: the whole attribute is the prefix.
        assert_eq!(got[0].prefix, "always");

        // A later fragment: protocol known, no port.
        let frag = [IPPROTO_TCP, 0, 0x00, 0x08, 0, 0, 0, 1, 0, 1, 0, 2];
        let got = parse(&packet_msg(10, None, &ipv6(IPV6_FRAGMENT, &frag)));
        assert_eq!((got[0].protocol, got[0].dst_port), (IPPROTO_TCP, 0));
        assert_eq!(got[0].prefix, "");

        // An extension header cut off by the copy range: its number stays the protocol.
        let got = parse(&packet_msg(
            10,
            None,
            &ipv6(IPV6_DSTOPTS, &[IPPROTO_TCP, 4]),
        ));
        assert_eq!((got[0].protocol, got[0].dst_port), (IPV6_DSTOPTS, 0));
        assert_eq!(protocol_name(got[0].protocol), "other");
    }

    #[test]
    fn truncated_and_garbage_input_never_panics() {
        let good = packet_msg(2, Some(b"always\0"), &ipv4(IPPROTO_UDP, 5, &PORTS_443));
        // Every truncation of a valid datagram: no panic, and nothing from the cut message.
        for n in 0..good.len() {
            assert!(parse(&good[..n]).is_empty(), "cut at {n}");
        }
        // A payload cut inside the ports: addresses kept, port 0.
        let got = parse(&packet_msg(2, None, &ipv4(IPPROTO_UDP, 5, &[0, 1, 0])));
        assert_eq!((got[0].protocol, got[0].dst_port), (IPPROTO_UDP, 0));
        // IHL beyond the copied bytes, IHL < 5, short headers, unknown versions.
        let mut long_ihl = ipv4(IPPROTO_TCP, 5, &PORTS_443);
        long_ihl[0] = 0x4f;
        let got = parse(&packet_msg(2, None, &long_ihl));
        assert_eq!((got[0].protocol, got[0].dst_port), (IPPROTO_TCP, 0));
        assert!(parse(&packet_msg(2, None, &ipv4(IPPROTO_TCP, 4, &PORTS_443))).is_empty());
        assert!(parse(&packet_msg(2, None, &ipv4(IPPROTO_TCP, 5, &[])[..19])).is_empty());
        assert!(parse(&packet_msg(10, None, &ipv6(IPPROTO_TCP, &[])[..39])).is_empty());
        assert!(parse(&packet_msg(2, None, &[0x50; 40])).is_empty());
        assert!(parse(&packet_msg(2, None, &[])).is_empty());
        // Lengths that lie: a message longer than the datagram, an attribute length below the
        // header, a zero-length message (would loop forever if trusted).
        let mut lying = good.clone();
        lying[0..4].copy_from_slice(&(good.len() as u32 + 1).to_ne_bytes());
        assert!(parse(&lying).is_empty());
        let mut zero = good.clone();
        zero[0..4].copy_from_slice(&0u32.to_ne_bytes());
        assert!(parse(&zero).is_empty());
        let mut bad_attr = good.clone();
        bad_attr[NLMSG_HDRLEN + NFGENMSG_LEN..][..2].copy_from_slice(&2u16.to_ne_bytes());
        assert!(parse(&bad_attr).is_empty());
        // A body shorter than nfgenmsg.
        assert!(parse(&nlmsg((NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET, 0, &[2])).is_empty());
        // Pseudo-random bytes, and valid frames around random bodies.
        let mut x = crate::testutil::XorShift(0x2545_f491_4f6c_dd1d);
        let mut rnd = || x.next() as u8;
        for len in 0..2000 {
            let junk: Vec<u8> = (0..len % 300).map(|_| rnd()).collect();
            let _ = parse(&junk);
            let _ = parse(&packet_msg(rnd(), Some(&junk), &junk));
            let mut v6 = ipv6(rnd() % 64, &junk);
            v6.truncate(40 + len % 100);
            let _ = parse(&packet_msg(10, None, &v6));
        }
    }

    #[test]
    fn acks_and_errors_are_told_apart_from_packets() {
        let mut ack = 0i32.to_ne_bytes().to_vec();
        ack.extend_from_slice(&[0; 16]);
        let mut err = (-libc::EPERM).to_ne_bytes().to_vec();
        err.extend_from_slice(&[0; 16]);
        let mut buf = nlmsg(NLMSG_ERROR, 5, &ack);
        buf.extend(nlmsg(NLMSG_ERROR, 6, &err));
        buf.extend(nlmsg(NLMSG_ERROR, 7, &[1]));
        let got: Vec<Message> = messages(&buf).collect();
        assert_eq!(
            got,
            vec![
                Message::Ack { seq: 5, error: 0 },
                Message::Ack {
                    seq: 6,
                    error: -libc::EPERM
                },
                Message::Other
            ]
        );
    }

    #[test]
    fn the_config_message_is_one_well_formed_request() {
        let m = config_message(7, 1);
        assert_eq!(u32_ne(&m, 0), Some(m.len() as u32));
        assert_eq!(u16_ne(&m, 4), Some(0x0401));
        assert_eq!(&m[NLMSG_HDRLEN..NLMSG_HDRLEN + 4], &[0, 0, 0, 7]);
        let attrs: Vec<(u16, Vec<u8>)> = attributes(&m[NLMSG_HDRLEN + NFGENMSG_LEN..])
            .map(|(t, d)| (t, d.to_vec()))
            .collect();
        assert_eq!(
            attrs,
            vec![
                (NFULA_CFG_CMD, vec![NFULNL_CFG_CMD_BIND]),
                (NFULA_CFG_MODE, vec![0, 0, 0, 128, NFULNL_COPY_PACKET, 0]),
                (NFULA_CFG_NLBUFSIZ, NLBUFSIZ.to_be_bytes().to_vec()),
                (NFULA_CFG_QTHRESH, vec![0, 0, 0, 1]),
            ]
        );
    }

    fn run_in(ns: &NetNs, program: &str, args: &[&str], stdin: Option<&str>) {
        let (program, args, stdin) = (program.to_owned(), args.to_vec(), stdin.map(str::to_owned));
        ns.run(move || {
            use std::io::Write;
            let mut child = std::process::Command::new(&program)
                .args(&args)
                .stdin(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| {
                    io::Error::other(format!("{program} (installed by scripts/test): {e}"))
                })?;
            let mut input = child.stdin.take().unwrap();
            if let Some(s) = stdin {
                input.write_all(s.as_bytes())?;
            }
            drop(input);
            let status = child.wait()?;
            if !status.success() {
                return Err(io::Error::other(format!("{program} {args:?}: {status}")));
            }
            Ok(())
        })
        .unwrap();
    }

    /// Reads until `want` packets came or 10 s passed.
    /// The blocking `next` once something is queued (so a failure fails, never hangs), then
    /// `recv_timeout`.
    fn read_packets(
        r: &mut NflogReader,
        want: impl Fn(&[LoggedPacket]) -> bool,
    ) -> Vec<LoggedPacket> {
        let deadline = Instant::now() + Duration::from_secs(10);
        assert!(r.poll(Some(deadline)).unwrap(), "nothing logged");
        let mut got = r.next().unwrap();
        assert!(!got.is_empty());
        while !want(&got) && Instant::now() < deadline {
            got.extend(r.recv_timeout(Duration::from_millis(200)).unwrap());
        }
        got
    }

    /// The kernel's own messages, from a namespace of the test's own: the packets never leave
    /// it (the output chain rejects them), and dropping the namespace removes the table.
    #[test]
    fn reads_what_nftables_logs_in_a_namespace() {
        let ns = NetNs::create().unwrap();
        run_in(&ns, "ip", &["link", "set", "lo", "up"], None);
        run_in(
            &ns,
            "ip",
            &["addr", "add", "10.9.9.1/24", "dev", "lo"],
            None,
        );
        let v6 = ns
            .run(|| Ok(std::path::Path::new("/proc/sys/net/ipv6").exists()))
            .unwrap();
        let mut rules = String::from(
            "table inet nflogtest {\n  chain output {\n    type filter hook output priority filter;\n    ip daddr 10.9.9.9 log prefix \"always\" group 7\n    ip daddr 10.9.9.9 reject with icmpx type admin-prohibited\n",
        );
        if v6 {
            run_in(
                &ns,
                "ip",
                &["addr", "add", "fd00:9::1/64", "dev", "lo", "nodad"],
                None,
            );
            rules.push_str(
                "    ip6 daddr fd00:9::9 log prefix \"policy\" group 7\n    ip6 daddr fd00:9::9 reject with icmpx type admin-prohibited\n",
            );
        }
        rules.push_str("  }\n}\n");
        run_in(&ns, "nft", &["-f", "-"], Some(&rules));

        let mut reader = NflogReader::open(&ns, 7).unwrap();
        assert_eq!(reader.group(), 7);
        // One reader per group and namespace.
        assert!(NflogReader::open(&ns, 7).is_err());
        // Nothing logged yet: a timeout gives an empty list.
        assert!(reader
            .recv_timeout(Duration::from_millis(50))
            .unwrap()
            .is_empty());

        ns.run(|| {
            let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
            let to: std::net::SocketAddr = "10.9.9.9:8443".parse().unwrap();
            // Refused fast (or unreachable): the rule rejects it.
            assert!(s
                .connect_timeout(&to.into(), Duration::from_secs(5))
                .is_err());
            let u = std::net::UdpSocket::bind("0.0.0.0:0")?;
            let _ = u.send_to(b"x", "10.9.9.9:5353");
            if v6 {
                let u = std::net::UdpSocket::bind("[::]:0")?;
                let _ = u.send_to(b"x", "[fd00:9::9]:53");
            }
            Ok(())
        })
        .unwrap();

        let want_v4 = |p: &LoggedPacket, protocol: u8, port: u16| {
            p.prefix == "always"
                && p.src == "10.9.9.1".parse::<IpAddr>().unwrap()
                && p.dst == "10.9.9.9".parse::<IpAddr>().unwrap()
                && p.protocol == protocol
                && p.dst_port == port
        };
        let want_v6 = |p: &LoggedPacket| {
            p.prefix == "policy"
                && p.src == "fd00:9::1".parse::<IpAddr>().unwrap()
                && p.dst == "fd00:9::9".parse::<IpAddr>().unwrap()
                && p.protocol == IPPROTO_UDP
                && p.dst_port == 53
        };
        let all = |got: &[LoggedPacket]| {
            got.iter().any(|p| want_v4(p, IPPROTO_TCP, 8443))
                && got.iter().any(|p| want_v4(p, IPPROTO_UDP, 5353))
                && (!v6 || got.iter().any(want_v6))
        };
        let got = read_packets(&mut reader, all);
        assert!(all(&got), "{got:#?}");
        assert_eq!(reader.overruns(), 0);
    }
}
