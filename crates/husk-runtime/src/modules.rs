//! Kernel modules husk needs, loaded on demand as other container runtimes do (Docker and
//! containerd run `modprobe overlay`, `modprobe br_netfilter`, ...): on distribution kernels
//! overlay, erofs, loop, veth and nf_tables are modules, and the kernel's own autoloading does
//! not reach every path husk takes (a netlink request from another network namespace, a
//! `/dev/loop-control` that only appears once `loop` is loaded).
//!
//! [`ensure`] first looks whether the module's feature is there (cheap: a file read or a stat),
//! and only if not runs `modprobe -q <module>` once per process, bounded in time, then looks
//! again. A host without `modprobe` (a container, a kernel with everything built in) simply
//! gets the second look.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A kernel module husk may need.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Module {
    /// overlayfs: every sandbox's root.
    Overlay,
    /// erofs: the images of built templates.
    Erofs,
    /// loop devices: erofs images on kernels before 6.12, workspace file systems.
    Loop,
    /// veth pairs: the link between a sandbox and the router namespace.
    Veth,
    /// nftables: the router's rules.
    NfTables,
}

impl Module {
    /// The name `modprobe` knows it by.
    pub fn name(self) -> &'static str {
        match self {
            Module::Overlay => "overlay",
            Module::Erofs => "erofs",
            Module::Loop => "loop",
            Module::Veth => "veth",
            Module::NfTables => "nf_tables",
        }
    }

    /// Whether the feature is there now (the module loaded, or built in).
    pub fn present(self) -> bool {
        match self {
            Module::Overlay => filesystem_known("overlay"),
            Module::Erofs => filesystem_known("erofs"),
            Module::Loop => Path::new("/dev/loop-control").exists(),
            // Built-in modules without parameters have no /sys/module entry: modules.builtin
            // says so where it exists; otherwise only using it tells.
            Module::Veth | Module::NfTables => {
                Path::new("/sys/module").join(self.name()).exists() || builtin(self.name())
            }
        }
    }
}

/// Whether `/proc/filesystems` lists `fs`.
pub fn filesystem_known(fs: &str) -> bool {
    std::fs::read_to_string("/proc/filesystems").is_ok_and(|s| filesystems_list(&s, fs))
}

/// Whether the text of `/proc/filesystems` lists `fs` ("nodev\toverlay", "\terofs").
pub(crate) fn filesystems_list(text: &str, fs: &str) -> bool {
    text.lines()
        .any(|l| l.split_whitespace().last() == Some(fs))
}

/// Whether `modules.builtin` of the running kernel names `name` (`.../name.ko`).
fn builtin(name: &str) -> bool {
    let release = crate::sys::kernel_release();
    std::fs::read_to_string(format!("/lib/modules/{release}/modules.builtin")).is_ok_and(|s| {
        s.lines()
            .any(|l| l.rsplit('/').next().and_then(|f| f.strip_suffix(".ko")) == Some(name))
    })
}

/// The modules `modprobe` was already run for in this process.
static TRIED: Mutex<Vec<Module>> = Mutex::new(Vec::new());

/// Longest a `modprobe` may take before husk stops waiting for it.
const MODPROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// What [`ensure`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Loaded {
    /// It was there already.
    Present,
    /// `modprobe` loaded it just now.
    LoadedNow,
    /// Still missing; why loading did not help (no modprobe, its message, ...).
    Missing(String),
}

impl Loaded {
    pub fn is_present(&self) -> bool {
        !matches!(self, Loaded::Missing(_))
    }
}

/// Makes sure `module`'s feature is there, running `modprobe` at most once per process.
pub fn ensure(module: Module) -> Loaded {
    if module.present() {
        return Loaded::Present;
    }
    {
        let mut tried = TRIED.lock().unwrap_or_else(|p| p.into_inner());
        if tried.contains(&module) {
            return Loaded::Missing(format!("`modprobe {}` did not load it", module.name()));
        }
        tried.push(module);
    }
    match modprobe(module.name()) {
        Ok(()) if module.present() => Loaded::LoadedNow,
        // veth and nf_tables may be built in without a trace in /sys: modprobe succeeding
        // means the kernel has them.
        Ok(()) if matches!(module, Module::Veth | Module::NfTables) => Loaded::LoadedNow,
        Ok(()) => Loaded::Missing(format!(
            "`modprobe {}` succeeded but the feature is still missing",
            module.name()
        )),
        Err(why) => Loaded::Missing(why),
    }
}

/// [`ensure`] for each of `modules`; the first one still missing, with why.
pub fn ensure_all(modules: &[Module]) -> Result<(), (Module, String)> {
    for &m in modules {
        if let Loaded::Missing(why) = ensure(m) {
            return Err((m, why));
        }
    }
    Ok(())
}

/// Where `modprobe` is, if anywhere usual.
fn modprobe_path() -> Option<&'static Path> {
    [
        "/usr/sbin/modprobe",
        "/sbin/modprobe",
        "/usr/bin/modprobe",
        "/bin/modprobe",
    ]
    .into_iter()
    .map(Path::new)
    .find(|p| p.exists())
}

/// Runs `modprobe -q name`, quietly, for at most [`MODPROBE_TIMEOUT`].
fn modprobe(name: &str) -> Result<(), String> {
    let Some(bin) = modprobe_path() else {
        return Err("no modprobe on this host".into());
    };
    let mut child = Command::new(bin)
        .args(["-q", "--", name])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("run {}: {e}", bin.display()))?;
    let deadline = Instant::now() + MODPROBE_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(st)) if st.success() => return Ok(()),
            Ok(Some(st)) => return Err(format!("`modprobe {name}` failed ({st})")),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("`modprobe {name}` did not finish within 5 s"));
            }
            Err(e) => return Err(format!("wait for modprobe: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_filesystems_is_read_by_name_not_by_substring() {
        let text = "nodev\tsysfs\nnodev\ttmpfs\nnodev\toverlay\n\text4\n\terofs\n";
        assert!(filesystems_list(text, "overlay"));
        assert!(filesystems_list(text, "erofs"));
        assert!(filesystems_list(text, "ext4"));
        assert!(!filesystems_list(text, "ext"));
        assert!(!filesystems_list(text, "squashfs"));
    }

    #[test]
    fn what_this_host_has_is_present_without_modprobe() {
        // Every developer machine and CI run has these built in or loaded.
        for m in [Module::Overlay, Module::Erofs] {
            assert_eq!(ensure(m), Loaded::Present, "{m:?}");
        }
    }
}
