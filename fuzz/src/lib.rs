//! Helpers shared by husk's fuzz targets (`fuzz_targets/`): cutting one input into the
//! fields and chunk sizes a target needs, a current-thread tokio runtime per process, and
//! scratch directories for the targets that unpack archives.
//!
//! The archive targets run as root. So that a path-escape bug in an unpacker fails the target
//! instead of writing to the host, [`Scratch`] first moves the process into a private mount
//! namespace where every file system is read-only except a fresh tmpfs for the scratch
//! directories and the few directories libFuzzer writes to (its corpus and artifact
//! directories, `TMPDIR`): a write anywhere else fails with `EROFS`, which the targets treat
//! as a finding, and [`Arena`] checks that nothing beside the destination changed.

use std::ffi::CString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

pub use arbitrary::Unstructured;

/// A byte from the input, or 0 once it is used up.
pub fn byte(u: &mut Unstructured<'_>) -> u8 {
    u.arbitrary().unwrap_or(0)
}

/// A length-prefixed field of at most `max` bytes (one byte of length, scaled to `max`).
pub fn field<'a>(u: &mut Unstructured<'a>, max: usize) -> &'a [u8] {
    let want = usize::from(byte(u)) * max / 255;
    u.bytes(want.min(u.len())).unwrap_or(&[])
}

/// [`field`] as text (lossy), for header values and names.
pub fn text(u: &mut Unstructured<'_>, max: usize) -> String {
    String::from_utf8_lossy(field(u, max)).into_owned()
}

/// Cuts `data` into chunks whose sizes come from `seed` (1 to `max` bytes each), to feed
/// incremental decoders the way a network delivers bytes.
pub fn chunks(data: &[u8], seed: u64, max: usize) -> Vec<&[u8]> {
    let mut rng = seed | 1;
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        // xorshift64: cheap, and a pure function of the input, so crashes reproduce.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let n = (1 + (rng % max as u64) as usize).min(rest.len());
        let (head, tail) = rest.split_at(n);
        out.push(head);
        rest = tail;
    }
    out
}

/// One current-thread tokio runtime per fuzzing process (building one per input would cost
/// more than most inputs).
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime")
    })
}

/// A fresh directory for one input, removed when dropped.
pub struct Scratch {
    pub path: PathBuf,
}

impl Scratch {
    /// A new empty directory under the process's scratch root.
    pub fn new() -> Scratch {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let path = scratch_root().join(format!("in-{}", SEQ.fetch_add(1, Ordering::Relaxed)));
        fs::create_dir(&path).expect("a scratch directory");
        Scratch { path }
    }
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch::new()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Unpackers make read-only directories; open them up so everything can be removed.
        make_writable(&self.path);
        let _ = fs::remove_dir_all(&self.path);
    }
}

fn make_writable(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o700));
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                make_writable(&e.path());
            }
        }
    }
}

/// Whether an error chain says a write hit a read-only file system: under the confinement
/// that is a write outside the scratch directory. Only the errno counts, never the text (an
/// entry's name is in the messages, and the fuzzer learns to write "os error 30" there).
pub fn is_erofs(err: &(dyn std::error::Error + 'static)) -> bool {
    fn erofs(io: &io::Error) -> bool {
        io.raw_os_error() == Some(husk_runtime::libc::EROFS)
            || io
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<io::Error>())
                .is_some_and(erofs)
    }
    let mut cur = Some(err);
    while let Some(e) = cur {
        if e.downcast_ref::<io::Error>().is_some_and(erofs) {
            return true;
        }
        cur = e.source();
    }
    false
}

/// Where [`Scratch`] directories go: a private tmpfs, after [`confine`], when the process can
/// be confined (as root); else a plain directory under the system's temporary directory.
fn scratch_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("husk-fuzz-{}", std::process::id()));
        fs::create_dir_all(&root).expect("a scratch root");
        if let Err(e) = confine(&root) {
            eprintln!(
                "husk-fuzz: not confined ({e}): a path escape is caught only next to the \
                 scratch directory"
            );
        }
        root
    })
}

fn cstr(p: &Path) -> CString {
    use std::os::unix::ffi::OsStrExt;
    CString::new(p.as_os_str().as_bytes()).expect("a path without NUL")
}

