//! Pull and export against a real registry: Debian's `docker-registry` (the CNCF distribution
//! registry) on 127.0.0.1, one per test, with its storage in a temporary directory. Runs as
//! root (owners and whiteouts). No traffic leaves the machine.

mod common;

use common::TempDir;
use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use husk_build::oci::{
    export, pull, ExportTarget, ImageConfig, OciError, PullProgress, RegistryOptions,
};
use husk_runtime::layerfs::{is_whiteout, make_whiteout, OPAQUE_XATTR};
use oci_client::client::{Config, ImageLayer};
use oci_client::manifest::OciImageIndex;
use oci_client::secrets::RegistryAuth;
use sha2::{Digest, Sha256};

const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

/// A running registry; killed (and its storage removed) on drop, also when a test panics.
struct Registry {
    child: Child,
    addr: String,
    dir: TempDir,
}

impl Registry {
    fn start() -> Registry {
        assert!(
            Path::new(REGISTRY_BIN).exists(),
            "{REGISTRY_BIN} is missing: run the project's test setup (scripts/test), which \
             installs Debian's docker-registry package (apt-get install docker-registry)"
        );
        // Port 0 picks a free port; in the window before the registry binds it another
        // process (a parallel test) can take it, so a start that loses that race is tried
        // again on another port.
        let mut attempts = 0;
        loop {
            attempts += 1;
            let dir = TempDir::new("storage");
            let port = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let addr = format!("127.0.0.1:{port}");
            let config = format!(
                "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    \
                 rootdirectory: {}\nhttp:\n  addr: {addr}\n",
                dir.path("data").display()
            );
            fs::write(dir.path("config.yml"), config).unwrap();
            let child = Command::new(REGISTRY_BIN)
                .arg("serve")
                .arg(dir.path("config.yml"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(fs::File::create(dir.path("registry.log")).unwrap())
                .spawn()
                .unwrap();
            let mut registry = Registry { child, addr, dir };
            match registry.wait_ready() {
                Ok(()) => return registry,
                Err(log) if log.contains("address already in use") && attempts < 5 => {}
                Err(log) => panic!("docker-registry exited early:\n{log}"),
            }
        }
    }

    /// Polls `GET /v2/` until it answers 200; the registry's log if it exited.
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let log = fs::read_to_string(self.dir.path("registry.log")).unwrap_or_default();
                return Err(format!("({status}) {log}"));
            }
            if let Ok(mut s) = TcpStream::connect(&self.addr) {
                let req = format!("GET /v2/ HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr);
                let mut resp = String::new();
                if s.write_all(req.as_bytes()).is_ok()
                    && s.read_to_string(&mut resp).is_ok()
                    && resp.starts_with("HTTP/1.")
                    && resp.split(' ').nth(1) == Some("200")
                {
                    return Ok(());
                }
            }
            assert!(
                Instant::now() < deadline,
                "docker-registry did not come up on {}",
                self.addr
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn reference(&self, repo_tag: &str) -> String {
        format!("{}/{repo_tag}", self.addr)
    }

    /// A blob's file in the registry's storage (for corrupting it).
    fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.dir.path(&format!(
            "data/docker/registry/v2/blobs/sha256/{}/{hex}/data",
            &hex[..2]
        ))
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sha256(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// Records every progress report.
#[derive(Default)]
struct Progress(Mutex<Vec<PullProgress>>);

impl Progress {
    fn report(&self) -> impl Fn(PullProgress) + Send + Sync + '_ {
        |p| self.0.lock().unwrap().push(p)
    }
}

fn chown(p: &Path, id: u32) {
    std::os::unix::fs::lchown(p, Some(id), Some(id)).unwrap();
}

/// A small root file system with the kinds of entries a layer carries.
fn make_rootfs(root: &Path) {
    fs::create_dir_all(root.join("app/data")).unwrap();
    fs::create_dir_all(root.join("etc")).unwrap();
    fs::write(root.join("app/hello.sh"), "#!/bin/sh\necho hello\n").unwrap();
    fs::set_permissions(root.join("app/hello.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::hard_link(root.join("app/hello.sh"), root.join("app/hello-again.sh")).unwrap();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    fs::write(root.join("app/data/big.bin"), big).unwrap();
    fs::write(root.join("app/data/").join("n".repeat(180)), "long name").unwrap();
    fs::write(root.join("etc/conf"), "k = v\n").unwrap();
    fs::set_permissions(root.join("etc/conf"), fs::Permissions::from_mode(0o640)).unwrap();
    fs::set_permissions(root.join("app/data"), fs::Permissions::from_mode(0o750)).unwrap();
    symlink("../etc/conf", root.join("app/conf-link")).unwrap();
    symlink("/etc/conf", root.join("abs-link")).unwrap();
    // A whiteout has no place in a merged root; export must leave it out.
    make_whiteout(&root.join("stray-whiteout")).unwrap();
    for p in [
        "app",
        "app/hello.sh",
        "app/data",
        "app/data/big.bin",
        "app/conf-link",
    ] {
        chown(&root.join(p), 1000);
    }
}

/// One snapshot entry: kind (`d`, `l`, `f`), mode, uid, gid, content or link target, and the
/// mtime of files.
type Node = (char, u32, u32, u32, Vec<u8>, i64);

/// Every path below `root` but `skip`, as [`Node`]s.
fn snapshot(root: &Path, skip: &[&str]) -> BTreeMap<String, Node> {
    let mut out = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for entry in fs::read_dir(root.join(&rel)).unwrap() {
            let child = rel.join(entry.unwrap().file_name());
            let key = child.to_string_lossy().into_owned();
            if skip.contains(&key.as_str()) {
                continue;
            }
            let path = root.join(&child);
            let m = fs::symlink_metadata(&path).unwrap();
            let (kind, data, mtime) = if m.is_dir() {
                stack.push(child.clone());
                ('d', Vec::new(), 0)
            } else if m.file_type().is_symlink() {
                let target = fs::read_link(&path).unwrap();
                ('l', target.into_os_string().into_encoded_bytes(), 0)
            } else {
                ('f', fs::read(&path).unwrap(), m.mtime())
            };
            out.insert(
                key,
                (kind, m.mode() & 0o7777, m.uid(), m.gid(), data, mtime),
            );
        }
    }
    out
}

fn image_config() -> ImageConfig {
    ImageConfig {
        env: vec![
            ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
            ("GREETING".into(), "a=b".into()),
        ],
        user: Some("1000:1000".into()),
        workdir: Some("/app".into()),
        cmd: vec!["/app/hello.sh".into()],
        entrypoint: vec![],
        labels: BTreeMap::from([("org.example.kind".into(), "test".into())]),
    }
}

#[tokio::test]
async fn export_push_pull_round_trip_and_layout() {
    let registry = Registry::start();
    let t = TempDir::new("roundtrip");
    let rootfs = t.path("rootfs");
    make_rootfs(&rootfs);
    let opts = RegistryOptions::default();
    let reference = registry.reference("husk/test:v1");
    let annotations = BTreeMap::from([("org.opencontainers.image.title".into(), "t".into())]);

    let pushed = export(
        &rootfs,
        &image_config(),
        &annotations,
        &ExportTarget::Push(reference.clone()),
        &opts,
    )
    .await
    .unwrap();

    let layers_root = t.path("layers");
    let progress = Progress::default();
    let image = pull(&reference, &layers_root, &opts, &progress.report())
        .await
        .unwrap();
    assert_eq!(image.reference, reference);
    assert_eq!(image.manifest_digest, pushed.manifest_digest);
    assert_eq!(image.layers.len(), 1);
    let layer = &image.layers[0];
    assert_eq!(layer.digest, pushed.layer_digest);
    assert!(!layer.cached);
    assert_eq!(layer.dir, layers_root.join(&layer.key));
    assert_eq!(image.config, image_config());

    // The unpacked layer is the root file system, less what a layer does not carry.
    let original = snapshot(&rootfs, &["stray-whiteout"]);
    assert_eq!(snapshot(&layer.dir, &[]), original);
    let ino = |p: &str| fs::metadata(layer.dir.join(p)).unwrap().ino();
    assert_eq!(
        ino("app/hello.sh"),
        ino("app/hello-again.sh"),
        "hard link kept"
    );
    assert!(fs::symlink_metadata(layer.dir.join("stray-whiteout")).is_err());
    // Only the finished layer is in the cache: no temporary directories left behind.
    let names: Vec<_> = fs::read_dir(&layers_root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, [layer.key.as_str()]);

    let events = progress.0.lock().unwrap().clone();
    assert!(
        matches!(events[0], PullProgress::Resolved { layers: 1, .. }),
        "{events:?}"
    );
    assert!(events.iter().any(
        |e| matches!(e, PullProgress::Layer { bytes_done, bytes_total, .. }
            if bytes_done == bytes_total && *bytes_total == pushed.layer_bytes)
    ));
    assert_eq!(events.last(), Some(&PullProgress::LayerDone { index: 0 }));

    // Again: every layer is a cache hit.
    let progress = Progress::default();
    let again = pull(&reference, &layers_root, &opts, &progress.report())
        .await
        .unwrap();
    assert!(again.layers.iter().all(|l| l.cached));
    assert!(progress
        .0
        .lock()
        .unwrap()
        .iter()
        .any(|e| matches!(e, PullProgress::LayerCached { .. })));

    // The same root as an OCI image layout tar.
    let layout = t.path("out/image.tar");
    fs::create_dir_all(layout.parent().unwrap()).unwrap();
    let written = export(
        &rootfs,
        &image_config(),
        &annotations,
        &ExportTarget::Layout(layout.clone()),
        &opts,
    )
    .await
    .unwrap();
    let mut files = HashMap::new();
    let mut archive = tar::Archive::new(fs::File::open(&layout).unwrap());
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let name = entry.path().unwrap().to_string_lossy().into_owned();
        let mut data = Vec::new();
        entry.read_to_end(&mut data).unwrap();
        files.insert(name, data);
    }
    let layout_json: serde_json::Value = serde_json::from_slice(&files["oci-layout"]).unwrap();
    assert_eq!(layout_json["imageLayoutVersion"], "1.0.0");
    let index: serde_json::Value = serde_json::from_slice(&files["index.json"]).unwrap();
    let entry = &index["manifests"][0];
    assert_eq!(entry["digest"], written.manifest_digest.as_str());
    assert_eq!(
        entry["annotations"]["org.opencontainers.image.ref.name"],
        "latest"
    );
    let mut blobs = 0;
    for (name, data) in &files {
        if let Some(hex) = name.strip_prefix("blobs/sha256/").filter(|h| !h.is_empty()) {
            assert_eq!(sha256(data), hex, "{name}");
            blobs += 1;
        }
    }
    assert_eq!(blobs, 3, "layer, config and manifest");
    let manifest_hex = written.manifest_digest.strip_prefix("sha256:").unwrap();
    let manifest: serde_json::Value =
        serde_json::from_slice(&files[&format!("blobs/sha256/{manifest_hex}")]).unwrap();
    assert_eq!(
        manifest["layers"][0]["digest"],
        written.layer_digest.as_str()
    );
    assert_eq!(
        manifest["annotations"]["org.opencontainers.image.title"],
        "t"
    );
    assert_eq!(
        written.layer_digest, pushed.layer_digest,
        "the layer is deterministic"
    );
    // Only the layout is left next to it: the temporary layer file is gone.
    assert_eq!(fs::read_dir(layout.parent().unwrap()).unwrap().count(), 1);
}

fn tar_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_size(data.len() as u64);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, name, *data).unwrap();
    }
    b.into_inner().unwrap()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(data).unwrap();
    gz.finish().unwrap()
}

/// Pushes an image made of `layers` (data, media type) by hand, as another tool would.
async fn push_layers(registry: &Registry, reference: &str, layers: Vec<(Vec<u8>, &str)>) {
    let client = oci_client::Client::new(oci_client::client::ClientConfig {
        protocol: oci_client::client::ClientProtocol::Http,
        ..Default::default()
    });
    let diff_ids: Vec<String> = layers
        .iter()
        .map(|(d, _)| format!("sha256:{}", sha256(d)))
        .collect();
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": { "Env": ["FROM_HAND=1"] },
        "rootfs": { "type": "layers", "diff_ids": diff_ids },
    });
    let layers: Vec<ImageLayer> = layers
        .into_iter()
        .map(|(d, mt)| ImageLayer::new(d, mt.to_string(), None))
        .collect();
    let r: oci_client::Reference = reference.parse().unwrap();
    assert!(reference.starts_with(&registry.addr));
    client
        .push(
            &r,
            &layers,
            Config::oci_v1(config.to_string().into_bytes(), None),
            &RegistryAuth::Anonymous,
            None,
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn multi_layer_image_with_whiteouts() {
    let registry = Registry::start();
    let reference = registry.reference("husk/layers:two");
    let lower = tar_of(&[("keep/a", b"a"), ("gone/file", b"bye"), ("opq/old", b"old")]);
    let upper = tar_of(&[
        ("gone/.wh.file", b""),
        ("opq/.wh..wh..opq", b""),
        ("opq/new", b"new"),
    ]);
    push_layers(
        &registry,
        &reference,
        vec![
            (gzip(&lower), "application/vnd.oci.image.layer.v1.tar+gzip"),
            (
                zstd::encode_all(&upper[..], 3).unwrap(),
                "application/vnd.oci.image.layer.v1.tar+zstd",
            ),
        ],
    )
    .await;

    let t = TempDir::new("layers");
    let image = pull(
        &reference,
        &t.path("layers"),
        &RegistryOptions::default(),
        &|_| {},
    )
    .await
    .unwrap();
    assert_eq!(image.layers.len(), 2);
    assert_eq!(
        image.config.env,
        [("FROM_HAND".to_string(), "1".to_string())]
    );
    let (l1, l2) = (&image.layers[0].dir, &image.layers[1].dir);
    assert_eq!(fs::read(l1.join("gone/file")).unwrap(), b"bye");
    assert_eq!(fs::read(l1.join("keep/a")).unwrap(), b"a");
    assert!(is_whiteout(
        &fs::symlink_metadata(l2.join("gone/file")).unwrap()
    ));
    assert_eq!(
        xattr::get(l2.join("opq"), OPAQUE_XATTR).unwrap().as_deref(),
        Some(&b"y"[..])
    );
    assert_eq!(fs::read(l2.join("opq/new")).unwrap(), b"new");
    assert!(!l2.join("keep").exists());
}

#[tokio::test]
async fn multi_arch_index_resolves_to_linux_amd64() {
    let registry = Registry::start();
    let amd64 = registry.reference("husk/multi:amd64");
    let arm64 = registry.reference("husk/multi:arm64");
    push_layers(
        &registry,
        &amd64,
        vec![(
            tar_of(&[("arch", b"amd64")]),
            "application/vnd.oci.image.layer.v1.tar",
        )],
    )
    .await;
    push_layers(
        &registry,
        &arm64,
        vec![(
            tar_of(&[("arch", b"arm64")]),
            "application/vnd.oci.image.layer.v1.tar",
        )],
    )
    .await;
    let opts = RegistryOptions::default();
    let t = TempDir::new("index");
    let amd64_digest = pull(&amd64, &t.path("l"), &opts, &|_| {})
        .await
        .unwrap()
        .manifest_digest;
    let arm64_digest = pull(&arm64, &t.path("l"), &opts, &|_| {})
        .await
        .unwrap()
        .manifest_digest;

    let client = oci_client::Client::new(oci_client::client::ClientConfig {
        protocol: oci_client::client::ClientProtocol::Http,
        ..Default::default()
    });
    let entry = |digest: &str, arch: &str| {
        serde_json::json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest, "size": 0,
            "platform": { "architecture": arch, "os": "linux" },
        })
    };
    let push_index = |tag: &str, entries: Vec<serde_json::Value>| {
        let index: OciImageIndex = serde_json::from_value(serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": entries,
        }))
        .unwrap();
        let r: oci_client::Reference = registry.reference(tag).parse().unwrap();
        let client = client.clone();
        async move {
            client
                .push_manifest_list(&r, &RegistryAuth::Anonymous, index)
                .await
                .unwrap();
        }
    };
    push_index(
        "husk/multi:both",
        vec![entry(&arm64_digest, "arm64"), entry(&amd64_digest, "amd64")],
    )
    .await;
    push_index("husk/multi:armonly", vec![entry(&arm64_digest, "arm64")]).await;

    let image = pull(
        &registry.reference("husk/multi:both"),
        &t.path("l"),
        &opts,
        &|_| {},
    )
    .await
    .unwrap();
    assert_eq!(image.manifest_digest, amd64_digest);
    assert_eq!(
        fs::read(image.layers[0].dir.join("arch")).unwrap(),
        b"amd64"
    );

    let armonly = registry.reference("husk/multi:armonly");
    let err = pull(&armonly, &t.path("l"), &opts, &|_| {})
        .await
        .unwrap_err();
    assert!(
        matches!(&err, OciError::NoLinuxAmd64 { reference } if *reference == armonly),
        "{err}"
    );
}

