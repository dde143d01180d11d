//! `unpack_layer` against layer tars built here, benign and hostile. Runs as root (owners,
//! whiteout device nodes and `trusted.*` xattrs need it).

mod common;

use common::TempDir;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use husk_build::oci::{unpack_layer, OciError};
use husk_runtime::layerfs::{is_whiteout, OPAQUE_XATTR};
use tar::{EntryType, Header};

const TAR: &str = "application/vnd.oci.image.layer.v1.tar";
const GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
/// A valid VFS_CAP_REVISION_2 `security.capability` value: effective, cap_net_raw permitted.
const CAP_NET_RAW: [u8; 20] = [
    1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
];

/// Builds a layer tar entry by entry. Names and link targets go into the header raw, so
/// hostile ones (`..`, absolute) are written exactly as an attacker would.
struct Layer(tar::Builder<Vec<u8>>);

impl Layer {
    fn new() -> Layer {
        Layer(tar::Builder::new(Vec::new()))
    }

    fn raw(&mut self, kind: EntryType, name: &str, link: &str, mode: u32, uid: u64, data: &[u8]) {
        let mut h = Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(uid);
        h.set_gid(uid);
        h.set_mtime(1_600_000_000);
        h.set_size(data.len() as u64);
        let old = h.as_old_mut();
        old.name[..name.len()].copy_from_slice(name.as_bytes());
        old.linkname[..link.len()].copy_from_slice(link.as_bytes());
        h.set_cksum();
        self.0.append(&h, data).unwrap();
    }

    fn file(&mut self, name: &str, mode: u32, uid: u64, data: &[u8]) -> &mut Self {
        self.raw(EntryType::Regular, name, "", mode, uid, data);
        self
    }

    fn dir(&mut self, name: &str, mode: u32, uid: u64) -> &mut Self {
        self.raw(EntryType::Directory, name, "", mode, uid, b"");
        self
    }

    fn symlink(&mut self, name: &str, target: &str) -> &mut Self {
        self.raw(EntryType::Symlink, name, target, 0o777, 1000, b"");
        self
    }

    fn hardlink(&mut self, name: &str, target: &str) -> &mut Self {
        self.raw(EntryType::Link, name, target, 0o644, 0, b"");
        self
    }

    fn pax(&mut self, records: &[(&str, &[u8])]) -> &mut Self {
        self.0
            .append_pax_extensions(records.iter().copied())
            .unwrap();
        self
    }

    fn bytes(&mut self) -> Vec<u8> {
        let b = std::mem::replace(&mut self.0, tar::Builder::new(Vec::new()));
        b.into_inner().unwrap()
    }
}