/// The directories libFuzzer writes to, from its command line: corpus directories (new inputs
/// are saved there), the artifact prefix's (crashes), and the temporary directory (`-merge`
/// and `-fork` keep their files there).
fn fuzzer_output_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![std::env::temp_dir()];
    for arg in std::env::args().skip(1) {
        if let Some(prefix) = arg.strip_prefix("-artifact_prefix=") {
            // A prefix ending in `/` is a directory; otherwise it starts the file names.
            let p = Path::new(prefix);
            dirs.push(
                if prefix.ends_with('/') {
                    p
                } else {
                    p.parent().unwrap_or(p)
                }
                .into(),
            );
        } else if let Some(path) = arg.strip_prefix("-exact_artifact_path=") {
            dirs.extend(Path::new(path).parent().map(Path::to_path_buf));
        } else if !arg.starts_with('-') && Path::new(&arg).is_dir() {
            dirs.push(PathBuf::from(arg));
        }
    }
    dirs.iter()
        .map(|d| {
            if d.as_os_str().is_empty() {
                Path::new(".")
            } else {
                d
            }
        })
        .filter_map(|d| fs::canonicalize(d).ok())
        .collect()
}

/// Enters a private mount namespace in which every mount is read-only except a new tmpfs on
/// `scratch` and the directories libFuzzer writes to. Only root can. The host's mounts are
/// never changed: each remount is `MS_BIND` (a flag of this namespace's copy of the mount),
/// and the namespace ends with the process. Once the namespace exists, a failure panics: a
/// half-confined process would mislead.
fn confine(scratch: &Path) -> io::Result<()> {
    use husk_runtime::libc;
    use husk_runtime::sys::{mount, unshare};
    let writable = fuzzer_output_dirs();
    let info = fs::read_to_string("/proc/self/mountinfo")?;
    unshare(libc::CLONE_NEWNS)?;
    let must = |what: &str, r: io::Result<()>| {
        if let Err(e) = r {
            panic!("husk-fuzz: confining the process: {what}: {e}");
        }
    };
    must(
        "private mounts",
        mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None),
    );
    for line in info.lines() {
        let mut fields = line.split(' ');
        let (Some(point), Some(opts)) = (fields.nth(4), fields.next()) else {
            continue;
        };
        // A bind remount must keep the flags the mount has, or the kernel may refuse it.
        let mut flags = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY;
        for (name, flag) in [
            ("nosuid", libc::MS_NOSUID),
            ("nodev", libc::MS_NODEV),
            ("noexec", libc::MS_NOEXEC),
        ] {
            if opts.split(',').any(|o| o == name) {
                flags |= flag;
            }
        }
        let point = PathBuf::from(husk_runtime::mountinfo::unescape(point));
        let done = mount(None, &cstr(&point), None, flags, None);
        // The root must be read-only for the confinement to mean anything; a special mount
        // beneath it may refuse, which matters less.
        if point == Path::new("/") {
            must("read-only root", done);
        }
    }
    for dir in &writable {
        let d = cstr(dir);
        must("bind", mount(Some(&d), &d, None, libc::MS_BIND, None));
        must(
            "writable bind",
            mount(None, &d, None, libc::MS_REMOUNT | libc::MS_BIND, None),
        );
    }
    let s = cstr(scratch);
    let tmpfs = mount(
        Some(c"husk-fuzz"),
        &s,
        Some(c"tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(c"size=512m,mode=0700"),
    );
    must("scratch tmpfs", tmpfs);
    Ok(())
}

/// A scratch directory laid out for an unpacker: an empty `dest` to unpack into, and beside
/// it `outside/` holding one file, which nothing may touch.
pub struct Arena {
    pub scratch: Scratch,
    pub dest: PathBuf,
}

/// What the file outside an [`Arena`]'s destination holds.
pub const SENTINEL: &[u8] = b"nothing may write here";

impl Arena {
    pub fn new() -> Arena {
        let scratch = Scratch::new();
        let dest = scratch.path.join("dest");
        fs::create_dir(&dest).expect("dest");
        fs::create_dir(scratch.path.join("outside")).expect("outside");
        fs::write(scratch.path.join("outside/file"), SENTINEL).expect("sentinel");
        Arena { scratch, dest }
    }

