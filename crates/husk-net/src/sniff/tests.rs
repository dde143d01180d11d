use super::*;

fn name(s: &str) -> Parse {
    Parse::Name(s.into())
}

/// A ClientHello for `names` (none: no server_name extension), with a few other extensions
/// around it as real clients send, in one handshake record. Shared with the proxy's tests.
pub(crate) fn client_hello(names: &[&str]) -> Vec<u8> {
    let mut exts = Vec::new();
    // supported_versions (TLS 1.3), then server_name, then a padding extension.
    exts.extend_from_slice(&[0x00, 0x2b, 0x00, 0x03, 0x02, 0x03, 0x04]);
    if !names.is_empty() {
        let mut list = Vec::new();
        for n in names {
            list.push(SNI_HOST_NAME);
            list.extend_from_slice(&(n.len() as u16).to_be_bytes());
            list.extend_from_slice(n.as_bytes());
        }
        exts.extend_from_slice(&EXT_SERVER_NAME.to_be_bytes());
        exts.extend_from_slice(&((list.len() + 2) as u16).to_be_bytes());
        exts.extend_from_slice(&(list.len() as u16).to_be_bytes());
        exts.extend_from_slice(&list);
    }
    exts.extend_from_slice(&[0x00, 0x15, 0x00, 0x04, 0, 0, 0, 0]);
    let mut body = vec![0x03, 0x03];
    body.extend_from_slice(&[7u8; 32]);
    body.push(32);
    body.extend_from_slice(&[9u8; 32]);
    body.extend_from_slice(&[0x00, 0x04, 0x13, 0x01, 0x13, 0x02]);
    body.extend_from_slice(&[0x01, 0x00]);
    body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
    body.extend_from_slice(&exts);
    let mut hs = vec![CLIENT_HELLO];
    hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend_from_slice(&body);
    records(&hs, MAX_RECORD)
}

/// `hs` split into handshake records of at most `size` bytes.
fn records(hs: &[u8], size: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for chunk in hs.chunks(size) {
        out.extend_from_slice(&[TLS_HANDSHAKE, 3, 1]);
        out.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
        out.extend_from_slice(chunk);
    }
    out
}

#[test]
fn http_host_is_lowercased_without_its_port() {
    let req = |h: &str| format!("GET /x HTTP/1.1\r\nUser-Agent: t\r\n{h}\r\nAccept: */*\r\n\r\n");
    assert_eq!(
        http_host(req("Host: Example.COM").as_bytes()),
        name("example.com")
    );
    assert_eq!(
        http_host(req("host:example.com:8080").as_bytes()),
        name("example.com")
    );
    assert_eq!(http_host(req("HOST:  a.b.  ").as_bytes()), name("a.b"));
    assert_eq!(
        http_host(req("Host: [2001:db8::1]:80").as_bytes()),
        name("2001:db8::1")
    );
    assert_eq!(
        http_host(b"POST / HTTP/1.0\nHost: a.test\n\nbody"),
        name("a.test")
    );
    // No Host, two, a bad value, a folded header, a bad port.
    for h in [
        "X-Host: a.test",
        "Host: a.test\r\nHost: b.test",
        "Host: a test",
        "Host: a.test\r\n b.test",
        "Host: a.test:80x",
        "Host: a.test:",
        "Host: ",
        "Host: a..test",
        "Host: [::1",
    ] {
        assert_eq!(http_host(req(h).as_bytes()), Parse::NoName, "{h:?}");
    }
    // Not HTTP/1.x at all.
    for r in [
        &b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..],
        b"get / HTTP/1.1\r\nHost: a.test\r\n\r\n",
        b"GET / HTTP/1.1 extra\r\nHost: a.test\r\n\r\n",
        b"SSH-2.0-OpenSSH\r\n",
        b"\x00\x01binary",
    ] {
        assert_eq!(parse(r), Parse::NoName, "{r:?}");
    }
}

#[test]
fn a_partial_request_asks_for_more_until_its_headers_end() {
    let full = b"GET / HTTP/1.1\r\nHost: a.test\r\nAccept: x\r\n\r\n";
    let end = full.len() - 2;
    for cut in 0..end {
        assert_eq!(http_host(&full[..cut]), Parse::NeedMore, "cut at {cut}");
    }
    assert_eq!(http_host(full), name("a.test"));
}