fn unpack(layer: &mut Layer, dest: &Path) -> Result<husk_build::oci::UnpackStats, OciError> {
    unpack_layer(&layer.bytes()[..], TAR, dest)
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

fn owner(p: &Path) -> (u32, u32) {
    let m = fs::symlink_metadata(p).unwrap();
    (m.uid(), m.gid())
}

#[test]
fn files_dirs_modes_owners_and_times() {
    let t = TempDir::new("basic");
    let dest = t.path("layer");
    let stats = unpack(
        Layer::new()
            .dir("./app/", 0o750, 1000)
            .file("./app/run", 0o4755, 1000, b"#!/bin/sh\n")
            .file("/etc/hostname", 0o644, 0, b"box\n")
            .file("deep/er/file.txt", 0o600, 1000, b"x"),
        &dest,
    )
    .unwrap();
    assert_eq!(fs::read(dest.join("app/run")).unwrap(), b"#!/bin/sh\n");
    assert_eq!(
        mode(&dest.join("app/run")),
        0o4755,
        "setuid survives the chown"
    );
    assert_eq!(owner(&dest.join("app/run")), (1000, 1000));
    assert_eq!(mode(&dest.join("app")), 0o750);
    assert_eq!(owner(&dest.join("app")), (1000, 1000));
    // Directory times are applied after their contents are written.
    assert_eq!(
        fs::metadata(dest.join("app")).unwrap().mtime(),
        1_600_000_000
    );
    assert_eq!(
        fs::metadata(dest.join("app/run")).unwrap().mtime(),
        1_600_000_000
    );
    assert_eq!(fs::read(dest.join("etc/hostname")).unwrap(), b"box\n");
    // Parents the tar does not list are made root-owned 0755.
    assert_eq!(mode(&dest.join("deep/er")), 0o755);
    assert_eq!(owner(&dest.join("deep")), (0, 0));
    assert_eq!(owner(&dest.join("deep/er/file.txt")), (1000, 1000));
    assert_eq!((stats.files, stats.dirs, stats.entries), (3, 1, 4));
}

#[test]
fn symlinks_and_hard_links() {
    let t = TempDir::new("links");
    let dest = t.path("layer");
    let stats = unpack(
        Layer::new()
            .file("bin/busybox", 0o755, 0, b"elf")
            .hardlink("bin/sh", "bin/busybox")
            .hardlink("bin/ls", "./bin/busybox")
            .symlink("bin/passwd-link", "/etc/passwd")
            .symlink("rel", "../../outside"),
        &dest,
    )
    .unwrap();
    let ino = |p: &str| fs::metadata(dest.join(p)).unwrap().ino();
    assert_eq!(ino("bin/sh"), ino("bin/busybox"));
    assert_eq!(ino("bin/ls"), ino("bin/busybox"));
    // Targets are kept verbatim: they only ever resolve inside a sandbox.
    assert_eq!(
        fs::read_link(dest.join("bin/passwd-link")).unwrap(),
        Path::new("/etc/passwd")
    );
    assert_eq!(
        fs::read_link(dest.join("rel")).unwrap(),
        Path::new("../../outside")
    );
    assert_eq!(
        owner(&dest.join("rel")),
        (1000, 1000),
        "lchown, not chown of the target"
    );
    assert_eq!((stats.hardlinks, stats.symlinks), (2, 2));
}

#[test]
fn whiteouts_and_opaque_dirs() {
    let t = TempDir::new("whiteout");
    let dest = t.path("layer");
    let stats = unpack(
        Layer::new()
            .file("etc/motd", 0o644, 0, b"earlier entry of the same layer")
            .file("etc/.wh.motd", 0o644, 0, b"")
            .file("usr/.wh.games", 0o644, 0, b"")
            .file("var/cache/.wh..wh..opq", 0o644, 0, b"")
            .file("var/cache/kept", 0o644, 0, b"k")
            .file("x/.wh..wh.plnk", 0o644, 0, b""),
        &dest,
    )
    .unwrap();
    for w in ["etc/motd", "usr/games"] {
        assert!(
            is_whiteout(&fs::symlink_metadata(dest.join(w)).unwrap()),
            "{w}"
        );
    }
    let opaque = xattr::get(dest.join("var/cache"), OPAQUE_XATTR).unwrap();
    assert_eq!(opaque.as_deref(), Some(&b"y"[..]));
    assert_eq!(fs::read(dest.join("var/cache/kept")).unwrap(), b"k");
    assert!(xattr::get(dest.join("var"), OPAQUE_XATTR)
        .unwrap()
        .is_none());
    assert!(
        !dest.join("x/.wh..wh.plnk").exists(),
        "aufs metadata is ignored"
    );
    assert_eq!((stats.whiteouts, stats.opaque_dirs), (2, 1));
}

#[test]
fn dot_dot_is_refused() {
    for name in ["../evil", "a/../../evil", "./a/b/../../../evil"] {
        let t = TempDir::new("dotdot");
        let dest = t.path("layer");
        let err = unpack(Layer::new().file(name, 0o644, 0, b"x"), &dest).unwrap_err();
        assert!(err.to_string().contains(".."), "{name}: {err}");
        assert!(!t.path("evil").exists());
    }
}

#[test]
fn nothing_is_written_through_a_symlinked_parent() {
    let t = TempDir::new("symparent");
    let outside = t.path("outside");
    fs::create_dir(&outside).unwrap();
    let dest = t.path("layer");
    let err = unpack(
        Layer::new()
            .symlink("a", outside.to_str().unwrap())
            .file("a/evil", 0o644, 0, b"x"),
        &dest,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "layer entry a/evil: parent is not a directory"
    );
    assert!(!outside.join("evil").exists());

    // The same through a whiteout, an opaque marker and a directory.
    for (kind, name) in [
        (EntryType::Regular, "a/.wh.x"),
        (EntryType::Regular, "a/.wh..wh..opq"),
        (EntryType::Directory, "a/d/"),
        (EntryType::Regular, "a/sub/evil"),
    ] {
        let mut layer = Layer::new();
        layer.symlink("a", outside.to_str().unwrap());
        layer.raw(kind, name, "", 0o755, 0, b"");
        let dest = t.path(&format!("layer-{}", name.len()));
        let err = unpack(&mut layer, &dest).unwrap_err();
        assert!(
            err.to_string().contains("parent is not a directory"),
            "{name}: {err}"
        );
    }
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
    assert!(xattr::get(&outside, OPAQUE_XATTR).unwrap().is_none());
}

#[test]
fn a_file_where_a_directory_should_be_is_refused() {
    let t = TempDir::new("fileparent");
    let err = unpack(
        Layer::new()
            .file("a", 0o644, 0, b"")
            .file("a/b", 0o644, 0, b""),
        &t.path("layer"),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("parent is not a directory"),
        "{err}"
    );
}

#[test]
fn a_directory_later_replaced_by_a_symlink_keeps_its_attributes_inside() {
    // The deferred chmod of `p/q` must not land on `outside/q` once `p` became a symlink.
    let t = TempDir::new("replaced");
    let outside = t.path("outside");
    fs::create_dir_all(outside.join("q")).unwrap();
    fs::set_permissions(outside.join("q"), fs::Permissions::from_mode(0o700)).unwrap();
    unpack(
        Layer::new()
            .dir("p/", 0o755, 0)
            .dir("p/q/", 0o777, 1000)
            .symlink("p", outside.to_str().unwrap()),
        &t.path("layer"),
    )
    .unwrap();
    assert_eq!(mode(&outside.join("q")), 0o700);
    assert_eq!(owner(&outside.join("q")), (0, 0));
}

#[test]
fn hard_links_must_stay_inside_the_layer() {
    let t = TempDir::new("hardlink");
    let outside = t.path("outside");
    fs::write(&outside, b"secret").unwrap();
    let cases: Vec<(&str, Layer)> = vec![
        ("../outside", Layer::new()),
        ("/etc/passwd", Layer::new()),
        ("not-yet", Layer::new()),
        ("s/passwd", {
            let mut l = Layer::new();
            l.symlink("s", "/etc");
            l
        }),
        ("link", {
            let mut l = Layer::new();
            l.symlink("link", outside.to_str().unwrap());
            l
        }),
        ("d", {
            let mut l = Layer::new();
            l.dir("d/", 0o755, 0);
            l
        }),
    ];
    for (i, (target, mut layer)) in cases.into_iter().enumerate() {
        layer.hardlink("x", target).file("not-yet", 0o644, 0, b"");
        let dest = t.path(&format!("layer{i}"));
        let err = unpack(&mut layer, &dest).unwrap_err();
        assert!(matches!(err, OciError::Unpack { .. }), "{target}: {err}");
        assert!(!dest.join("x").exists(), "{target}");
    }
    assert_eq!(fs::metadata(&outside).unwrap().nlink(), 1);
}

#[test]
fn devices_and_fifos_are_skipped() {
    let t = TempDir::new("devices");
    let dest = t.path("layer");
    let mut layer = Layer::new();
    layer.raw(EntryType::Char, "dev/null", "", 0o666, 0, b"");
    layer.raw(EntryType::Block, "dev/sda", "", 0o660, 0, b"");
    layer.raw(EntryType::Fifo, "run/fifo", "", 0o600, 0, b"");
    layer.file("ok", 0o644, 0, b"");
    let stats = unpack(&mut layer, &dest).unwrap();
    assert_eq!(stats.skipped_devices, 3);
    assert!(!dest.join("dev/null").exists() && !dest.join("dev/sda").exists());
    assert!(fs::symlink_metadata(dest.join("run/fifo")).is_err());
    assert!(dest.join("ok").exists());
}

#[test]
fn gzip_zstd_and_plain_layers() {
    let tar = Layer::new()
        .dir("d/", 0o755, 1000)
        .file("d/f", 0o640, 1000, &[7u8; 100_000])
        .bytes();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&tar).unwrap();
    let gz = gz.finish().unwrap();
    let zst = zstd::encode_all(&tar[..], 3).unwrap();
    let t = TempDir::new("compression");
    for (media_type, blob) in [(TAR, &tar), (GZIP, &gz), (ZSTD, &zst)] {
        let dest = t.path(media_type);
        let stats = unpack_layer(&blob[..], media_type, &dest).unwrap();
        assert_eq!(stats.bytes, 100_000, "{media_type}");
        assert_eq!(fs::read(dest.join("d/f")).unwrap(), vec![7u8; 100_000]);
        assert_eq!(mode(&dest.join("d/f")), 0o640);
    }
    let docker_gzip = "application/vnd.docker.image.rootfs.diff.tar.gzip";
    unpack_layer(&gz[..], docker_gzip, &t.path("docker")).unwrap();
    let err = unpack_layer(
        &tar[..],
        "application/vnd.oci.image.layer.v1.tar+lz4",
        &t.path("x"),
    )
    .unwrap_err();
    assert!(err.to_string().contains("tar+lz4"), "{err}");
    // Garbage where gzip is promised is an error, not an empty layer.
    assert!(unpack_layer(&tar[..], GZIP, &t.path("bad")).is_err());
}

