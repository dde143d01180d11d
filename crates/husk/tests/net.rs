//! Sandbox egress end to end, through `husk serve`, on a simulated internet (a namespace this
//! test creates; see common/internet.rs): the default policy reaches the internet and nothing
//! else (host loopback, host addresses, the router, other sandboxes, every always-denied
//! range); CIDR and domain lists; allow over deny; changes at run time; `/etc/hosts` spoofing
//! and a rebinding name; the denial log; and that nothing of husk's remains after a kill, a
//! crash or a shutdown. All traffic stays on loopback or in namespaces the test made.

mod common;

use std::time::{Duration, Instant};

use common::internet::{Internet, DENIED_TARGETS, FLIP, PUBLIC};
use common::sandbox::Sandbox;
use common::server::Server;
use common::TempDir;
use serde_json::{json, Value};

/// Run inside a sandbox: tries each probe and prints one JSON object {probe: {r, ms}} (the
/// probes are described in the script, shared with the SDK compat suites).
const PROBE: &str = include_str!("../../../tests/compat/netsim/probe.py");

/// Probes, network changes and the denial log, for this test.
impl Sandbox<'_> {
    /// Runs the probes; their results by probe.
    fn probe(&self, probes: &[&str]) -> Value {
        let mut args = vec!["-c", PROBE];
        args.extend_from_slice(probes);
        let ran = self.run(Some("user"), "/usr/bin/python3", &args, &[]);
        let (code, out) = (ran.code, ran.stdout);
        assert_eq!(code, 0, "probe failed: {out}");
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
    }

    fn put_network(&self, body: Value) {
        self.server
            .request(
                "PUT",
                &format!("/sandboxes/{}/network", self.id),
                &self.key,
                body.to_string(),
            )
            .expect(204);
    }

    fn denials(&self) -> Vec<Value> {
        let r = self
            .server
            .request(
                "GET",
                &format!("/husk/v1/sandboxes/{}/denials", self.id),
                &self.key,
                "",
            )
            .expect(200)
            .json();
        r["denials"].as_array().unwrap().clone()
    }
}

fn result(v: &Value, probe: &str) -> String {
    v[probe]["r"].as_str().unwrap_or("missing").to_owned()
}

/// The probe was refused at once (a reset or an ICMP error), never a silent timeout.
fn assert_refused_fast(v: &Value, probe: &str) {
    let r = result(v, probe);
    let ms = v[probe]["ms"].as_u64().unwrap_or(u64::MAX);
    assert!(
        r == "refused"
            || r == "reset"
            || r == "closed"
            || r.starts_with("oserror")
            || r.starts_with("urlerror"),
        "{probe}: expected a refusal, got {r}"
    );
    assert!(!r.contains("timed out"), "{probe}: {r}");
    assert!(ms < 1500, "{probe}: refused only after {ms} ms ({r})");
}

fn start(internet: &Internet, state: &TempDir, extra: &[&str]) -> Server {
    let mut args: Vec<String> = internet.serve_args();
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start_with(state.path(), &args)
}