    /// Panics if anything beside `dest` changed.
    pub fn check_contained(&self) {
        let mut names: Vec<_> = fs::read_dir(&self.scratch.path)
            .expect("scratch")
            .map(|e| e.expect("entry").file_name())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["dest", "outside"],
            "something was made beside the destination"
        );
        let outside: Vec<_> = fs::read_dir(self.scratch.path.join("outside"))
            .expect("outside")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(
            outside,
            ["file"],
            "something was made outside the destination"
        );
        let meta = fs::symlink_metadata(self.scratch.path.join("outside/file")).expect("file");
        assert!(meta.is_file(), "the file outside was replaced");
        assert_eq!(
            fs::read(self.scratch.path.join("outside/file")).unwrap(),
            SENTINEL
        );
    }
}

impl Default for Arena {
    fn default() -> Self {
        Arena::new()
    }
}

/// Every entry under `dir` (not following symlinks), with its metadata.
pub fn walk(dir: &Path) -> Vec<(PathBuf, fs::Metadata)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).expect("a directory the unpacker made") {
            let p = e.expect("an entry").path();
            let m = fs::symlink_metadata(&p).expect("lstat");
            if m.is_dir() {
                stack.push(p.clone());
            }
            out.push((p, m));
        }
    }
    out
}

/// Asserts that every hard-linked file under `dir` has all its names under `dir`: nothing
/// was linked to a file elsewhere.
pub fn check_links_inside(entries: &[(PathBuf, fs::Metadata)]) {
    use std::collections::HashMap;
    use std::os::unix::fs::MetadataExt;
    let mut names: HashMap<u64, u64> = HashMap::new();
    for (_, m) in entries.iter().filter(|(_, m)| m.is_file()) {
        *names.entry(m.ino()).or_default() += 1;
    }
    for (p, m) in entries.iter().filter(|(_, m)| m.is_file()) {
        assert_eq!(
            m.nlink(),
            names[&m.ino()],
            "{} is linked from elsewhere",
            p.display()
        );
    }
}

/// Recomputes the checksum of every header block of a raw tar stream (following the sizes
/// the headers give), so that mutated archives are read past their headers instead of being
/// refused at the first byte the fuzzer changed.
pub fn fix_tar_checksums(tar: &mut [u8]) {
    let mut pos = 0;
    while pos + 512 <= tar.len() {
        let block = &mut tar[pos..pos + 512];
        if block.iter().all(|&b| b == 0) {
            pos += 512;
            continue;
        }
        block[148..156].fill(b' ');
        let sum: u32 = block.iter().map(|&b| u32::from(b)).sum();
        let text = format!("{sum:06o}\0 ");
        block[148..156].copy_from_slice(&text.as_bytes()[..8]);
        let size = std::str::from_utf8(&block[124..136])
            .ok()
            .and_then(|s| u64::from_str_radix(s.trim_matches(|c| c == ' ' || c == '\0'), 8).ok())
            .unwrap_or(0);
        let data = size.div_ceil(512).saturating_mul(512);
        pos = pos
            .saturating_add(512)
            .saturating_add(usize::try_from(data).unwrap_or(usize::MAX));
    }
}

/// Path components an archive is made of: ordinary names, the ones unpackers must refuse or
/// handle specially, and names of what lies beside the destination.
const COMPONENTS: &[&[u8]] = &[
    b"a",
    b"b",
    b"c",
    b".",
    b"..",
    b"",
    b"dest",
    b"outside",
    b"file",
    b".wh.a",
    b".wh..wh..opq",
    b".wh..wh.x",
    b"a\0b",
    b"/",
    b"~",
    b"\xff",
];

fn path(u: &mut Unstructured<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    if byte(u).is_multiple_of(8) {
        out.push(b'/');
    }
    for i in 0..1 + byte(u) % 4 {
        if i > 0 {
            out.push(b'/');
        }
        match byte(u) {
            250..=255 => out.extend(std::iter::repeat_n(b'n', 60 + usize::from(byte(u)))),
            b => out.extend_from_slice(COMPONENTS[usize::from(b) % COMPONENTS.len()]),
        }
    }
    if byte(u).is_multiple_of(8) {
        out.push(b'/');
    }
    out
}

fn octal(field: &mut [u8], value: u64) {
    let text = format!("{value:0width$o}", width = field.len() - 1);
    let bytes = text.as_bytes();
    let n = bytes.len().min(field.len() - 1);
    field[..n].copy_from_slice(&bytes[bytes.len() - n..]);
    field[field.len() - 1] = 0;
}