#[test]
fn only_capability_and_user_xattrs_are_applied() {
    let t = TempDir::new("xattrs");
    let dest = t.path("layer");
    unpack(
        Layer::new()
            .pax(&[("SCHILY.xattr.trusted.overlay.opaque", b"y")])
            .dir("d/", 0o755, 0)
            .pax(&[
                ("SCHILY.xattr.trusted.overlay.opaque", b"y"),
                ("SCHILY.xattr.trusted.overlay.redirect", b"/etc"),
                (
                    "SCHILY.xattr.security.selinux",
                    b"system_u:object_r:shadow_t:s0",
                ),
                ("SCHILY.xattr.security.capability", &CAP_NET_RAW),
                ("SCHILY.xattr.user.note", b"hello"),
            ])
            .file("d/ping", 0o755, 1000, b"elf"),
        &dest,
    )
    .unwrap();
    let get = |p: &str, name: &str| xattr::get(dest.join(p), name).unwrap();
    assert_eq!(get("d", OPAQUE_XATTR), None);
    assert_eq!(get("d/ping", OPAQUE_XATTR), None);
    assert_eq!(get("d/ping", "trusted.overlay.redirect"), None);
    assert_eq!(get("d/ping", "security.selinux"), None);
    // Applied after the chown to 1000, which would otherwise have cleared it.
    assert_eq!(
        get("d/ping", "security.capability").as_deref(),
        Some(&CAP_NET_RAW[..])
    );
    assert_eq!(get("d/ping", "user.note").as_deref(), Some(&b"hello"[..]));
}