#[test]
fn the_default_policy_reaches_the_internet_and_nothing_else() {
    let _host = HOST_TABLES.lock().unwrap_or_else(|p| p.into_inner());
    let internet = Internet::new();
    let state = TempDir::new("net-default");
    let server = start(&internet, &state, &[]);
    let key = server.key_for("net-a");
    // A service on the host's loopback (what `localhost:5432` stands for).
    let host_service = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let host_port = host_service.local_addr().unwrap().port();
    let host_addr =
        husk_net::cmd::output(None, "ip", &["-o", "-4", "addr", "show", "scope", "global"])
            .unwrap()
            .split_whitespace()
            .skip_while(|w| *w != "inet")
            .nth(1)
            .map(|a| a.split('/').next().unwrap().to_owned());

    let a = Sandbox::create(&server, &key, json!({"templateID": "base"}));
    let b = Sandbox::create(&server, &key, json!({"templateID": "base"}));
    b.spawn("/usr/bin/python3", &["-m", "http.server", "8080"], &[]);
    let ran = b.run(
        Some("user"),
        "/usr/bin/python3",
        &["-c", "import socket;s=socket.socket(2,2);s.connect(('198.51.100.10',9));print(s.getsockname()[0])"],
        &[],
    );
    let b_addr = ran.stdout.trim().to_owned();
    assert!(b_addr.starts_with("100.96."), "{b_addr}");

    let mut probes: Vec<String> = vec![
        format!("http:http://{PUBLIC}/"),
        "dns:allowed.test".into(),
        // DNS sent anywhere is answered by husk's resolver (no server listens there).
        "dnsat:198.51.100.99:allowed.test".into(),
        format!("tcp:127.0.0.1:{host_port}"),
        "tcp:GW:22".into(),
        format!("tcp:{b_addr}:8080"),
        format!("udp:{PUBLIC}:9"),
        // IPv6 (unique local, link-local): no way there.
        "tcp:fd00::1:80".into(),
        "tcp:fe80::1:80".into(),
    ];
    if let Some(h) = &host_addr {
        probes.push(format!("tcp:{h}:{host_port}"));
    }
    probes.extend(DENIED_TARGETS.iter().map(|t| format!("tcp:{t}:80")));
    let probe_refs: Vec<&str> = probes.iter().map(String::as_str).collect();
    let v = a.probe(&probe_refs);

    assert_eq!(
        result(&v, &probes[0]),
        "ok:public host=198.51.100.10",
        "{v}"
    );
    assert_eq!(
        result(&v, "dns:allowed.test"),
        format!("ok:{PUBLIC}"),
        "{v}"
    );
    assert_eq!(
        result(&v, "dnsat:198.51.100.99:allowed.test"),
        format!("ok:198.51.100.99:{PUBLIC}"),
        "{v}"
    );
    for p in &probes[3..] {
        assert_refused_fast(&v, p);
    }
    // Multicast is not routed at all; no ICMP error is ever sent for it, so this one is
    // simply never answered.
    let multicast = "udp:239.1.2.3:9";
    let m = a.probe(&[multicast]);
    assert_eq!(result(&m, multicast), "timeout", "{m}");
    assert!(
        internet.denied_hits().is_empty(),
        "{:?}",
        internet.denied_hits()
    );
    // The other sandbox's server is up (reachable from inside it), just not from a.
    let own = b.probe(&["tcp:127.0.0.1:8080"]);
    assert!(
        result(&own, "tcp:127.0.0.1:8080").starts_with("ok:HTTP/1.0"),
        "{own}"
    );

    // The refusals were recorded, with the reason, and are all there as soon as the probe
    // returned (reading the log first files what the kernel logged).
    let log = a.denials();
    let has = |addr: &str, port: u64, proto: &str, why: &str| {
        log.iter().any(|d| {
            d["address"] == addr
                && d["port"] == port
                && d["protocol"] == proto
                && d["reason"] == why
        })
    };
    for (addr, port, proto, why) in [
        ("10.20.30.40", 80, "tcp", "always denied"),
        ("169.254.169.254", 80, "tcp", "always denied"),
        ("198.18.0.5", 80, "tcp", "always denied"),
        (b_addr.as_str(), 8080, "tcp", "always denied"),
        (PUBLIC, 9, "udp", "udp not allowed"),
    ] {
        assert!(
            has(addr, port, proto, why),
            "{addr}:{port} {proto} {why} not in {log:?}"
        );
    }
    // E2B's logs endpoint has them as lines; another team sees nothing of them.
    let logs = server
        .request("GET", &format!("/sandboxes/{}/logs", a.id), &key, "")
        .expect(200)
        .json();
    assert!(
        logs["logs"].as_array().unwrap().iter().any(|l| l["line"]
            .as_str()
            .unwrap()
            .contains("denied tcp 10.20.30.40:80 (always denied)")),
        "{logs}"
    );
    let other = server.key_for("net-b");
    server
        .request(
            "GET",
            &format!("/husk/v1/sandboxes/{}/denials", a.id),
            &other,
            "",
        )
        .expect(404);
    // `husk sandbox logs` shows the same.
    let out = std::process::Command::new(common::HUSK)
        .args(["sandbox", "logs", &a.id, "--server", &server.url()])
        .env("HUSK_API_KEY", &key)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("10.20.30.40:80") && text.contains("always denied"),
        "{text}"
    );
}

