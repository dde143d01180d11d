use std::net::Ipv4Addr;
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::denied::always_denied;
use crate::dns::tests::{a, connect_from, fake_upstream, run_in, test_ns};
use crate::policy::NetPolicy;
use crate::sniff::tests::client_hello;

fn flags(f: &[&str]) -> NetPolicy {
    NetPolicy::from_flags(&f.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn routes_follow_allow_rules_by_name_and_the_policy_otherwise() {
    let denied = always_denied(&[]).unwrap();
    let only = flags(&["allow=pypi.org,*.pythonhosted.org"]);
    let public = ip("203.0.113.5");
    // An allowed name goes to its own addresses, wherever the sandbox connected.
    for dst in [public, ip("10.0.0.1"), ip("127.0.0.1")] {
        assert_eq!(
            route(&only, Some("pypi.org"), dst, &denied),
            Route::Resolve("pypi.org".into())
        );
    }
    assert_eq!(
        route(&only, Some("files.pythonhosted.org"), public, &denied),
        Route::Resolve("files.pythonhosted.org".into())
    );
    // Another name, or none: the policy by address, which denies everything else.
    assert_eq!(
        route(&only, Some("evil.com"), public, &denied),
        Route::Deny(REASON_POLICY)
    );
    assert_eq!(
        route(&only, None, public, &denied),
        Route::Deny(REASON_POLICY)
    );
    // Internet minus a domain: that domain is denied, others reach where they connected,
    // never a denied range.
    let minus = flags(&["deny=evil.com"]);
    assert_eq!(
        route(&minus, Some("evil.com"), public, &denied),
        Route::Deny(REASON_POLICY)
    );
    assert_eq!(
        route(&minus, Some("ok.com"), public, &denied),
        Route::Original
    );
    assert_eq!(route(&minus, None, public, &denied), Route::Original);
    assert_eq!(
        route(&minus, Some("ok.com"), ip("169.254.169.254"), &denied),
        Route::Deny(REASON_ALWAYS_DENIED)
    );
    // Allow by address still opens a name a deny rule names (allow beats deny).
    let both = flags(&["deny=evil.com", "allow=203.0.113.0/24"]);
    assert_eq!(
        route(&both, Some("evil.com"), public, &denied),
        Route::Original
    );
    // No network: nothing.
    assert_eq!(
        route(&NetPolicy::None, Some("pypi.org"), public, &denied),
        Route::Deny(REASON_POLICY)
    );
}

/// An echo server at `addr` in `ns` that first says `tag`.
fn echo_server(ns: &NetNs, addr: &str, tag: &'static [u8]) {
    let l = netns::tcp_listen(ns, addr.parse().unwrap()).unwrap();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            tokio::spawn(async move {
                s.write_all(tag).await?;
                let (mut r, mut w) = s.split();
                tokio::io::copy(&mut r, &mut w).await?;
                io::Result::Ok(())
            });
        }
    });
}

/// The whole reply to `request` sent from `src` to `dst`: the server's tag and its echo.
async fn exchange(ns: &NetNs, src: &str, dst: &str, request: &[u8]) -> io::Result<Vec<u8>> {
    let mut s = connect_from(ns, ip(src), dst.parse().unwrap()).await?;
    s.write_all(request).await?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.len() < request.len() + 2 {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        got.extend_from_slice(&buf[..n]);
    }
    // And the other way, after the sniffed bytes.
    s.write_all(b"more").await?;
    let mut more = [0u8; 4];
    s.read_exact(&mut more).await?;
    got.extend_from_slice(&more);
    Ok(got)
}

fn http(host: &str) -> Vec<u8> {
    format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n").into_bytes()
}

