//! The router's uplink through the host's own routing (production). Everything husk changes on
//! the host, and takes back on shutdown or, after a crash, at the next start:
//!
//! - a veth `husk-up<N>` (its other end is the router's `up0`), with a /30 of
//!   `100.127.0.0/16` (the host gets `.1`, the router `.2` of its /30). It goes by itself when
//!   the router's namespace goes (the husk process exits, crash or not).
//! - an nftables table `inet husk-<N>`: masquerade of the router's address onto the host's
//!   other interfaces; nothing from the router reaches the host itself (input drop); nothing
//!   new reaches the router from outside.
//! - IPv4 forwarding on `husk-up<N>` and on the default route's interface only (never
//!   `net.ipv4.ip_forward`, which would turn it on everywhere). The interface's old value is
//!   kept in `<run>/net/forwarding-<dev>.orig` and restored when no husk instance remains.
//!
//! `N` is the instance's slot, held by a lock on `<run>/net/uplink-<N>.lock` for the life of
//! the process; a slot whose lock is free belongs to a dead instance, whose leftovers are
//! removed.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::net::Ipv4Addr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use ipnet::Ipv4Net;

use crate::cmd;
use crate::netns::NetNs;

/// Most husk instances with a host uplink at once (one /30 of 100.127.0.0/16 each).
const MAX_INSTANCES: u32 = 4096;
const TRANSIT: Ipv4Addr = Ipv4Addr::new(100, 127, 0, 0);

#[derive(Debug)]
pub struct HostUplink {
    slot: u32,
    _lock: File,
    dir: PathBuf,
}

fn link_name(slot: u32) -> String {
    format!("husk-up{slot}")
}

fn table_name(slot: u32) -> String {
    format!("husk-{slot}")
}

fn lock_path(dir: &Path, slot: u32) -> PathBuf {
    dir.join(format!("uplink-{slot}.lock"))
}

/// Takes an exclusive lock on `path` if it is free.
fn try_lock(path: &Path) -> io::Result<Option<File>> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)?;
    use std::os::fd::AsFd;
    Ok(husk_runtime::sys::flock_try_exclusive(f.as_fd())?.then_some(f))
}

impl HostUplink {
    /// Cleans up after dead instances, takes a slot, and connects `router` to the host.
    pub fn attach(router: &NetNs, run_dir: &Path) -> io::Result<HostUplink> {
        let dir = run_dir.join("net");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        reap_dead(&dir);
        let (slot, lock) = (0..MAX_INSTANCES)
            .find_map(|s| match try_lock(&lock_path(&dir, s)) {
                Ok(Some(f)) => Some((s, f)),
                _ => None,
            })
            .ok_or_else(|| io::Error::other("every host uplink slot is in use"))?;
        let up = HostUplink {
            slot,
            _lock: lock,
            dir,
        };
        // Whatever a dead holder of this slot left (reap_dead ran before we held it).
        clean_slot(slot);
        // On failure, dropping `up` takes back whatever was done.
        up.connect(router)?;
        Ok(up)
    }

    /// The /30 between the host and the router.
    pub fn transit(&self) -> Ipv4Net {
        Ipv4Net::new(Ipv4Addr::from(u32::from(TRANSIT) + 4 * self.slot), 30).expect("/30")
    }