#[tokio::test]
async fn missing_tag_is_not_found_and_corrupt_blob_is_refused() {
    let registry = Registry::start();
    let t = TempDir::new("errors");
    let opts = RegistryOptions::default();
    let missing = registry.reference("husk/test:nope");
    let err = pull(&missing, &t.path("layers"), &opts, &|_| {})
        .await
        .unwrap_err();
    assert!(
        matches!(&err, OciError::ManifestNotFound { reference } if *reference == missing),
        "{err:?}"
    );
    assert_eq!(err.to_string(), format!("image {missing} not found"));

    // Nothing listens here: unreachable, naming the registry.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let nowhere = format!("127.0.0.1:{port}/husk/test:v1");
    let err = pull(&nowhere, &t.path("layers"), &opts, &|_| {})
        .await
        .unwrap_err();
    assert!(
        matches!(err, OciError::RegistryUnreachable { .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );

    // A layer whose bytes no longer match its digest is never unpacked into the cache.
    let reference = registry.reference("husk/corrupt:v1");
    let layer = gzip(&tar_of(&[("f", &[1u8; 10_000])]));
    let digest = format!("sha256:{}", sha256(&layer));
    push_layers(
        &registry,
        &reference,
        vec![(layer, "application/vnd.oci.image.layer.v1.tar+gzip")],
    )
    .await;
    let blob = registry.blob_file(&digest);
    let mut data = fs::read(&blob).unwrap();
    let middle = data.len() / 2;
    data[middle] ^= 0xff; // breaks the deflate stream: the unpacker fails before the digest check
    fs::write(&blob, &data).unwrap();
    let layers_root = t.path("corrupt-layers");
    let err = pull(&reference, &layers_root, &opts, &|_| {})
        .await
        .unwrap_err();
    assert!(
        matches!(&err, OciError::DigestMismatch { expected, .. } if *expected == digest),
        "{err:?}"
    );
    assert_eq!(
        fs::read_dir(&layers_root).unwrap().count(),
        0,
        "no cache entry, no temp dir"
    );
}