/// Asserts the request is refused at once (reset or closed), and returns the denial recorded.
async fn refused(ns: &NetNs, sb: &SandboxNet, src: &str, dst: &str, req: &[u8]) -> Denial {
    let before = sb.denials().len();
    let started = Instant::now();
    let r = exchange(ns, src, dst, req).await;
    assert!(
        r.is_err(),
        "{dst} {:?} passed",
        String::from_utf8_lossy(req)
    );
    assert!(started.elapsed() < Duration::from_secs(2), "slow refusal");
    let log = sb.denials();
    assert_eq!(log.len(), before + 1, "no denial recorded");
    log.last().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_reaches_allowed_names_at_their_own_addresses_and_refuses_the_rest() {
    // The "internet" and a private address, both on this namespace's loopback.
    let ns = test_ns(&["203.0.113.10/32", "10.9.8.7/32"]);
    echo_server(&ns, "203.0.113.10:80", b"A:");
    echo_server(&ns, "203.0.113.10:443", b"T:");
    echo_server(&ns, "10.9.8.7:80", b"X:");
    let (upstream, _) = fake_upstream(
        &ns,
        vec![
            ("allowed.test", a("203.0.113.10")),
            ("rebind.test", a("10.9.8.7")),
            ("other.test", a("203.0.113.10")),
        ],
    )
    .await;
    let resolver = Arc::new(Resolver::new(vec![upstream], Some(ns.clone())));
    let sandboxes = Arc::new(Sandboxes::default());
    let gw = Ipv4Addr::new(127, 0, 0, 1);
    // Sandbox 2 may reach two names only; sandbox 4 has the internet minus one name.
    let only = Arc::new(SandboxNet::new(
        Ipv4Addr::new(127, 0, 0, 2),
        gw,
        flags(&["allow=allowed.test,rebind.test"]),
    ));
    let minus = Arc::new(SandboxNet::new(
        Ipv4Addr::new(127, 0, 0, 4),
        gw,
        flags(&["deny=other.test"]),
    ));
    sandboxes.insert(only.clone());
    sandboxes.insert(minus.clone());
    let denied = Arc::new(always_denied(&[]).unwrap());
    let listener = netns::tcp_listen(&ns, "127.0.0.1:0".parse().unwrap()).unwrap();
    let port = listener.local_addr().unwrap().port();
    let proxy = Arc::new(
        DomainProxy::new(sandboxes, resolver, denied, Some(ns.clone()))
            .with_timeouts(Duration::from_secs(2), Duration::from_millis(300)),
    );
    let serving = tokio::spawn(proxy.serve(listener));
    // What the router does: the sandboxes' web traffic to the proxy.
    run_in(
        &ns,
        &["nft", "-f", "-"],
        &format!(
            "table ip husk_test {{\n chain out {{\n type nat hook output priority -100;\n \
             ip saddr {{ 127.0.0.2, 127.0.0.4 }} tcp dport {{ 80, 443 }} redirect to :{port}\n \
             }}\n}}\n"
        ),
    );

    // An allowed name passes, both ways, over HTTP and TLS.
    let req = http("allowed.test");
    let got = exchange(&ns, "127.0.0.2", "203.0.113.10:80", &req)
        .await
        .unwrap();
    assert_eq!(got, [&b"A:"[..], &req, b"more"].concat());
    let hello = client_hello(&["allowed.test"]);
    let got = exchange(&ns, "127.0.0.2", "203.0.113.10:443", &hello)
        .await
        .unwrap();
    assert_eq!(got, [&b"T:"[..], &hello, b"more"].concat());
    // A sandbox that lies about where the name is (its /etc/hosts says 10.9.8.7) still
    // reaches the name's own address.
    let got = exchange(&ns, "127.0.0.2", "10.9.8.7:80", &req)
        .await
        .unwrap();
    assert!(
        got.starts_with(b"A:"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );

    // A name the policy does not allow: refused at once, recorded with its name.
    let d = refused(
        &ns,
        &only,
        "127.0.0.2",
        "203.0.113.10:80",
        &http("other.test"),
    )
    .await;
    assert_eq!(d.host.as_deref(), Some("other.test"));
    assert_eq!(
        (d.reason.as_str(), d.address, d.port),
        (REASON_POLICY, ip("203.0.113.10"), 80)
    );
    let d = refused(
        &ns,
        &only,
        "127.0.0.2",
        "203.0.113.10:443",
        &client_hello(&["other.test"]),
    )
    .await;
    assert_eq!(d.host.as_deref(), Some("other.test"));
    // An allowed name that resolves to a private address: refused.
    let d = refused(
        &ns,
        &only,
        "127.0.0.2",
        "203.0.113.10:80",
        &http("rebind.test"),
    )
    .await;
    assert_eq!(d.reason, REASON_RESOLVES_DENIED);
    assert_eq!(
        (d.address, d.host.as_deref()),
        (ip("10.9.8.7"), Some("rebind.test"))
    );

    // Internet minus a name: others reach where they connected, the name does not, and no
    // name reaches a denied range.
    let got = exchange(&ns, "127.0.0.4", "203.0.113.10:80", &http("fine.test"))
        .await
        .unwrap();
    assert!(got.starts_with(b"A:"));
    let d = refused(
        &ns,
        &minus,
        "127.0.0.4",
        "203.0.113.10:80",
        &http("other.test"),
    )
    .await;
    assert_eq!(d.reason, REASON_POLICY);
    let d = refused(&ns, &minus, "127.0.0.4", "10.9.8.7:80", &http("fine.test")).await;
    assert_eq!(d.reason, REASON_ALWAYS_DENIED);

    // A client that names nothing (it waits for the server to speak): judged by address
    // once the wait is over.
    let mut quiet = connect_from(&ns, ip("127.0.0.2"), "203.0.113.10:80".parse().unwrap())
        .await
        .unwrap();
    let mut buf = [0u8; 8];
    assert!(!matches!(quiet.read(&mut buf).await, Ok(n) if n > 0));
    let d = only.denials().last().unwrap().clone();
    assert_eq!((d.reason.as_str(), d.host), (REASON_POLICY, None));

    // Straight to the proxy's port (not redirected), or from no sandbox: reset.
    let direct = format!("127.0.0.1:{port}");
    assert!(exchange(&ns, "127.0.0.2", &direct, &req).await.is_err());
    assert!(exchange(&ns, "127.0.0.3", &direct, &req).await.is_err());
    assert_eq!(only.denials().len(), 4);
    serving.abort();
}
