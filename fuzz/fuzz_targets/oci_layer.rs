//! OCI image layers (`husk_build::oci::unpack_layer`): a template image's layer tar, plain,
//! gzip or zstd, unpacked into an overlay-format layer directory. Images are hostile.
//!
//! The input is either a raw archive (header checksums repaired) or one built from it with
//! hostile names, links, whiteouts, types, sizes, GNU long names and PAX records. Checks:
//! nothing is written outside the layer directory (confined as root: such a write fails with
//! `EROFS`, which counts as a finding); hard links only join files inside it; no device but a
//! whiteout is made.
#![no_main]

use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

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
    let media_type = match (mode >> 1) % 3 {
        0 => "application/vnd.oci.image.layer.v1.tar",
        1 => {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(&tar).unwrap();
            tar = gz.finish().unwrap();
            "application/vnd.oci.image.layer.v1.tar+gzip"
        }
        _ => {
            tar = zstd::encode_all(&tar[..], 1).unwrap();
            "application/vnd.oci.image.layer.v1.tar+zstd"
        }
    };
    let arena = Arena::new();
    let result = husk_build::oci::unpack_layer(&tar[..], media_type, &arena.dest);
    if let Err(e) = &result {
        assert!(!is_erofs(e), "a write outside the layer directory: {e}");
    }
    arena.check_contained();
    if result.is_ok() {
        let entries = walk(&arena.dest);
        check_links_inside(&entries);
        for (p, m) in &entries {
            let t = m.file_type();
            if t.is_char_device() || t.is_block_device() || t.is_fifo() || t.is_socket() {
                assert!(
                    t.is_char_device() && m.rdev() == 0,
                    "{} is a device",
                    p.display()
                );
            }
        }
    }
});