#[test]
fn pax_long_names_and_owner_records() {
    let long = format!("{}/{}", "d".repeat(150), "f".repeat(150));
    let t = TempDir::new("long");
    let dest = t.path("layer");
    let mut layer = Layer::new();
    // GNU long name (what the tar crate's builder writes for > 100 bytes).
    let mut h = Header::new_gnu();
    h.set_entry_type(EntryType::Regular);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_size(2);
    layer.0.append_data(&mut h, &long, &b"ok"[..]).unwrap();
    // PAX path and uid records override the header.
    layer.pax(&[
        ("path", b"pax/name/is/used"),
        ("uid", b"3000000"),
        ("mtime", b"1700000000.5"),
    ]);
    layer.file("ignored-header-name", 0o644, 5, b"p");
    unpack(&mut layer, &dest).unwrap();
    assert_eq!(fs::read(dest.join(&long)).unwrap(), b"ok");
    let m = fs::metadata(dest.join("pax/name/is/used")).unwrap();
    assert_eq!((m.uid(), m.gid(), m.mtime()), (3_000_000, 5, 1_700_000_000));
    assert!(!dest.join("ignored-header-name").exists());

    let too_long = "a/".repeat(2100) + "f";
    let mut layer = Layer::new();
    layer.pax(&[("path", too_long.as_bytes())]);
    layer.file("x", 0o644, 0, b"");
    let err = unpack(&mut layer, &t.path("layer2")).unwrap_err();
    assert!(
        matches!(err, OciError::PathTooLong { limit: 4096, .. }),
        "{err}"
    );
}

#[test]
fn later_entries_replace_earlier_ones() {
    let t = TempDir::new("replace");
    let dest = t.path("layer");
    unpack(
        Layer::new()
            .file("a", 0o644, 0, b"file")
            .dir("a/", 0o700, 0)
            .dir("b/", 0o755, 0)
            .file("b/inner", 0o644, 0, b"")
            .file("b", 0o600, 0, b"now a file")
            .dir("c/", 0o755, 0)
            .file("c/kept", 0o644, 0, b"")
            .dir("c/", 0o711, 1000)
            .symlink("s", "one")
            .symlink("s", "two")
            .file("f", 0o644, 0, b"old")
            .file("f", 0o644, 0, b"new"),
        &dest,
    )
    .unwrap();
    assert!(fs::symlink_metadata(dest.join("a")).unwrap().is_dir());
    assert_eq!(mode(&dest.join("a")), 0o700);
    assert_eq!(fs::read(dest.join("b")).unwrap(), b"now a file");
    assert!(
        dest.join("c/kept").exists(),
        "a directory over a directory merges"
    );
    assert_eq!(
        (mode(&dest.join("c")), owner(&dest.join("c"))),
        (0o711, (1000, 1000))
    );
    assert_eq!(fs::read_link(dest.join("s")).unwrap(), Path::new("two"));
    assert_eq!(fs::read(dest.join("f")).unwrap(), b"new");
}

/// A gzip layer whose PAX header claims (and holds) 64 MiB of zeros: a few hundred KiB as
/// sent. Before the headers were read raw, the tar crate buffered the whole header (a 285 KiB
/// layer made the server allocate 892 MB); now it is refused on its size, unread.
#[test]
fn a_huge_pax_header_is_refused_unread() {
    let t = TempDir::new("paxbomb");
    let blob = husk_core::tar_ext::fixtures::huge_pax_header_gzip(64 << 20);
    assert!(blob.len() < 1 << 20, "{} bytes", blob.len());
    let err = unpack_layer(&blob[..], GZIP, &t.path("layer")).unwrap_err();
    assert!(
        matches!(&err, OciError::Unpack { reason, .. } if reason.contains("PAX header larger than 65536 bytes")),
        "{err}"
    );
}
