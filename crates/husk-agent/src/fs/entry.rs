//! Describing file-system entries as the protocol's [`Entry`].

use std::ffi::{OsStr, OsString};
use std::fs::{File, Metadata};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use husk_proto::{Entry, FileType};

/// Prefix of the extended attributes that hold a file's client metadata (envd's convention).
pub(crate) const XATTR_PREFIX: &str = "user.e2b.";
/// At most this many metadata attributes are reported per entry.
const MAX_ATTRS: usize = 64;
/// Longer attribute values are skipped: uploads never store more than 4096 bytes in total.
const MAX_ATTR_VALUE: usize = 4096;
/// At most this many attributes are read per entry (skipped ones included), so a file with
/// thousands of odd attributes costs a bounded number of syscalls.
const MAX_ATTR_READS: usize = 2 * MAX_ATTRS;

/// The entry of `path`. A symlink is described as envd describes one: its own name, size,
/// permissions string and times, with the type and mode of what it points to (its final
/// target, all links followed) and that target's absolute path in `symlink_target`. A link
/// that leads nowhere (dangling, a loop) has no type (`Other`), mode 0, and itself as its
/// target. The agent runs inside the sandbox's root, so following links never leaves it.
pub(crate) fn entry_of(path: &Path) -> io::Result<Entry> {
    let meta = std::fs::symlink_metadata(path)?;
    let ft = meta.file_type();
    if ft.is_symlink() {
        let (target, target_meta) = match std::fs::canonicalize(path) {
            Ok(t) => {
                let m = std::fs::metadata(&t).ok();
                (t, m)
            }
            Err(_) => (path.to_owned(), None),
        };
        let mut entry = entry_from(path, &meta, Vec::new());
        entry.file_type = target_meta.as_ref().map_or(FileType::Other, file_type);
        entry.mode = target_meta.as_ref().map_or(0, |m| m.mode() & 0o7777);
        entry.symlink_target = Some(target.to_string_lossy().into_owned());
        return Ok(entry);
    }
    // Only files and directories carry client metadata; `user.*` attributes cannot be set
    // on special files, and asking a device node for them is pointless.
    let metadata = if ft.is_file() || ft.is_dir() {
        path_metadata(path)
    } else {
        Vec::new()
    };
    Ok(entry_from(path, &meta, metadata))
}

/// The entry of an open file, named `path` (for handles: the file may have been renamed or
/// unlinked since it was opened; the fd still describes it).
pub(crate) fn entry_of_file(path: &Path, file: &File) -> io::Result<Entry> {
    let meta = file.metadata()?;
    let metadata = collect_metadata(xattr::FileExt::list_xattr(file).ok(), |name| {
        xattr::FileExt::get_xattr(file, name)
    });
    Ok(entry_from(path, &meta, metadata))
}

/// Builds an entry from what was already read.
pub(crate) fn entry_from(path: &Path, meta: &Metadata, metadata: Vec<(String, String)>) -> Entry {
    let name = match path.file_name() {
        Some(n) => n.to_string_lossy().into_owned(),
        None => "/".to_owned(),
    };
    Entry {
        name,
        path: path.to_string_lossy().into_owned(),
        file_type: file_type(meta),
        size: meta.len(),
        mode: meta.mode() & 0o7777,
        permissions: permissions(meta.mode()),
        owner: id_name(meta.uid(), false),
        group: id_name(meta.gid(), true),
        mtime_secs: meta.mtime(),
        mtime_nanos: u32::try_from(meta.mtime_nsec().clamp(0, 999_999_999)).unwrap_or(0),
        symlink_target: None,
        metadata,
    }
}

/// A directory, a regular file, or anything else (a symlink's own metadata included).
fn file_type(meta: &Metadata) -> FileType {
    let ft = meta.file_type();
    if ft.is_dir() {
        FileType::Dir
    } else if ft.is_file() {
        FileType::File
    } else {
        FileType::Other
    }
}