#[test]
fn cidr_lists_allow_over_deny_and_changes_at_run_time() {
    let _host = HOST_TABLES.lock().unwrap_or_else(|p| p.into_inner());
    let internet = Internet::new();
    let state = TempDir::new("net-cidr");
    let server = start(&internet, &state, &[]);
    let key = server.key_for("net-c");
    let web = format!("tcp:{PUBLIC}:80");
    let sb = Sandbox::create(
        &server,
        &key,
        json!({"templateID": "base", "network": {"denyOut": ["198.51.100.0/24"]}}),
    );
    assert_refused_fast(&sb.probe(&[&web]), &web);
    let info = server
        .request("GET", &format!("/sandboxes/{}", sb.id), &key, "")
        .expect(200)
        .json();
    assert_eq!(
        info["network"]["denyOut"],
        json!(["198.51.100.0/24"]),
        "{info}"
    );
    assert_eq!(info["allowInternetAccess"], json!(true));
    // Allow beats deny. UDP goes out only where an allow rule names it: the datagram then
    // reaches the internet's host, whose "port unreachable" comes back (connection refused),
    // where before the router's "administratively prohibited" did (host unreachable).
    let udp = format!("udp:{PUBLIC}:9");
    assert_eq!(result(&sb.probe(&[&udp]), &udp), "oserror:113");
    sb.put_network(json!({"allowOut": [PUBLIC], "denyOut": ["198.51.100.0/24"]}));
    let v = sb.probe(&[&web, &udp]);
    assert!(result(&v, &web).starts_with("ok:"), "{v}");
    assert_eq!(result(&v, &udp), "refused", "{v}");
    // No internet at all, then everything again (omitted fields are cleared).
    sb.put_network(json!({"allowInternetAccess": false}));
    assert_refused_fast(&sb.probe(&[&web]), &web);
    let info = server
        .request("GET", &format!("/sandboxes/{}", sb.id), &key, "")
        .expect(200)
        .json();
    assert_eq!(info["allowInternetAccess"], json!(false), "{info}");
    sb.put_network(json!({}));
    assert!(result(&sb.probe(&[&web]), &web).starts_with("ok:"));
    // An allow list cannot open an always-denied range.
    sb.put_network(json!({"allowOut": ["10.0.0.0/8"]}));
    let private = "tcp:10.20.30.40:80";
    assert_refused_fast(&sb.probe(&[private]), private);
    assert!(internet.denied_hits().is_empty());
    // Bad rules are a clear 400 and change nothing.
    let bad = server.request(
        "PUT",
        &format!("/sandboxes/{}/network", sb.id),
        &key,
        json!({"allowOut": ["not a domain"]}).to_string(),
    );
    assert_eq!(bad.status, 400, "{}", bad.text());
    assert!(bad.text().contains("not a domain"), "{}", bad.text());
    assert!(result(&sb.probe(&[&web]), &web).starts_with("ok:"));
    // Another team cannot change it.
    let other = server.key_for("net-d");
    server
        .request(
            "PUT",
            &format!("/sandboxes/{}/network", sb.id),
            &other,
            json!({"allowInternetAccess": false}).to_string(),
        )
        .expect(404);
    // A sandbox created without internet has none.
    let closed = Sandbox::create(
        &server,
        &key,
        json!({"templateID": "base", "allow_internet_access": false}),
    );
    let v = closed.probe(&[&web, "dns:allowed.test"]);
    assert_refused_fast(&v, &web);
    assert!(!result(&v, "dns:allowed.test").starts_with("ok:"), "{v}");
}