    fn addresses(&self) -> (Ipv4Addr, Ipv4Addr) {
        let base = u32::from(self.transit().network());
        (Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2))
    }

    fn connect(&self, router: &NetNs) -> io::Result<()> {
        let (host, router_addr) = self.addresses();
        let link = link_name(self.slot);
        let here = NetNs::current()?;
        crate::router::connect_uplink(
            router,
            &here,
            &link,
            Ipv4Net::new(router_addr, 30).expect("/30"),
            host,
        )?;
        let table = table_name(self.slot);
        cmd::nft(
            None,
            &format!(
                "table inet {table}
delete table inet {table}
table inet {table} {{
  chain input {{
    type filter hook input priority filter; policy accept;
    iifname \"{link}\" drop
  }}
  chain forward {{
    type filter hook forward priority filter; policy accept;
    oifname \"{link}\" ct state established,related accept
    oifname \"{link}\" drop
  }}
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr {router_addr} oifname != \"{link}\" masquerade
  }}
}}
"
            ),
        )?;
        cmd::sysctl(None, &format!("net/ipv4/conf/{link}/forwarding"), "1")?;
        if let Some(dev) = default_route_device()? {
            let key = format!("net/ipv4/conf/{dev}/forwarding");
            let was = cmd::read_sysctl(&key)?;
            if was != "1" {
                let orig = self.dir.join(format!("forwarding-{dev}.orig"));
                if !orig.exists() {
                    fs::write(&orig, &was)?;
                }
                cmd::sysctl(None, &key, "1")?;
            }
        }
        Ok(())
    }

    fn undo(&self) {
        clean_slot(self.slot);
        restore_if_last(&self.dir, Some(self.slot));
    }

    /// Removes everything this instance added on the host (as dropping it does: a router
    /// whose start fails half-way takes the host's side back too).
    pub fn detach(self) {}
}

impl Drop for HostUplink {
    fn drop(&mut self) {
        self.undo();
    }
}

/// Removes a slot's table and link (both may be gone already).
fn clean_slot(slot: u32) {
    let table = table_name(slot);
    if cmd::output(None, "nft", &["list", "table", "inet", &table]).is_ok() {
        if let Err(e) = cmd::nft(None, &format!("delete table inet {table}\n")) {
            tracing::warn!("remove nftables table inet {table}: {e}");
        }
    }
    let link = link_name(slot);
    if Path::new("/sys/class/net").join(&link).exists() {
        let _ = cmd::ip(None, &format!("link del {link}\n"));
    }
}

/// Removes what crashed husk processes added to the host (a server without egress calls this
/// too). Returns nothing: failures are logged, and the next start tries again.
pub fn reap(run_dir: &Path) {
    let dir = run_dir.join("net");
    if dir.is_dir() {
        reap_dead(&dir);
    }
}

/// Cleans the slots of dead instances (their locks are free).
fn reap_dead(dir: &Path) {
    for slot in held_or_stale_slots(dir) {
        if let Ok(Some(_lock)) = try_lock(&lock_path(dir, slot)) {
            clean_slot(slot);
        }
    }
    restore_if_last(dir, None);
}

fn held_or_stale_slots(dir: &Path) -> Vec<u32> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.filter_map(|e| {
        let name = e.ok()?.file_name().into_string().ok()?;
        name.strip_prefix("uplink-")?
            .strip_suffix(".lock")?
            .parse()
            .ok()
    })
    .collect()
}

/// With no other live instance, puts the interfaces' forwarding back as it was.
fn restore_if_last(dir: &Path, own: Option<u32>) {
    let others_alive = held_or_stale_slots(dir)
        .into_iter()
        .filter(|s| Some(*s) != own)
        .any(|s| matches!(try_lock(&lock_path(dir, s)), Ok(None)));
    if others_alive {
        return;
    }
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(dev) = name
            .strip_prefix("forwarding-")
            .and_then(|n| n.strip_suffix(".orig"))
        else {
            continue;
        };
        if let Ok(was) = fs::read_to_string(e.path()) {
            let key = format!("net/ipv4/conf/{dev}/forwarding");
            if let Err(err) = cmd::sysctl(None, &key, was.trim()) {
                tracing::warn!("restore {key}: {err}");
            }
        }
        let _ = fs::remove_file(e.path());
    }
}

/// The interface of the host's IPv4 default route.
fn default_route_device() -> io::Result<Option<String>> {
    let out = cmd::output(None, "ip", &["-4", "route", "show", "default"])?;
    let mut words = out.split_whitespace();
    while let Some(w) = words.next() {
        if w == "dev" {
            return Ok(words.next().map(str::to_owned));
        }
    }
    Ok(None)
}
