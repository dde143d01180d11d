//! The last layer of every template: what husk's sandboxes expect of any root file system,
//! added to images that lack it. Sandboxes run code as `user` (uid 1000, home `/home/user`),
//! so the image gets that account (in `/etc/passwd` and `/etc/group`) and its home directory
//! unless it has them; everything else of the image is left as it is.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::layers::merged_file;

/// Bump when what this layer does changes (it is part of the layer's cache key).
pub const FINALIZE_VERSION: &str = "finalize-v1";

/// Writes the finalize layer for `layers` (top first) into the empty directory `out`.
pub fn write_layer(layers: &[PathBuf], out: &Path) -> io::Result<()> {
    let read = |rel: &str| -> String {
        merged_file(layers, Path::new(rel))
            .and_then(|p| fs::read_to_string(p).ok())
            .unwrap_or_default()
    };
    let exists = |rel: &str| merged_file(layers, Path::new(rel)).is_some();
    let shell = if exists("bin/bash") || exists("usr/bin/bash") {
        "/bin/bash"
    } else {
        "/bin/sh"
    };
    let passwd = read("etc/passwd");
    let group = read("etc/group");
    let new_passwd = with_account(
        &passwd,
        &[
            ("root", "root:x:0:0:root:/root:/bin/sh"),
            ("user", &format!("user:x:1000:1000:user:/home/user:{shell}")),
        ],
        2,
    );
    let new_group = with_account(
        &group,
        &[("root", "root:x:0:"), ("user", "user:x:1000:")],
        2,
    );
    let etc = out.join("etc");
    let mkdir = |p: &Path, mode: u32| fs::DirBuilder::new().mode(mode).create(p);
    if new_passwd.is_some() || new_group.is_some() {
        mkdir(&etc, 0o755)?;
        // Keep the attributes of the merged /etc: the layer's own directory replaces them.
        if let Some(src) = merged_file(layers, Path::new("etc")) {
            copy_dir_attrs(&src, &etc)?;
        }
    }
    for (name, content) in [("passwd", new_passwd), ("group", new_group)] {
        if let Some(content) = content {
            let p = etc.join(name);
            fs::write(&p, content)?;
            fs::set_permissions(&p, fs::Permissions::from_mode(0o644))?;
        }
    }
    if !exists("home/user") {
        let home = out.join("home");
        if !exists("home") {
            mkdir(&home, 0o755)?;
        } else {
            mkdir(&home, 0o755)?;
            if let Some(src) = merged_file(layers, Path::new("home")) {
                copy_dir_attrs(&src, &home)?;
            }
        }
        let user_home = home.join("user");
        mkdir(&user_home, 0o750)?;
        std::os::unix::fs::lchown(&user_home, Some(1000), Some(1000))?;
    }
    Ok(())
}

/// `file` with each `(name, line)` account appended unless an entry of that name (or, for
/// `user`, uid/gid 1000 under another name) exists; `None` when nothing changes. `id_field`
/// is the index of the numeric id in an entry.
fn with_account(file: &str, accounts: &[(&str, &str)], id_field: usize) -> Option<String> {
    let entries: Vec<Vec<&str>> = file
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split(':').collect())
        .collect();
    let mut out = file.to_string();
    let mut changed = false;
    for (name, line) in accounts {
        let id = line.split(':').nth(id_field).unwrap_or("");
        let taken = entries
            .iter()
            .any(|e| e.first() == Some(name) || e.get(id_field) == Some(&id));
        if !taken {
            if !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(line);
            out.push('\n');
            changed = true;
        }
    }
    changed.then_some(out)
}

fn copy_dir_attrs(src: &Path, dst: &Path) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(src)?;
    fs::set_permissions(dst, fs::Permissions::from_mode(m.mode() & 0o7777))?;
    std::os::unix::fs::lchown(dst, Some(m.uid()), Some(m.gid()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accounts_are_added_only_when_missing() {
        let debian = "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1::/:/usr/sbin/nologin\n";
        let out = with_account(
            debian,
            &[
                ("root", "root:x:0:0:r:/root:/bin/sh"),
                ("user", "user:x:1000:1000:user:/home/user:/bin/bash"),
            ],
            2,
        )
        .unwrap();
        assert!(out.starts_with(debian));
        assert!(out.ends_with("user:x:1000:1000:user:/home/user:/bin/bash\n"));
        assert_eq!(out.lines().filter(|l| l.starts_with("root:")).count(), 1);
        // uid 1000 taken under another name: left alone.
        let node = "root:x:0:0::/root:/bin/sh\nnode:x:1000:1000::/home/node:/bin/sh";
        assert_eq!(
            with_account(node, &[("user", "user:x:1000:1000::/home/user:/bin/sh")], 2),
            None
        );
        // No file at all: both accounts.
        let empty =
            with_account("", &[("root", "root:x:0:"), ("user", "user:x:1000:")], 2).unwrap();
        assert_eq!(empty, "root:x:0:\nuser:x:1000:\n");
    }
}
