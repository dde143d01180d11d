//! A warm sandbox becomes a tenant's ([`husk_proto::Request::Assign`]): a pool makes sandboxes
//! ahead of demand under a placeholder name, and the create that claims one gives it its id.
//! What carries the name inside is the kernel's hostname, which the spawner sets (PID 1 holds
//! no `CAP_SYS_ADMIN`), and the two files init wrote with it, `/etc/hostname` and
//! `/etc/hosts`, which the agent rewrites here by replacing the old name, so whatever else is
//! in them (the template's own lines) stays as a fresh sandbox would have it.

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;

use husk_proto::{AgentError, ErrorKind};

/// Largest `/etc/hostname` or `/etc/hosts` rewritten (a template's hosts file is small).
const MAX_ETC_FILE: u64 = 256 << 10;

/// The files init writes with the hostname.
const FILES: [&str; 2] = ["/etc/hostname", "/etc/hosts"];

use husk_runtime::spawner::valid_hostname;

/// Renames the sandbox from `old` to `new` in its files.
pub fn rename(old: &str, new: &str) -> Result<(), AgentError> {
    if !valid_hostname(new) {
        return Err(AgentError::new(
            ErrorKind::InvalidArgument,
            format!("invalid hostname {new:?}"),
        ));
    }
    for path in FILES {
        rewrite(path, old, new)
            .map_err(|e| AgentError::new(ErrorKind::Internal, format!("rewriting {path}: {e}")))?;
    }
    Ok(())
}

/// Replaces `old` by `new` in the file at `path`, if it is a regular file (never through a
/// link) and holds `old`; leaves it alone otherwise.
fn rewrite(path: &str, old: &str, new: &str) -> std::io::Result<()> {
    let mut f = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        // Missing, or a link or something else the template put there: nothing of ours.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOENT | libc::ELOOP | libc::ENXIO | libc::EISDIR)
            ) =>
        {
            return Ok(())
        }
        Err(e) => return Err(e),
    };
    let meta = f.metadata()?;
    if !meta.is_file() || meta.len() > MAX_ETC_FILE {
        return Ok(());
    }
    let mut text = String::new();
    if (&mut f)
        .take(MAX_ETC_FILE)
        .read_to_string(&mut text)
        .is_err()
    {
        return Ok(());
    }
    if old.is_empty() || !text.contains(old) {
        return Ok(());
    }
    let text = text.replace(old, new);
    f.set_len(0)?;
    std::io::Seek::rewind(&mut f)?;
    f.write_all(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostnames_are_checked_as_the_spawner_checks_them() {
        assert!(valid_hostname("abc-1.x"));
        assert!(valid_hostname(&"a".repeat(64)));
        for bad in ["", "a b", "a/b", "ä", "a\n"] {
            assert!(!valid_hostname(bad), "{bad:?}");
            assert!(rename("old", bad).is_err());
        }
        assert!(!valid_hostname(&"a".repeat(65)));
    }

    #[test]
    fn a_file_is_rewritten_with_the_new_name_and_keeps_the_rest() {
        let dir = std::env::temp_dir().join(format!("husk-assign-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let hosts = dir.join("hosts");
        std::fs::write(
            &hosts,
            "127.0.0.1\tlocalhost\n127.0.1.1\tpoolname\n10.0.0.1 db\n",
        )
        .unwrap();
        rewrite(hosts.to_str().unwrap(), "poolname", "claimed").unwrap();
        assert_eq!(
            std::fs::read_to_string(&hosts).unwrap(),
            "127.0.0.1\tlocalhost\n127.0.1.1\tclaimed\n10.0.0.1 db\n"
        );
        // A link is never followed: its target keeps its text.
        let target = dir.join("target");
        std::fs::write(&target, "poolname\n").unwrap();
        let link = dir.join("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&target, &link).unwrap();
        rewrite(link.to_str().unwrap(), "poolname", "claimed").unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "poolname\n");
        // Missing: nothing to do.
        rewrite(dir.join("none").to_str().unwrap(), "a", "b").unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