#[test]
fn tls_sni_is_found_in_one_record_or_several_and_asks_for_more_when_cut() {
    let hello = client_hello(&["API.Example.com"]);
    assert_eq!(tls_sni(&hello), name("api.example.com"));
    assert_eq!(parse(&hello), name("api.example.com"));
    for cut in 0..hello.len() {
        assert_eq!(tls_sni(&hello[..cut]), Parse::NeedMore, "cut at {cut}");
    }
    // The same handshake message split over records of 7 bytes.
    let hs = &hello[5..];
    let split = records(hs, 7);
    assert_eq!(tls_sni(&split), name("api.example.com"));
    // What follows the ClientHello does not matter.
    let mut more = hello.clone();
    more.extend_from_slice(&[0x17, 3, 3, 0, 1, 0]);
    assert_eq!(tls_sni(&more), name("api.example.com"));
}

#[test]
fn tls_without_a_single_valid_name_gives_none() {
    assert_eq!(tls_sni(&client_hello(&[])), Parse::NoName);
    assert_eq!(tls_sni(&client_hello(&["a.test", "b.test"])), Parse::NoName);
    assert_eq!(tls_sni(&client_hello(&["bad name"])), Parse::NoName);
    // Not a handshake, not TLS 3.x, empty or oversized records, not a ClientHello.
    let hello = client_hello(&["a.test"]);
    for (i, v) in [(0, 0x17), (1, 2)] {
        let mut h = hello.clone();
        h[i] = v;
        assert_eq!(tls_sni(&h), Parse::NoName, "byte {i} = {v}");
    }
    let mut h = hello.clone();
    h[3..5].fill(0);
    assert_eq!(tls_sni(&h), Parse::NoName);
    let mut h = hello.clone();
    h[3..5].copy_from_slice(&((MAX_RECORD + 1) as u16).to_be_bytes());
    assert_eq!(tls_sni(&h), Parse::NoName);
    let mut h = hello.clone();
    h[5] = 2; // ServerHello
    assert_eq!(tls_sni(&h), Parse::NoName);
}

use crate::testutil::XorShift;

#[test]
fn hostile_bytes_never_panic() {
    let samples = [
        client_hello(&["a.example.com"]),
        b"GET / HTTP/1.1\r\nHost: a.test:443\r\n\r\n".to_vec(),
    ];
    let mut rng = XorShift(0x2545f4914f6cdd1d);
    for s in &samples {
        for cut in 0..=s.len() {
            let _ = parse(&s[..cut]);
        }
        for _ in 0..20_000 {
            let mut m = s.clone();
            for _ in 0..(rng.next() % 4 + 1) {
                let i = (rng.next() as usize) % m.len();
                m[i] = rng.next() as u8;
            }
            let _ = parse(&m);
        }
    }
    for _ in 0..5_000 {
        let len = (rng.next() % 600) as usize;
        let mut m: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        if let Some(b) = m.first_mut() {
            *b = if rng.next() % 2 == 0 {
                TLS_HANDSHAKE
            } else {
                b'G'
            };
        }
        let _ = parse(&m);
    }
}

#[tokio::test]
async fn sniff_reads_until_it_knows_and_returns_every_byte_it_read() {
    let hello = client_hello(&["a.test"]);
    let mut stream = tokio_test_reader(&[&hello[..10], &hello[10..], b"after"]);
    let s = sniff(&mut stream, MAX_SNIFF, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(s.host.as_deref(), Some("a.test"));
    assert!(s.bytes.starts_with(&hello));
    // A peer that sends part of a request and then goes quiet: no name after the wait.
    let (mut client, mut server) = tokio::io::duplex(64);
    tokio::io::AsyncWriteExt::write_all(&mut client, b"GET / HTTP/1.1\r\n")
        .await
        .unwrap();
    let s = sniff(&mut server, MAX_SNIFF, Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(s.host, None);
    assert_eq!(s.bytes, b"GET / HTTP/1.1\r\n");
    // A peer that sends too much: stops at the limit.
    let big = [b'A'; 100];
    let mut stream = tokio_test_reader(&[&big]);
    let s = sniff(&mut stream, 40, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!((s.host, s.bytes.len()), (None, 40));
}

/// A reader that yields `chunks` in separate reads, then EOF.
fn tokio_test_reader(chunks: &[&[u8]]) -> impl AsyncRead + Unpin {
    let (mut w, r) = tokio::io::duplex(1 << 16);
    let chunks: Vec<Vec<u8>> = chunks.iter().map(|c| c.to_vec()).collect();
    tokio::spawn(async move {
        for c in chunks {
            tokio::io::AsyncWriteExt::write_all(&mut w, &c)
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    r
}
