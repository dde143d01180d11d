//! Workspace tar import (`husk_core::workspaces::import_local`, the same unpacker as a team's
//! `PUT` of an archive into a workspace): a client's archive, plain or gzip, unpacked into a
//! fresh directory.
//!
//! The input is either a raw archive (its header checksums repaired, so mutations get past the
//! first header) or one built from it with hostile names, links, types, sizes, GNU long names
//! and PAX records. Checks: nothing is written outside the destination (confined as root:
//! such a write fails with `EROFS`, which counts as a finding); a refused archive leaves the
//! destination as it was (empty); an accepted one holds only directories, regular files with
//! a single name and symlinks, within the limits.
#![no_main]

use std::io::Write;

use husk_core::workspaces::{import_local, ImportLimits};
use husk_fuzz::{
    build_tar, byte, check_links_inside, is_erofs, raw_tar, walk, Arena, Unstructured,
};
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
    let limits = ImportLimits {
        max_bytes: 64 << 10,
        max_entries: 64,
    };
    let arena = Arena::new();
    let result = import_local(&arena.dest, &tar[..], limits);
    if let Err(e) = &result {
        assert!(!is_erofs(e), "a write outside the destination: {e}");
    }
    arena.check_contained();
    let entries = walk(&arena.dest);
    match result {
        Err(_) => assert!(entries.is_empty(), "a refused archive left {entries:?}"),
        Ok(report) => {
            assert!(report.bytes <= limits.max_bytes);
            for (p, m) in &entries {
                let t = m.file_type();
                assert!(
                    t.is_dir() || t.is_file() || t.is_symlink(),
                    "{} is a {t:?}",
                    p.display()
                );
            }
            check_links_inside(&entries);
            let files = entries.iter().filter(|(_, m)| m.is_file());
            for (p, m) in files {
                assert_eq!(
                    std::os::unix::fs::MetadataExt::nlink(m),
                    1,
                    "{} is hard-linked",
                    p.display()
                );
            }
        }
    }
});
