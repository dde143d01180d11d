//! A sandbox's trust store with one CA added: the CA whose certificates the domain proxy
//! shows for the hosts of the sandbox's header rules (husk-net's `ca` and `intercept`).
//!
//! PID 1 adds it right after `pivot_root`, before anything of the sandbox runs, resolving every
//! path inside the sandbox's own tree ([`add_ca_under`]). The template's bundle (Debian's path, which OpenSSL, curl, Python and Node's
//! `NODE_EXTRA_CA_CERTS` read; `SSL_CERT_FILE` and `REQUESTS_CA_BUNDLE` point there too) is
//! read, bounded, and written back with the CA appended, as a regular file of the sandbox's
//! writable layer.

use std::ffi::CString;
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::sys;

/// The bundle, inside the sandbox.
pub const BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// Largest template bundle read (Debian's is about 220 KiB).
const MAX_BUNDLE: u64 = 4 << 20;
/// Largest CA certificate taken.
pub const MAX_CA_PEM: usize = 8 << 10;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TrustError {
    #[error("the sandbox's CA is not one PEM certificate of at most {MAX_CA_PEM} bytes")]
    NotOneCertificate,
}

/// Checks what the spawner is asked to add: one PEM certificate, printable ASCII.
pub fn check_ca(pem: &str) -> Result<(), TrustError> {
    let body = pem.trim_end();
    let ok = pem.len() <= MAX_CA_PEM
        && body.starts_with("-----BEGIN CERTIFICATE-----")
        && body.ends_with("-----END CERTIFICATE-----")
        && body.matches("-----BEGIN").count() == 1
        && pem
            .bytes()
            .all(|b| b == b'\n' || b == b'\r' || (0x20..0x7f).contains(&b));
    if ok {
        Ok(())
    } else {
        Err(TrustError::NotOneCertificate)
    }
}

/// Adds `pem` to the bundle at [`BUNDLE`] under `root` (`/` in PID 1, right after
/// `pivot_root`, while it still has the host's privileges: the template's `/etc` may belong to
/// ids the sandbox does not map). Everything is resolved inside `root` and on its own mount
/// (`RESOLVE_IN_ROOT | RESOLVE_NO_XDEV`): a template's symlink can lead neither to `/proc` nor
/// to a directory mounted into the sandbox. Directories made and the bundle are given to
/// `owner` (the sandbox's root).
pub fn add_ca_under(root: &Path, pem: &str, owner: (u32, u32)) -> io::Result<()> {
    check_ca(pem).map_err(io::Error::other)?;
    let root = sys::openat2(
        cwd(),
        &cstr(root.as_os_str().as_bytes())?,
        libc::O_PATH | libc::O_DIRECTORY,
        0,
        0,
    )?;
    let rel = BUNDLE.trim_start_matches('/');
    let mut bundle = read_bundle(root.as_fd(), rel)?;
    if !bundle.is_empty() && !bundle.ends_with(b"\n") {
        bundle.push(b'\n');
    }
    bundle.extend_from_slice(pem.trim_end().as_bytes());
    bundle.push(b'\n');
    let (dir_path, name) = rel.rsplit_once('/').unwrap_or(("", rel));
    let dir = dir_in_root(root.as_fd(), dir_path, owner)?;
    let name = cstr(name.as_bytes())?;
    // Written anew: a symlink there is replaced, not written through.
    match sys::unlinkat(dir.as_fd(), &name, false) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let fd = sys::openat2(
        dir.as_fd(),
        &name,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
        0o644,
        libc::RESOLVE_BENEATH | libc::RESOLVE_NO_XDEV,
    )?;
    sys::fchown(fd.as_fd(), owner.0, owner.1)?;
    fs::File::from(fd).write_all(&bundle)
}

/// The directory `rel` under `root`, made (for `owner`) where missing.
fn dir_in_root(root: BorrowedFd<'_>, rel: &str, owner: (u32, u32)) -> io::Result<OwnedFd> {
    let open = |p: &str| {
        sys::openat2(
            root,
            &cstr(p.as_bytes())?,
            libc::O_PATH | libc::O_DIRECTORY,
            0,
            RESOLVE,
        )
    };
    let mut at = String::new();
    for part in rel.split('/').filter(|p| !p.is_empty()) {
        let parent = if at.is_empty() {
            open(".")?
        } else {
            open(&at)?
        };
        let name = cstr(part.as_bytes())?;
        match sys::mkdirat(parent.as_fd(), &name, 0o755) {
            Ok(()) => sys::fchownat_nofollow(parent.as_fd(), &name, owner.0, owner.1)?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        if !at.is_empty() {
            at.push('/');
        }
        at.push_str(part);
    }
    open(if at.is_empty() { "." } else { &at })
}

/// The template's bundle: empty if it has none; refused if it is not a regular file (a FIFO
/// would block PID 1) or is too big.
fn read_bundle(root: BorrowedFd<'_>, rel: &str) -> io::Result<Vec<u8>> {
    let fd = match sys::openat2(
        root,
        &cstr(rel.as_bytes())?,
        libc::O_RDONLY | libc::O_NONBLOCK,
        0,
        RESOLVE,
    ) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let f = fs::File::from(fd);
    let meta = f.metadata()?;
    if !meta.is_file() || meta.len() > MAX_BUNDLE {
        return Err(io::Error::other(format!(
            "{BUNDLE} is not a regular file of at most {MAX_BUNDLE} bytes"
        )));
    }
    let mut out = Vec::with_capacity(meta.len() as usize + MAX_CA_PEM);
    f.take(MAX_BUNDLE).read_to_end(&mut out)?;
    Ok(out)
}

/// Resolution inside the root, on its mount, never through `/proc`'s magic links.
const RESOLVE: u64 = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_XDEV | libc::RESOLVE_NO_MAGICLINKS;

fn cwd() -> BorrowedFd<'static> {
    // SAFETY: AT_FDCWD is a valid "directory fd" for every *at call, for the process's life.
    unsafe { BorrowedFd::borrow_raw(libc::AT_FDCWD) }
}

