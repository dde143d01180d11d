//! Template build contexts (`husk_build::context::unpack`): a tenant's tar or
//! tar.gz, unpacked into a directory that the build then reads as root.
//!
//! The input is either a raw archive (header checksums repaired) or one built from it with
//! hostile names, links, types, sizes, GNU long names and PAX records. Checks: nothing is
//! written outside the context (confined as root: such a write fails with `EROFS`, which
//! counts as a finding); an accepted context holds only directories, regular files and
//! symlinks, no set-id bits, hard links only between its own files, and every symlink that
//! resolves, resolves inside it.
#![no_main]

use std::io::Write;
use std::os::unix::fs::PermissionsExt;

use husk_fuzz::{
    build_tar, byte, check_links_inside, is_erofs, raw_tar, walk, Arena, Unstructured,
};
use husk_build::context::{unpack, ContextError};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let mode = byte(&mut u);
    let mut tar = if mode & 1 == 0 {
        build_tar(&mut u)
    } else {
        raw_tar(u.take_rest())
    };
    if mode & 2 == 2 {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar).unwrap();
        tar = gz.finish().unwrap();
    }
    let arena = Arena::new();
    let result = unpack(&tar[..], &arena.dest);
    if let Err(e @ ContextError::Io { .. }) = &result {
        assert!(!is_erofs(e), "a write outside the context: {e}");
    }
    arena.check_contained();
    if result.is_ok() {
        let entries = walk(&arena.dest);
        check_links_inside(&entries);
        let root = std::fs::canonicalize(&arena.dest).unwrap();
        for (p, m) in &entries {
            let t = m.file_type();
            assert!(
                t.is_dir() || t.is_file() || t.is_symlink(),
                "{} is a {t:?}",
                p.display()
            );
            if !t.is_symlink() {
                assert_eq!(
                    m.permissions().mode() & 0o7000,
                    0,
                    "{} has set-id bits",
                    p.display()
                );
            }
            if let Ok(real) = std::fs::canonicalize(p) {
                assert!(
                    real.starts_with(&root),
                    "{} resolves to {}",
                    p.display(),
                    real.display()
                );
            }
        }
    }
});