/// One raw 512-byte ustar header: the name and link name are written as given (the tar
/// crate's setters refuse `..`, which is what an unpacker must see).
fn header(kind: u8, name: &[u8], link: &[u8], size: u64, mode: u32) -> [u8; 512] {
    let mut h = [0u8; 512];
    h[..name.len().min(100)].copy_from_slice(&name[..name.len().min(100)]);
    octal(&mut h[100..108], u64::from(mode));
    octal(&mut h[108..116], 1000);
    octal(&mut h[116..124], 1000);
    octal(&mut h[124..136], size);
    octal(&mut h[136..148], 1_700_000_000);
    h[156] = kind;
    h[157..157 + link.len().min(100)].copy_from_slice(&link[..link.len().min(100)]);
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h
}

fn push_entry(out: &mut Vec<u8>, h: [u8; 512], data: &[u8]) {
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
}

/// A PAX record `len key=value\n`.
fn pax(key: &[u8], value: &[u8]) -> Vec<u8> {
    let body = [b" ", key, b"=", value, b"\n"].concat();
    let mut len = body.len() + 1;
    while format!("{len}").len() + body.len() != len {
        len = format!("{len}").len() + body.len();
    }
    [format!("{len}").as_bytes(), &body].concat()
}

/// A tar archive built from the input: valid headers (checksums right) around hostile paths,
/// link targets, types, sizes, GNU long names and PAX records.
pub fn build_tar(u: &mut Unstructured<'_>) -> Vec<u8> {
    const KINDS: &[u8] = b"0000555221113467LKxgS7\x00Z";
    let mut out = Vec::new();
    for _ in 0..byte(u) % 12 {
        let kind = KINDS[usize::from(byte(u)) % KINDS.len()];
        let name = path(u);
        let link = path(u);
        let mode = [0o644, 0o755, 0o4755, 0o7777, 0o000, 0o555][usize::from(byte(u)) % 6];
        match byte(u) % 8 {
            // Long names and links, as GNU tar writes them.
            0 => {
                let long = [&name[..], &[b'/'; 1][..], &[b'l'; 120][..]].concat();
                push_entry(
                    &mut out,
                    header(b'L', b"././@LongLink", b"", long.len() as u64 + 1, 0),
                    &[long, vec![0]].concat(),
                );
            }
            1 => push_entry(
                &mut out,
                header(b'K', b"././@LongLink", b"", link.len() as u64 + 1, 0),
                &[link.clone(), vec![0]].concat(),
            ),
            // PAX records that override what the header says.
            2 => {
                let keys: [&[u8]; 6] = [
                    b"path",
                    b"linkpath",
                    b"mtime",
                    b"size",
                    b"GNU.sparse.size",
                    b"SCHILY.xattr.user.x",
                ];
                let records: Vec<u8> = (0..1 + byte(u) % 3)
                    .flat_map(|_| {
                        let k = keys[usize::from(byte(u)) % keys.len()];
                        let v = if k == b"size" || k == b"mtime" {
                            format!("{}", byte(u)).into_bytes()
                        } else {
                            path(u)
                        };
                        pax(k, &v)
                    })
                    .collect();
                push_entry(
                    &mut out,
                    header(b'x', b"pax", b"", records.len() as u64, 0),
                    &records,
                );
            }
            _ => {}
        }
        let data = field(u, 600).to_vec();
        // A header may claim more or less than follows (the reader must notice).
        let size = match byte(u) % 16 {
            0 => data.len() as u64 + u64::from(byte(u)),
            1 => (1 << 33) - 1,
            _ => data.len() as u64,
        };
        let has_data = matches!(kind, b'0' | b'7' | b'\0' | b'S');
        let size = if has_data { size } else { 0 };
        push_entry(
            &mut out,
            header(kind, &name, &link, size, mode),
            if has_data { &data } else { &[] },
        );
    }
    fix_tar_checksums(&mut out);
    if !byte(u).is_multiple_of(4) {
        out.extend_from_slice(&[0; 1024]);
    }
    out
}

/// A raw archive from the input, header checksums repaired (not when it is gzip: the
/// importers detect that themselves, and repairing would break the stream).
pub fn raw_tar(bytes: &[u8]) -> Vec<u8> {
    let mut raw = bytes.to_vec();
    if !raw.starts_with(&[0x1f, 0x8b]) {
        fix_tar_checksums(&mut raw);
    }
    raw
}