fn cstr(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    fn me() -> (u32, u32) {
        // SAFETY: getuid and getgid cannot fail.
        unsafe { (libc::getuid(), libc::getgid()) }
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("husk-trust-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn only_one_pem_certificate_is_taken() {
        assert!(check_ca(PEM).is_ok());
        let two = format!("{PEM}{PEM}");
        let long = format!(
            "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
            "A".repeat(MAX_CA_PEM)
        );
        for bad in [
            "",
            "hello",
            two.as_str(),
            long.as_str(),
            "-----BEGIN CERTIFICATE-----\n\u{1b}\n-----END CERTIFICATE-----\n",
            "-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----\n",
        ] {
            assert_eq!(check_ca(bad), Err(TrustError::NotOneCertificate), "{bad:?}");
        }
    }

    #[test]
    fn the_ca_is_appended_to_the_templates_bundle() {
        let root = scratch("append");
        let certs = root.join("etc/ssl/certs");
        fs::create_dir_all(&certs).unwrap();
        fs::write(certs.join("ca-certificates.crt"), "ROOTS").unwrap();
        add_ca_under(&root, PEM, me()).unwrap();
        let got = fs::read_to_string(certs.join("ca-certificates.crt")).unwrap();
        let _ = fs::remove_dir_all(&root);
        assert_eq!(got, format!("ROOTS\n{PEM}"));
    }

    #[test]
    fn a_template_without_a_bundle_gets_one_and_symlinks_resolve_inside_the_root() {
        let root = scratch("symlink");
        add_ca_under(&root, PEM, me()).unwrap();
        let path = root.join("etc/ssl/certs/ca-certificates.crt");
        assert_eq!(fs::read_to_string(&path).unwrap(), PEM);
        // An absolute symlink means the root's own /other/roots.pem: read through, and the
        // bundle written is a file of its own (the target is left alone).
        fs::create_dir_all(root.join("other")).unwrap();
        fs::write(root.join("other/roots.pem"), "OTHER\n").unwrap();
        fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/other/roots.pem", &path).unwrap();
        add_ca_under(&root, PEM, me()).unwrap();
        let meta = fs::symlink_metadata(&path).unwrap();
        let bundle = fs::read_to_string(&path).unwrap();
        let target = fs::read_to_string(root.join("other/roots.pem")).unwrap();
        // A symlink out of the root (`..` above it) stays in it: no such file there.
        fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("../../../../../../../../../../etc/hostname", &path).unwrap();
        add_ca_under(&root, PEM, me()).unwrap();
        let escaped = fs::read_to_string(&path).unwrap();
        // The directories may be a symlink within the root too.
        fs::remove_dir_all(root.join("etc/ssl")).unwrap();
        fs::create_dir_all(root.join("etc/pki/certs")).unwrap();
        std::os::unix::fs::symlink("/etc/pki", root.join("etc/ssl")).unwrap();
        add_ca_under(&root, PEM, me()).unwrap();
        let via_link = fs::read_to_string(root.join("etc/pki/certs/ca-certificates.crt")).unwrap();
        let _ = fs::remove_dir_all(&root);
        assert!(meta.file_type().is_file());
        assert_eq!(bundle, format!("OTHER\n{PEM}"));
        assert_eq!(
            target, "OTHER\n",
            "the symlink's target was written through"
        );
        assert_eq!(escaped, PEM);
        assert_eq!(via_link, PEM);
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let root = scratch("fifo");
        let certs = root.join("etc/ssl/certs");
        fs::create_dir_all(&certs).unwrap();
        let fifo = std::ffi::CString::new(
            certs
                .join("ca-certificates.crt")
                .as_os_str()
                .as_encoded_bytes(),
        )
        .unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo touches nothing else.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let r = add_ca_under(&root, PEM, me());
        let _ = fs::remove_dir_all(&root);
        assert!(r.is_err());
    }
}