#[test]
fn domains_go_through_the_proxy_which_resolves_them_itself() {
    let _host = HOST_TABLES.lock().unwrap_or_else(|p| p.into_inner());
    let internet = Internet::new();
    let state = TempDir::new("net-domains");
    let server = start(&internet, &state, &[]);
    let key = server.key_for("net-e");
    let sb = Sandbox::create(
        &server,
        &key,
        json!({"templateID": "base", "allow_internet_access": false,
               "network": {"allowOut": ["allowed.test", "*.wild.test"]}}),
    );
    let v = sb.probe(&[
        "http:http://allowed.test/",
        "http:http://api.wild.test/",
        "http:http://other.test/",
        &format!("http:http://{PUBLIC}/"),
        "tls:allowed.test:443",
        "tls:other.test:443",
        "tcp:allowed.test:8080",
    ]);
    assert_eq!(
        result(&v, "http:http://allowed.test/"),
        "ok:public host=allowed.test",
        "{v}"
    );
    assert_eq!(
        result(&v, "http:http://api.wild.test/"),
        "ok:public host=api.wild.test",
        "{v}"
    );
    // Same address, name not allowed; the bare address is not a name.
    assert_refused_fast(&v, "http:http://other.test/");
    assert_refused_fast(&v, &format!("http:http://{PUBLIC}/"));
    assert_refused_fast(&v, "tcp:allowed.test:8080");
    // TLS: the ClientHello for allowed.test reached the server, the other one did not.
    let tls_hits = |name: &str| {
        internet
            .hits()
            .iter()
            .filter(|(to, host)| to.ends_with(":443") && host == name)
            .count()
    };
    assert_eq!(tls_hits("tls"), 1, "{:?} / {v}", internet.hits());
    assert_ne!(result(&v, "tls:other.test:443"), "ok");
    let log = sb.denials();
    assert!(
        log.iter()
            .any(|d| d["host"] == "other.test" && d["reason"] == "policy"),
        "{log:?}"
    );

    // /etc/hosts inside points allowed.test at a private address: the proxy resolves the
    // name itself, so the request still goes to the real server, and the private target sees
    // nothing.
    let code = sb
        .run(
            Some("root"),
            "/bin/sh",
            &["-c", "echo '10.20.30.40 allowed.test' >> /etc/hosts"],
            &[],
        )
        .code;
    assert_eq!(code, 0);
    let v = sb.probe(&["http:http://allowed.test/", "dns:allowed.test"]);
    assert_eq!(result(&v, "dns:allowed.test"), "ok:10.20.30.40", "{v}");
    assert_eq!(
        result(&v, "http:http://allowed.test/"),
        "ok:public host=allowed.test",
        "{v}"
    );
    assert!(
        internet.denied_hits().is_empty(),
        "{:?}",
        internet.denied_hits()
    );

    // A name that resolves into the private network is refused even though it is allowed.
    sb.put_network(json!({"allowInternetAccess": false, "allowOut": ["rebind.test"]}));
    let v = sb.probe(&["http:http://rebind.test/"]);
    assert_refused_fast(&v, "http:http://rebind.test/");
    assert!(
        internet.denied_hits().is_empty(),
        "{:?}",
        internet.denied_hits()
    );
    let log = sb.denials();
    assert!(
        log.iter()
            .any(|d| d["host"] == "rebind.test" && d["reason"] == "resolves to a denied address"),
        "{log:?}"
    );

    // A rebinding name server (answers alternate between a public and a private address):
    // whatever the sandbox was told, the bytes go to the public server or nowhere.
    sb.put_network(json!({"allowInternetAccess": false, "allowOut": [FLIP]}));
    let probe = format!("http:http://{FLIP}/");
    for _ in 0..4 {
        let v = sb.probe(&[&probe]);
        let r = result(&v, &probe);
        if r.starts_with("ok:") {
            assert_eq!(r, format!("ok:public host={FLIP}"), "{v}");
        } else {
            assert_refused_fast(&v, &probe);
        }
    }
    assert!(
        internet.denied_hits().is_empty(),
        "{:?}",
        internet.denied_hits()
    );
}

