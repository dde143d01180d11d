//! What the router needs from the host, tried in a throwaway network namespace (gone with its
//! last descriptor, whatever happens): the `ip` and `nft` programs, a veth pair, and the
//! router's own nftables table (every expression it uses, with the always-denied ranges). For
//! `husk doctor`; uses no network.

use std::path::{Path, PathBuf};

use husk_runtime::modules::{self, Loaded, Module};
use husk_runtime::probe::Check;

use crate::{cmd, netns::NetNs, nft};

/// Where `program` is on `PATH` (what `Command::new(program)` runs).
fn on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// Where `program` is, though not on `PATH` (`/usr/sbin` missing from a user's `PATH`).
fn off_path(program: &str) -> Option<PathBuf> {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .into_iter()
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}

fn program(name: &str, package: &str, what: &str) -> Check {
    let check = format!("net.{name}");
    match (on_path(name), off_path(name)) {
        (Some(p), _) => Check::ok(&check, p.display().to_string()),
        (None, Some(p)) => Check::warning(
            &check,
            format!("{} is not on PATH: {what}", p.display()),
            format!("add {} to PATH", p.parent().unwrap_or(&p).display()),
        ),
        (None, None) => Check::warning(
            &check,
            format!("`{name}` is not installed: {what}"),
            format!("install {package}: apt-get install {package}"),
        ),
    }
}

/// Why loading a module did not help, for a message.
fn note(l: &Loaded) -> String {
    match l {
        Loaded::Missing(why) => format!("; {why}"),
        _ => String::new(),
    }
}

/// Sandboxes without these get loopback only.
const NO_EGRESS: &str = "sandboxes get no network beyond loopback (--net, E2B internet access)";

/// The network checks. `root`: whether the caller may make namespaces (else those are skipped).
pub fn checks(root: bool) -> Vec<Check> {
    let ip = program("ip", "iproute2", NO_EGRESS);
    let nft_bin = program("nft", "nftables", NO_EGRESS);
    let have = |c: &Check| c.status == husk_runtime::probe::Status::Ok;
    let (have_ip, have_nft) = (have(&ip), have(&nft_bin));
    let mut out = vec![ip, nft_bin];
    if !root {
        out.push(Check::skipped("net.veth", "not probed: needs root"));
        out.push(Check::skipped("net.nftables", "not probed: needs root"));
        return out;
    }
    let loaded = [Module::Veth, Module::NfTables].map(modules::ensure);
    let ns = match NetNs::create() {
        Ok(ns) => ns,
        Err(e) => {
            out.push(Check::missing(
                "net.namespace",
                format!("cannot make a network namespace: {e}"),
                "boot a kernel built with CONFIG_NET_NS",
            ));
            return out;
        }
    };
    // The two programs start in parallel: each run is mostly the program's own start-up.
    let (veth, table) = std::thread::scope(|s| {
        let veth = s.spawn(|| veth(&ns, have_ip, &loaded[0]));
        let table = s.spawn(|| table(&ns, have_nft, &loaded[1]));
        (veth.join(), table.join())
    });
    let panicked = |name: &str| Check::warning(name, "the probe panicked", "report a bug");
    out.push(veth.unwrap_or_else(|_| panicked("net.veth")));
    out.push(table.unwrap_or_else(|_| panicked("net.nftables")));
    // Dropping the last descriptor ends the namespace, its links and its table.
    drop(ns);
    out
}

/// A veth pair in `ns` (gone with it).
fn veth(ns: &NetNs, have_ip: bool, loaded: &Loaded) -> Check {
    if !have_ip {
        return Check::skipped("net.veth", "not probed: no `ip`");
    }
    match cmd::ip(
        Some(ns),
        "link add husk-probe0 type veth peer name husk-probe1\n",
    ) {
        Ok(()) => Check::ok(
            "net.veth",
            "veth pairs (the link of each sandbox with network)",
        ),
        Err(e) => Check::warning(
            "net.veth",
            format!("cannot make a veth pair ({e}{}): {NO_EGRESS}", note(loaded)),
            "load the module: modprobe veth (CONFIG_VETH)",
        ),
    }
}

/// The router's nftables table, loaded in `ns` (gone with it).
fn table(ns: &NetNs, have_nft: bool, loaded: &Loaded) -> Check {
    if !have_nft {
        return Check::skipped("net.nftables", "not probed: no `nft`");
    }
    let denied = crate::denied::always_denied(&[]).unwrap_or_default();
    let script = nft::base_table(
        &denied,
        crate::router::RESOLVER_PORT,
        crate::router::PROXY_PORT,
    );
    match cmd::nft(Some(ns), &script) {
        Ok(()) => Check::ok(
            "net.nftables",
            "the router's nftables rules load (in a throwaway namespace)",
        ),
        Err(e) => Check::warning(
            "net.nftables",
            format!(
                "the router's nftables rules do not load ({e}{}): {NO_EGRESS}",
                note(loaded)
            ),
            "load the modules: modprobe nf_tables (CONFIG_NF_TABLES, with inet, NAT and \
             sets); install nftables >= 1.0",
        ),
    }
}