/// The name of a uid or gid, as the sandbox's generated `/etc/passwd` and `/etc/group` name
/// them: `root` (0), `user` (1000), and the overflow id 65534 (`nobody`/`nogroup`) that host
/// files outside the sandbox's id range appear as. Those files are written by the sandbox
/// afterwards and are not to be parsed by PID 1, so any other id is reported as its number.
pub(crate) fn id_name(id: u32, group: bool) -> String {
    match (id, group) {
        (0, _) => "root".to_owned(),
        (1000, _) => "user".to_owned(),
        (65534, false) => "nobody".to_owned(),
        (65534, true) => "nogroup".to_owned(),
        (other, _) => other.to_string(),
    }
}

/// `ls -l`'s mode string: type letter, then rwx triplets with the setuid/setgid (`s`/`S`)
/// and sticky (`t`/`T`) letters in the execute positions.
pub(crate) fn permissions(mode: u32) -> String {
    let kind = match mode & libc::S_IFMT {
        libc::S_IFDIR => 'd',
        libc::S_IFLNK => 'l',
        libc::S_IFIFO => 'p',
        libc::S_IFSOCK => 's',
        libc::S_IFCHR => 'c',
        libc::S_IFBLK => 'b',
        _ => '-',
    };
    let mut s = String::with_capacity(10);
    s.push(kind);
    // (shift of the rwx triplet, its special bit, letter when executable, when not)
    let triplets = [
        (6, libc::S_ISUID, 's', 'S'),
        (3, libc::S_ISGID, 's', 'S'),
        (0, libc::S_ISVTX, 't', 'T'),
    ];
    for (shift, special, with_x, without_x) in triplets {
        let bits = (mode >> shift) & 0o7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        let x = bits & 1 != 0;
        s.push(match (mode & special != 0, x) {
            (true, true) => with_x,
            (true, false) => without_x,
            (false, true) => 'x',
            (false, false) => '-',
        });
    }
    s
}

/// The client metadata of `path` (not following a final symlink; callers only ask for
/// files and directories). Errors, e.g. a file system without user xattrs, mean none.
fn path_metadata(path: &Path) -> Vec<(String, String)> {
    collect_metadata(xattr::list(path).ok(), |name| xattr::get(path, name))
}

/// Picks the `user.e2b.*` attributes out of `names`, reading each with `get`: prefix
/// stripped, non-UTF-8 names and values and over-long values skipped, at most
/// [`MAX_ATTRS`] of them, sorted by key.
fn collect_metadata(
    names: Option<xattr::XAttrs>,
    mut get: impl FnMut(&OsStr) -> io::Result<Option<Vec<u8>>>,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let Some(names) = names else {
        return out;
    };
    let wanted = names.filter(|n: &OsString| n.as_bytes().starts_with(XATTR_PREFIX.as_bytes()));
    for name in wanted.take(MAX_ATTR_READS) {
        if out.len() >= MAX_ATTRS {
            break;
        }
        let Ok(key) = std::str::from_utf8(&name.as_bytes()[XATTR_PREFIX.len()..]) else {
            continue;
        };
        let Ok(Some(value)) = get(&name) else {
            continue;
        };
        if value.len() > MAX_ATTR_VALUE {
            continue;
        }
        if let Ok(value) = String::from_utf8(value) {
            out.push((key.to_owned(), value));
        }
    }
    out.sort();
    out
}

/// An upper bound of the encoded (postcard) size of `e`: every string costs at most a 5-byte
/// length plus its bytes, every number at most 10 bytes. Lets a listing stop before its reply
/// could exceed one frame (an over-large reply could not be sent at all).
pub(crate) fn encoded_size_bound(e: &Entry) -> usize {
    let s = |x: &str| 5 + x.len();
    let strings = s(&e.name)
        + s(&e.path)
        + s(&e.permissions)
        + s(&e.owner)
        + s(&e.group)
        + e.symlink_target.as_deref().map_or(0, s);
    let metadata: usize = e.metadata.iter().map(|(k, v)| s(k) + s(v)).sum();
    // type, size, mode, mtime (2), option tag, metadata length: 7 fields of ≤ 10 bytes.
    strings + metadata + 70
}