#[test]
fn asking_a_server_without_egress_for_a_network_is_a_clear_error() {
    let _host = HOST_TABLES.lock().unwrap_or_else(|p| p.into_inner());
    let state = TempDir::new("net-off");
    let server = Server::start(state.path()); // --egress off
    let key = server.key_for("net-g");
    let r = server.request(
        "POST",
        "/husk/v1/runs",
        &key,
        json!({"command": ["true"], "net": ["internet"]}).to_string(),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("no network"), "{}", r.text());
    let runs = server
        .request("GET", "/husk/v1/runs", &key, "")
        .expect(200)
        .json();
    assert_eq!(runs["runs"].as_array().map(Vec::len), Some(0), "{runs}");
    let r = server.request(
        "POST",
        "/sandboxes",
        &key,
        json!({"templateID": "base", "network": {"allowOut": ["pypi.org"]}}).to_string(),
    );
    assert_eq!(r.status, 501, "{}", r.text());
    assert!(r.text().contains("--egress"), "{}", r.text());
    assert!(server.sandboxes(&key).is_empty());
    // What every SDK create sends (allow_internet_access: true) is the server's default: here,
    // loopback only.
    let sb = Sandbox::create(
        &server,
        &key,
        json!({"templateID": "base", "allow_internet_access": true}),
    );
    let web = format!("tcp:{PUBLIC}:80");
    let v = sb.probe(&[&web]);
    assert_eq!(result(&v, &web), "oserror:101", "{v}"); // ENETUNREACH: no route at all
    let info = server
        .request("GET", &format!("/sandboxes/{}", sb.id), &key, "")
        .expect(200)
        .json();
    assert_eq!(info["allowInternetAccess"], json!(false), "{info}");
}

/// The router's namespace inside the server's network helper (found by its uplink), if any.
fn router_of(server: &mut Server) -> Option<husk_net::netns::NetNs> {
    let pid = common::server_helpers(server.child().id())
        .into_iter()
        .find_map(|(name, pid)| (name == "husk-net").then_some(pid))?;
    let host = husk_net::netns::NetNs::current().unwrap();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.flatten() {
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        if !target.to_string_lossy().starts_with("net:") {
            continue;
        }
        let Ok(ns) = husk_net::netns::NetNs::open(&e.path()) else {
            continue;
        };
        if ns.same_as(&host) {
            continue;
        }
        let links = husk_net::cmd::output(Some(&ns), "ip", &["-o", "link"]).unwrap_or_default();
        if links.contains(" up0@") {
            return Some(ns);
        }
    }
    None
}

fn sandbox_links(router: &husk_net::netns::NetNs) -> usize {
    husk_net::cmd::output(Some(router), "ip", &["-o", "link"])
        .unwrap()
        .lines()
        .filter(|l| l.contains(": sb"))
        .count()
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// The tests of this file run one at a time: some compare the host's nftables tables before
/// and after, one adds a table to the host, and every server's start removes the tables of
/// crashed ones (a test's own crashed server's among them, while it is checking it).
static HOST_TABLES: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn nothing_remains_after_kill_crash_and_shutdown() {
    let _host = HOST_TABLES.lock().unwrap_or_else(|p| p.into_inner());
    let internet = Internet::new();
    let links_before = internet.links().lines().count();
    let tables_before = husk_net::cmd::output(None, "nft", &["list", "tables"]).unwrap();
    let state = TempDir::new("net-clean");
    let mut server = start(&internet, &state, &["--net-pool", "1"]);
    let key = server.key_for("net-f");
    let mut router = None;
    wait_until("the router is up", || {
        router = router_of(&mut server);
        router.is_some()
    });
    let router = router.unwrap();
    wait_until("the pool is filled", || sandbox_links(&router) == 1);
    {
        let sb = Sandbox::create(
            &server,
            &key,
            json!({"templateID": "base", "network": {"denyOut": ["198.51.100.0/24"]}}),
        );
        let rules = husk_net::cmd::output(Some(&router), "nft", &["list", "table", "inet", "husk"])
            .unwrap();
        assert!(rules.contains("198.51.100.0/24"), "{rules}");
        wait_until("the pool is refilled", || sandbox_links(&router) == 2);
        drop(sb);
    }
    // The link goes with the sandbox's namespace, its rules on the router's pool thread: each
    // in its own time.
    wait_until("the killed sandbox's link is gone", || {
        sandbox_links(&router) == 1
    });
    wait_until("the killed sandbox's rules are gone", || {
        !husk_net::cmd::output(Some(&router), "nft", &["list", "table", "inet", "husk"])
            .unwrap()
            .contains("198.51.100.0/24")
    });

    // Shutdown: the uplink goes with the router (once this test lets go of it too); nothing
    // on the host changed.
    drop(server);
    drop(router);
    wait_until("the uplink is gone after shutdown", || {
        internet.links().lines().count() == links_before
    });
    assert_eq!(
        husk_net::cmd::output(None, "nft", &["list", "tables"]).unwrap(),
        tables_before
    );

    // Crash: SIGKILL leaves nothing either (the router lives only as long as the process).
    let server = start(&internet, &state, &["--net-pool", "1"]);
    let key = server.key_for("net-f");
    let sb = Sandbox::create(&server, &key, json!({"templateID": "base"}));
    assert!(internet.links().contains("husk-"));
    std::mem::forget(sb);
    server.kill_hard();
    wait_until("the uplink is gone after a crash", || {
        internet.links().lines().count() == links_before
    });
    assert_eq!(
        husk_net::cmd::output(None, "nft", &["list", "tables"]).unwrap(),
        tables_before
    );
}

fn host_state() -> (String, Vec<String>, String) {
    let tables = husk_net::cmd::output(None, "nft", &["list", "tables"]).unwrap();
    let links: Vec<String> = husk_net::cmd::output(None, "ip", &["-o", "link"])
        .unwrap()
        .lines()
        .filter_map(|l| l.split(':').nth(1).map(|n| n.trim().to_owned()))
        .collect();
    let dev = husk_net::cmd::output(None, "ip", &["-4", "route", "show", "default"])
        .unwrap()
        .split_whitespace()
        .skip_while(|w| *w != "dev")
        .nth(1)
        .unwrap_or("lo")
        .to_owned();
    let fwd = std::fs::read_to_string(format!("/proc/sys/net/ipv4/conf/{dev}/forwarding"))
        .unwrap_or_default();
    (tables, links, fwd)
}

/// With the host as the uplink (production), husk adds exactly its table, its link and
/// forwarding on two interfaces, keeps sandboxes off the host, and takes it all back on
/// shutdown, and after a crash at the next start. No packet leaves the host: every probe
/// targets the host itself and is refused inside husk's router.
#[test]
fn the_host_uplink_changes_only_what_it_says_and_takes_it_back() {
    let _host = HOST_TABLES.lock().unwrap_or_else(|p| p.into_inner());
    let before = host_state();
    let state = TempDir::new("net-host");
    let mut server = Server::start_with(state.path(), &["--egress", "host", "--net-pool", "1"]);
    let mut router = None;
    wait_until("the router is up", || {
        router = router_of(&mut server);
        router.is_some()
    });
    drop(router);
    let during = host_state();
    let table = during
        .0
        .lines()
        .find(|l| l.starts_with("table inet husk-") && !before.0.contains(l))
        .unwrap_or_else(|| panic!("no husk table on the host: {}", during.0))
        .trim_start_matches("table inet ")
        .to_owned();
    let slot = table.trim_start_matches("husk-");
    let link = format!("husk-up{slot}");
    assert!(
        during.1.iter().any(|l| l.starts_with(&link)),
        "{:?}",
        during.1
    );
    assert_eq!(
        during.2.trim(),
        "1",
        "forwarding on the default route's interface"
    );

    let key = server.key_for("net-h");
    let host_service = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = host_service.local_addr().unwrap().port();
    let mut probes = vec![
        format!("tcp:127.0.0.1:{port}"),
        format!(
            "tcp:100.127.0.{}:{port}",
            4 * slot.parse::<u32>().unwrap() + 1
        ),
    ];
    let host_addrs = husk_net::cmd::output(None, "ip", &["-o", "-4", "addr", "show"]).unwrap();
    for l in host_addrs.lines() {
        let mut w = l.split_whitespace().skip_while(|w| *w != "inet");
        if let Some(a) = w.nth(1) {
            let a = a.split('/').next().unwrap();
            if !a.starts_with("127.") {
                probes.push(format!("tcp:{a}:{port}"));
            }
        }
    }
    {
        let sb = Sandbox::create(&server, &key, json!({"templateID": "base"}));
        let refs: Vec<&str> = probes.iter().map(String::as_str).collect();
        let v = sb.probe(&refs);
        for p in &probes {
            assert_refused_fast(&v, p);
        }
    }
    drop(server);
    assert_eq!(host_state(), before, "after shutdown");

    // A crash leaves the table and forwarding; the next start removes them, and its own stop
    // leaves the host as it was.
    let server = Server::start_with(state.path(), &["--egress", "host", "--net-pool", "0"]);
    server.key_for("net-h");
    server.kill_hard_with("husk-net");
    let crashed = host_state();
    assert!(crashed.0.contains("table inet husk-"), "{}", crashed.0);
    // Even a server started without egress cleans up after a crashed one.
    let server = Server::start_with(state.path(), &["--egress", "off"]);
    drop(server);
    assert_eq!(host_state(), before, "after a crash and a restart");
}

/// `husk run --net`, locally: the same router, for one command.
#[test]
fn husk_run_net_goes_out_under_its_policy_and_reports_denials() {
    let _host = HOST_TABLES.lock().unwrap_or_else(|p| p.into_inner());
    let internet = Internet::new();
    let egress = internet.serve_args();
    let run = |net: &[&str], code: &str| {
        let mut args: Vec<String> = vec!["run".into()];
        for n in net {
            args.push("--net".into());
            args.push((*n).into());
        }
        args.extend(egress.iter().cloned());
        args.extend([
            "--".into(),
            "/usr/bin/python3".into(),
            "-c".into(),
            code.into(),
        ]);
        let out = std::process::Command::new(common::HUSK)
            .args(&args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let fetch = format!(
        "import socket\ntry:\n  s=socket.create_connection(('{PUBLIC}',80),timeout=5); s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n'); print(s.recv(100).decode().split('\\r\\n\\r\\n')[-1])\nexcept OSError as e:\n  print('error', e.errno)"
    );
    let (code, out, err) = run(&["internet"], &fetch);
    assert_eq!((code, out.as_str()), (Some(0), "public host=-"), "{err}");
    let (_, out, err) = run(&["deny=198.51.100.0/24"], &fetch);
    assert_eq!(out, "error 111", "{err}");
    assert!(
        err.contains(&format!("husk: denied tcp {PUBLIC}:80 (policy)")),
        "{err}"
    );
    // Without --net: loopback only.
    let (_, out, _) = run(&[], &fetch);
    assert_eq!(out, "error 101");
    assert!(internet.denied_hits().is_empty());
    // A bad policy is a clear error before anything runs.
    let (code, _, err) = run(&["allow=not a domain"], &fetch);
    assert_ne!(code, Some(0));
    assert!(
        err.contains("--net") && err.contains("not a domain"),
        "{err}"
    );
}

/// The operator's settings: a default policy, and ranges added to the always-denied ones.
#[test]
fn the_servers_default_policy_and_extra_denied_ranges_apply() {
    let _host = HOST_TABLES.lock().unwrap_or_else(|p| p.into_inner());
    let internet = Internet::new();
    let web = format!("tcp:{PUBLIC}:80");
    {
        let state = TempDir::new("net-default-none");
        let server = start(&internet, &state, &["--net-default", "none"]);
        let key = server.key_for("net-i");
        // What the SDKs send on every create (allow_internet_access: true) leaves the default.
        let sb = Sandbox::create(
            &server,
            &key,
            json!({"templateID": "base", "allow_internet_access": true}),
        );
        assert_refused_fast(&sb.probe(&[&web]), &web);
        let sb = Sandbox::create(
            &server,
            &key,
            json!({"templateID": "base", "allow_internet_access": false, "network": {"allowOut": [PUBLIC]}}),
        );
        assert!(result(&sb.probe(&[&web]), &web).starts_with("ok:"));
    }
    let state = TempDir::new("net-extra-deny");
    let server = start(&internet, &state, &["--net-deny", "198.51.100.10/32"]);
    let key = server.key_for("net-j");
    let sb = Sandbox::create(&server, &key, json!({"templateID": "base"}));
    assert_refused_fast(&sb.probe(&[&web]), &web);
    // No policy opens it.
    sb.put_network(json!({"allowOut": [PUBLIC]}));
    assert_refused_fast(&sb.probe(&[&web]), &web);
    assert!(
        sb.denials()
            .iter()
            .any(|d| d["address"] == PUBLIC && d["reason"] == "always denied"),
        "{:?}",
        sb.denials()
    );
    // A bad range is refused at start, with its name.
    let other = TempDir::new("net-bad-deny");
    let bad = std::process::Command::new(common::HUSK)
        .args(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(other.path())
        .args(internet.serve_args())
        .args(["--net-deny", "10.0.0.0/33"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("10.0.0.0/33"), "{err}");
}

/// A sandbox with a network outlives its server (`husk serve` without `--destroy-on-exit`):
/// a stop and a crash leave it running, and the next server links it to its new router again
/// at the same address, under the policy it had (a domain list through the proxy, a denied
/// range), with a policy change and the denial log working as before. The last server, with
/// `--destroy-on-exit`, takes it with it, and nothing of husk's remains.
#[test]
fn a_sandbox_keeps_its_network_through_restarts_of_its_server() {
    let _host = HOST_TABLES.lock().unwrap_or_else(|p| p.into_inner());
    let internet = Internet::new();
    let links_before = internet.links().lines().count();
    let tables_before = husk_net::cmd::output(None, "nft", &["list", "tables"]).unwrap();
    let state = TempDir::new("net-keep");
    let args = internet.serve_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let web = format!("http:http://{PUBLIC}/");
    let named = "http:http://allowed.test/";
    let other = "http:http://other.test/";
    let check = |sb: &Sandbox<'_>| {
        let v = sb.probe(&[named, other, &web]);
        assert!(result(&v, named).starts_with("ok:"), "{v}");
        assert!(!result(&v, other).starts_with("ok:"), "{v}");
        assert_refused_fast(&v, &web);
    };
    let address = |sb: &Sandbox<'_>| {
        sb.run(
            Some("user"),
            "/usr/bin/python3",
            &["-c", "import socket;s=socket.socket(2,2);s.connect(('198.51.100.10',9));print(s.getsockname()[0])"],
            &[],
        )
        .stdout
        .trim()
        .to_owned()
    };
    let (id, token, key, addr);
    {
        let server = Server::start_keeping(state.path(), &args);
        key = server.key_for("net-keep");
        let sb = Sandbox::create(
            &server,
            &key,
            json!({"templateID": "base", "allow_internet_access": false,
                   "network": {"allowOut": ["allowed.test"]}}),
        );
        check(&sb);
        addr = address(&sb);
        assert!(addr.starts_with("100.96."), "{addr}");
        (id, token) = (sb.id.clone(), sb.token.clone());
        // Not killed by its handle: it is to outlive the server.
        std::mem::forget(sb);
        drop(server); // SIGTERM
    }
    // Stopped, then started again: the same sandbox, the same address and policy.
    let server = Server::start_keeping(state.path(), &args);
    let sb = handle(&server, &key, &id, &token);
    check(&sb);
    assert_eq!(address(&sb), addr);
    // Its policy still changes at run time, and its refusals are still logged.
    sb.put_network(json!({}));
    assert!(result(&sb.probe(&[&web]), &web).starts_with("ok:"));
    sb.put_network(json!({"allowInternetAccess": false, "allowOut": ["allowed.test"]}));
    check(&sb);
    assert!(
        sb.denials().iter().any(|d| d["address"] == PUBLIC),
        "{:?}",
        sb.denials()
    );
    std::mem::forget(sb);
    // A crash (the network helper first, as in a crash where nothing cleans up).
    server.kill_hard_with("husk-net");
    let server = Server::start_keeping(state.path(), &args);
    let sb = handle(&server, &key, &id, &token);
    check(&sb);
    assert_eq!(address(&sb), addr);
    assert!(internet.denied_hits().is_empty());
    std::mem::forget(sb);
    drop(server);
    // The last server destroys it as it stops.
    let server = Server::start_with(state.path(), &args);
    let sb = handle(&server, &key, &id, &token);
    check(&sb);
    drop(sb);
    drop(server);
    wait_until("the uplink is gone", || {
        internet.links().lines().count() == links_before
    });
    assert_eq!(
        husk_net::cmd::output(None, "nft", &["list", "tables"]).unwrap(),
        tables_before
    );
    let records = std::fs::read_dir("/run/husk/net/links")
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(records, 0, "link records left in /run/husk/net/links");
}

/// A handle on sandbox `id` (made through an earlier server) on `server`.
fn handle<'a>(server: &'a Server, key: &str, id: &str, token: &str) -> Sandbox<'a> {
    Sandbox {
        server,
        key: key.to_owned(),
        id: id.to_owned(),
        token: token.to_owned(),
        created: Value::Null,
    }
}
