//! Tar archives into and out of a tree. Import reads the archive's headers raw (GNU long
//! names and PAX records are handled here, each bounded, instead of being read whole by the
//! tar crate), unpacks into a temporary directory and merges it into place; export walks the
//! tree without following anything.

use std::borrow::Cow;
use std::cell::Cell;
use std::ffi::{CStr, CString, OsStr};
use std::fs::{File, FileTimes};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

use husk_runtime::libc;
use husk_runtime::sys::{openat2, readlinkat, renameat, symlinkat, unlinkat, FileStat};
use tar::{EntryType, Header};

use crate::tar_ext::{pax_number, ExtError, Extensions};

use super::tree::{
    child_path, ensure_dir, open_dir, os_name, own_dir, own_entry, remove_tree, set_owner_mode,
    RelPath, Temp, Tree, BUF_SIZE, RESOLVE,
};
use super::{
    kind_name, lstat, WorkspaceError, MAX_COMPONENT_LEN, MAX_DEPTH, MAX_PATH_LEN, MAX_TREE_ENTRIES,
};

/// Bounds of one import.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ImportLimits {
    /// Bytes of file content (also the bound of one uploaded file).
    pub max_bytes: u64,
    /// Entries of the archive (files, directories, symlinks, skipped ones).
    pub max_entries: u64,
}

impl Default for ImportLimits {
    /// 1 GiB and 100 000 entries.
    fn default() -> Self {
        ImportLimits {
            max_bytes: 1 << 30,
            max_entries: 100_000,
        }
    }
}

/// What an import or export handled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TarReport {
    /// Regular files.
    pub files: u64,
    /// Directories (on import: those made).
    pub dirs: u64,
    pub symlinks: u64,
    /// Bytes of file content.
    pub bytes: u64,
    /// Entries not unpacked or exported: hard links, devices, fifos, sockets, sparse files.
    pub skipped: u64,
}

/// Bytes of archive (after decompression) allowed per entry beyond file content: headers,
/// long names, PAX records and padding.
const OVERHEAD_PER_ENTRY: u64 = 8 << 10;

/// Unpacks the archive in `reader` under `dest` in `tree`.
pub(super) fn import(
    tree: &Tree,
    dest: &RelPath,
    reader: impl Read,
    limits: ImportLimits,
) -> Result<TarReport, WorkspaceError> {
    // What stands at `dest` is checked first, so a hopeless import is refused before the
    // archive is read.
    if !dest.is_root() {
        match tree.lookup(dest) {
            Ok((_, _, Some(st))) if !st.is_dir() => {
                return Err(WorkspaceError::NotADirectory {
                    place: tree.place.clone(),
                    path: dest.text.clone(),
                    kind: kind_name(&st),
                })
            }
            Ok(_) | Err(WorkspaceError::PathNotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    let tmp = Temp::dir(&tree.root).map_err(|e| tree.io("create a directory for", "", e))?;
    let top = tmp.file.as_ref().expect("a directory");
    let mut unpacker = Unpacker {
        tree,
        top,
        limits,
        report: TarReport::default(),
        entries: 0,
        buf: vec![0; BUF_SIZE],
        last_dir: None,
    };
    unpacker.run(reader)?;
    let report = unpacker.report;
    own_dir(top, tree.owner).map_err(|e| tree.io("chown", &dest.text, e))?;
    let conflict_io = |e| tree.io("merge the archive into", &dest.text, e);
    let Some((parent, name)) = dest.split_last() else {
        check(tree, top, &tree.root, &dest.text, limits, 1)?;
        merge(top, &tree.root).map_err(conflict_io)?;
        return Ok(report);
    };
    let dir = tree.ensure_dirs(parent, dest)?;
    match renameat(tree.root.as_fd(), &tmp.name, dir.as_fd(), name, true) {
        Ok(()) => {
            tmp.disarm();
            return Ok(report);
        }
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
        Err(e) => return Err(conflict_io(e)),
    }
    let existing = match open_dir(dir.as_fd(), name) {
        Ok(d) => d,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR | libc::ELOOP)) => {
            return Err(WorkspaceError::NotADirectory {
                place: tree.place.clone(),
                path: dest.text.clone(),
                kind: lstat(&dir, name)
                    .ok()
                    .flatten()
                    .map_or("file", |st| kind_name(&st)),
            })
        }
        Err(e) => return Err(conflict_io(e)),
    };
    check(tree, top, &existing, &dest.text, limits, 1)?;
    merge(top, &existing).map_err(conflict_io)?;
    Ok(report)
}

struct Unpacker<'a> {
    tree: &'a Tree,
    top: &'a File,
    limits: ImportLimits,
    report: TarReport,
    entries: u64,
    buf: Vec<u8>,
    /// The directory of the previous entry, still open for the next one in it.
    last_dir: Option<(Vec<CString>, File)>,
}

/// Ends the input with an error after `left` bytes, and says so in `hit`.
struct Capped<R> {
    inner: R,
    left: u64,
    hit: Rc<Cell<bool>>,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            self.hit.set(true);
            return Err(io::Error::other("the archive is too large"));
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.left -= n as u64;
        Ok(n)
    }
}

impl Unpacker<'_> {
    fn run(&mut self, reader: impl Read) -> Result<(), WorkspaceError> {
        let hit = Rc::new(Cell::new(false));
        let mut input = BufReader::with_capacity(BUF_SIZE, reader);
        let gzip = input
            .fill_buf()
            .map_err(|e| self.read_error(e, &hit, ""))?
            .starts_with(&[0x1f, 0x8b]);
        let source: Box<dyn Read> = if gzip {
            Box::new(flate2::read::MultiGzDecoder::new(input))
        } else {
            Box::new(input)
        };
        // The decompressed archive is bounded too: a bomb of headers or skipped entries costs
        // no more to read than a full archive would.
        let cap = self
            .limits
            .max_bytes
            .saturating_add(self.limits.max_entries.saturating_mul(OVERHEAD_PER_ENTRY))
            .saturating_add(1 << 20);
        let capped = Capped {
            inner: source,
            left: cap,
            hit: hit.clone(),
        };
        let mut archive = tar::Archive::new(capped);
        let entries = archive
            .entries()
            .map_err(|e| self.read_error(e, &hit, ""))?
            .raw(true);
        let mut ext = Extensions::default();
        for item in entries {
            let mut entry = item.map_err(|e| self.read_error(e, &hit, "(header)"))?;
            let name = display(&entry.header().path_bytes());
            if ext
                .absorb(&mut entry)
                .map_err(|e| self.ext_error(e, &hit, &name))?
            {
                continue;
            }
            let ext = std::mem::take(&mut ext);
            self.entry(&mut entry, ext, &hit)?;
        }
        ext.finish().map_err(|e| self.ext_error(e, &hit, "(end)"))?;
        Ok(())
    }

    fn entry<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        ext: Extensions,
        hit: &Rc<Cell<bool>>,
    ) -> Result<(), WorkspaceError> {
        let header = entry.header().clone();
        let path = ext.path(entry).into_owned();
        let link = ext.link(entry).map(Cow::into_owned);
        let mut mtime = header.mtime().ok();
        let mut sparse = false;
        for record in ext.records() {
            let (key, value) = record.map_err(|e| self.ext_error(e, hit, &display(&path)))?;
            match key {
                b"mtime" => mtime = pax_number(value).or(mtime),
                b"size" if pax_number(value) != header.entry_size().ok() => {
                    return Err(self.bad(
                        &display(&path),
                        "PAX size records (files over 8 GiB) are not supported",
                    ))
                }
                k if k.starts_with(b"GNU.sparse.") => sparse = true,
                _ => {}
            }
        }
        let name = display(&path);
        self.entries += 1;
        if self.entries > self.limits.max_entries {
            return Err(WorkspaceError::TooManyEntries {
                place: self.tree.place.clone(),
                limit: self.limits.max_entries,
            });
        }
        let ty = header.entry_type();
        // Old archives mark directories with a trailing slash on a file entry.
        let is_dir = ty.is_dir() || (ty == EntryType::Regular && path.ends_with(b"/"));
        let comps = normalize(&path).map_err(|reason| self.bad(&name, reason))?;
        if is_dir {
            if !comps.is_empty() {
                self.dir(&comps, &name)?;
            }
            return Ok(());
        }
        match ty {
            EntryType::Regular | EntryType::Continuous if !sparse => {
                let (dir, file) = self.place_entry(&comps, &name)?;
                let size = header.entry_size().unwrap_or(u64::MAX);
                if size > self.limits.max_bytes - self.report.bytes {
                    return Err(self.too_large());
                }
                let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
                let mut out = openat2(dir.as_fd(), &file, flags, 0o600, RESOLVE)
                    .map(File::from)
                    .map_err(|e| self.tree.io("create", &name, e))?;
                let mut done = 0u64;
                while done < size {
                    let want = self.buf.len().min((size - done) as usize);
                    let n = match entry.read(&mut self.buf[..want]) {
                        Ok(0) => {
                            let e = io::Error::from(io::ErrorKind::UnexpectedEof);
                            return Err(self.read_error(e, hit, &name));
                        }
                        Ok(n) => n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(self.read_error(e, hit, &name)),
                    };
                    out.write_all(&self.buf[..n])
                        .map_err(|e| self.tree.io("write", &name, e))?;
                    done += n as u64;
                }
                let mode = if header.mode().unwrap_or(0) & 0o111 != 0 {
                    0o755
                } else {
                    0o644
                };
                set_owner_mode(&out, self.tree.owner, mode)
                    .map_err(|e| self.tree.io("chown", &name, e))?;
                if let Some(secs) = mtime {
                    let when = UNIX_EPOCH + Duration::from_secs(secs);
                    out.set_times(FileTimes::new().set_modified(when))
                        .map_err(|e| self.tree.io("set the time of", &name, e))?;
                }
                self.report.files += 1;
                self.report.bytes += size;
            }
            EntryType::Symlink => {
                let target = link
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| self.bad(&name, "symlink without a target"))?;
                if target.len() >= MAX_PATH_LEN {
                    return Err(self.bad(&name, "symlink target longer than 4095 bytes"));
                }
                let target = CString::new(target)
                    .map_err(|_| self.bad(&name, "symlink target contains a NUL byte"))?;
                let (dir, file) = self.place_entry(&comps, &name)?;
                // Stored as written: it is only ever read, never followed, by husk.
                symlinkat(&target, dir.as_fd(), &file)
                    .map_err(|e| self.tree.io("create symlink", &name, e))?;
                own_entry(&dir, &file, self.tree.owner)
                    .map_err(|e| self.tree.io("chown", &name, e))?;
                self.report.symlinks += 1;
            }
            // Hard links (they could tie a workspace file to another), devices, fifos, sparse
            // files and unknown kinds: not unpacked, counted.
            _ => self.report.skipped += 1,
        }
        Ok(())
    }

    /// Makes (or keeps) the directory `comps`.
    fn dir(&mut self, comps: &[CString], name: &str) -> Result<(), WorkspaceError> {
        let (parent, last) = comps.split_last().map(|(l, p)| (p, l)).expect("not empty");
        let dir = self.parent(parent, name)?;
        let (_, created) = ensure_dir(&dir, last, self.tree.owner)
            .map_err(|e| self.path_error(e, name, comps.len(), comps))?;
        self.report.dirs += u64::from(created);
        Ok(())
    }

    /// The open parent directory of a new non-directory entry and its name, with whatever an
    /// earlier entry of the archive put there removed (the later entry wins).
    fn place_entry(
        &mut self,
        comps: &[CString],
        name: &str,
    ) -> Result<(File, CString), WorkspaceError> {
        let Some((last, parent)) = comps.split_last() else {
            return Err(self.bad(name, "a file entry for the archive's root"));
        };
        let dir = self.parent(parent, name)?;
        match lstat(&dir, last).map_err(|e| self.tree.io("stat", name, e))? {
            None => {}
            Some(st) if st.is_dir() => {
                self.last_dir = None;
                remove_tree(self.top, &dir, last).map_err(|e| self.tree.io("replace", name, e))?
            }
            Some(_) => {
                unlinkat(dir.as_fd(), last, false).map_err(|e| self.tree.io("replace", name, e))?
            }
        }
        Ok((dir, last.clone()))
    }

    /// The directory `comps` in the temporary tree, made if missing; never through a symlink.
    fn parent(&mut self, comps: &[CString], name: &str) -> Result<File, WorkspaceError> {
        if let Some((cached, dir)) = &self.last_dir {
            if cached.as_slice() == comps {
                return dir.try_clone().map_err(|e| self.tree.io("open", name, e));
            }
        }
        let mut cur = self
            .top
            .try_clone()
            .map_err(|e| self.tree.io("open", name, e))?;
        for (i, comp) in comps.iter().enumerate() {
            let (dir, created) = ensure_dir(&cur, comp, self.tree.owner)
                .map_err(|e| self.path_error(e, name, i + 1, comps))?;
            self.report.dirs += u64::from(created);
            cur = dir;
        }
        let copy = cur.try_clone().map_err(|e| self.tree.io("open", name, e))?;
        self.last_dir = Some((comps.to_vec(), copy));
        Ok(cur)
    }

    /// Why the first `n` components of an entry's path could not be a directory.
    fn path_error(&self, e: io::Error, name: &str, n: usize, comps: &[CString]) -> WorkspaceError {
        let at = comps[..n]
            .iter()
            .map(|c| c.to_string_lossy())
            .collect::<Vec<_>>()
            .join("/");
        match e.raw_os_error() {
            Some(libc::ELOOP) => self.bad(
                name,
                format!("{at:?} is a symlink, and nothing is ever written through one"),
            ),
            Some(libc::ENOTDIR | libc::EEXIST) => {
                self.bad(name, format!("{at:?} is not a directory"))
            }
            _ => self.tree.io("create directory", &at, e),
        }
    }

    fn bad(&self, entry: &str, reason: impl Into<String>) -> WorkspaceError {
        WorkspaceError::BadArchive {
            place: self.tree.place.clone(),
            entry: entry.to_string(),
            reason: reason.into(),
        }
    }

    fn too_large(&self) -> WorkspaceError {
        WorkspaceError::TooLarge {
            place: self.tree.place.clone(),
            limit: self.limits.max_bytes,
        }
    }

    /// A refused or unreadable extension header.
    fn ext_error(&self, e: ExtError, hit: &Rc<Cell<bool>>, entry: &str) -> WorkspaceError {
        match e {
            ExtError::Read(e) => self.read_error(e, hit, entry),
            ExtError::Refused(reason) => self.bad(entry, reason),
        }
    }

    /// A failed read of the archive: over the cap, or a broken (or truncated) archive.
    fn read_error(&self, e: io::Error, hit: &Rc<Cell<bool>>, entry: &str) -> WorkspaceError {
        if hit.get() {
            return self.too_large();
        }
        self.bad(entry, format!("cannot read the archive: {e}"))
    }
}

/// An entry's path as components: relative, no `..`, bounded.
fn normalize(raw: &[u8]) -> Result<Vec<CString>, String> {
    if raw.starts_with(b"/") {
        return Err("absolute paths are refused".into());
    }
    if raw.len() > MAX_PATH_LEN {
        return Err(format!("path longer than {MAX_PATH_LEN} bytes"));
    }
    let mut comps = Vec::new();
    for part in raw.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return Err("`..` is refused".into()),
            _ if part.len() > MAX_COMPONENT_LEN => {
                return Err(format!("a name is longer than {MAX_COMPONENT_LEN} bytes"))
            }
            _ => comps.push(CString::new(part).map_err(|_| "the path contains a NUL byte")?),
        }
    }
    if comps.len() > MAX_DEPTH {
        return Err(format!("nested deeper than {MAX_DEPTH} levels"));
    }
    Ok(comps)
}

/// An entry path for messages: lossy UTF-8, shortened.
fn display(raw: &[u8]) -> String {
    let s = String::from_utf8_lossy(raw);
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.into_owned(),
    }
}

/// Checks that the unpacked tree `src` can be merged into `dst`: nothing of the archive that
/// is not a directory stands where `dst` has a directory.
fn check(
    tree: &Tree,
    src: &File,
    dst: &File,
    prefix: &str,
    limits: ImportLimits,
    depth: usize,
) -> Result<(), WorkspaceError> {
    let io = |e| tree.io("merge the archive into", prefix, e);
    let room = usize::try_from(limits.max_entries).unwrap_or(usize::MAX);
    let (names, more) = husk_runtime::sys::read_dir_names(src.as_fd(), room).map_err(io)?;
    if more {
        return Err(WorkspaceError::TooManyEntries {
            place: tree.place.clone(),
            limit: limits.max_entries,
        });
    }
    for name in names {
        let (Some(s), Some(d)) = (
            lstat(src, &name).map_err(io)?,
            lstat(dst, &name).map_err(io)?,
        ) else {
            continue;
        };
        let path = child_path(prefix, &name);
        match (s.is_dir(), d.is_dir()) {
            (true, true) => {
                if depth >= MAX_DEPTH {
                    return Err(WorkspaceError::TooDeep {
                        place: tree.place.clone(),
                        path,
                        max: MAX_DEPTH,
                    });
                }
                let (Ok(s), Ok(d)) = (open_dir(src.as_fd(), &name), open_dir(dst.as_fd(), &name))
                else {
                    continue;
                };
                check(tree, &s, &d, &path, limits, depth + 1)?;
            }
            (false, true) => {
                return Err(WorkspaceError::Conflict {
                    place: tree.place.clone(),
                    reason: format!(
                        "{path:?} is a directory there and a {} in the archive",
                        kind_name(&s)
                    ),
                })
            }
            _ => {}
        }
    }
    Ok(())
}

/// Moves everything in `src` into `dst`: new entries are renamed in whole, directories
/// merged, other entries replaced (atomically; a directory of the archive replaces a file).
fn merge(src: &File, dst: &File) -> io::Result<()> {
    let (names, _) = husk_runtime::sys::read_dir_names(src.as_fd(), usize::MAX)?;
    for name in names {
        let Some(s) = lstat(src, &name)? else {
            continue;
        };
        match lstat(dst, &name)? {
            None => renameat(src.as_fd(), &name, dst.as_fd(), &name, true)?,
            Some(d) if d.is_dir() => {
                // Not a directory of the archive: a directory appeared there since the
                // check, and is left alone.
                if s.is_dir() {
                    let sub_src = open_dir(src.as_fd(), &name)?;
                    let sub_dst = open_dir(dst.as_fd(), &name)?;
                    merge(&sub_src, &sub_dst)?;
                }
            }
            Some(_) if s.is_dir() => {
                unlinkat(dst.as_fd(), &name, false)?;
                renameat(src.as_fd(), &name, dst.as_fd(), &name, true)?;
            }
            Some(_) => renameat(src.as_fd(), &name, dst.as_fd(), &name, false)?,
        }
    }
    Ok(())
}

/// A tar export, found and ready to write: see [`super::Workspaces::exporter`].
pub struct TarExport {
    tree: Tree,
    start: Start,
}

enum Start {
    /// A directory: its content.
    Dir(File),
    /// A file or symlink: itself, under its name.
    Entry {
        parent: File,
        name: CString,
        st: FileStat,
    },
}

/// A writer that drops everything once closed: the tar builder's end-of-archive blocks must
/// not follow an export that failed half-way (the output would look complete).
struct Gate<W> {
    inner: W,
    closed: bool,
}

impl<W: Write> Write for Gate<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.closed {
            return Err(io::Error::other("export failed"));
        }
        self.inner.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.closed {
            return Ok(());
        }
        self.inner.flush()
    }
}

impl TarExport {
    pub(super) fn new(tree: Tree, rel: &RelPath) -> Result<TarExport, WorkspaceError> {
        let start = if rel.is_root() {
            Start::Dir(tree.open_dirs(&[], rel)?)
        } else {
            let (parent, name, st) = tree.lookup(rel)?;
            let st = st.ok_or_else(|| WorkspaceError::PathNotFound {
                place: tree.place.clone(),
                path: rel.text.clone(),
            })?;
            if st.is_dir() {
                let dir = tree.open_dirs(&rel.comps, rel)?;
                Start::Dir(dir)
            } else if st.is_file() || st.is_symlink() {
                Start::Entry {
                    parent,
                    name: name.to_owned(),
                    st,
                }
            } else {
                return Err(WorkspaceError::NotAFile {
                    place: tree.place.clone(),
                    path: rel.text.clone(),
                    kind: kind_name(&st),
                });
            }
        };
        Ok(TarExport { tree, start })
    }

    /// Writes the archive; on an error the output stops where it was (no end-of-archive).
    pub fn write_to(self, writer: impl Write) -> Result<TarReport, WorkspaceError> {
        let mut builder = tar::Builder::new(Gate {
            inner: writer,
            closed: false,
        });
        let mut report = TarReport::default();
        let mut count = 0u64;
        let done = match &self.start {
            Start::Dir(dir) => {
                self.walk(&mut builder, dir, Path::new(""), 1, &mut count, &mut report)
            }
            Start::Entry { parent, name, st } => {
                let path = Path::new(os_name(name));
                self.add(&mut builder, parent, name, path, st, &mut report)
            }
        };
        let done = done.and_then(|()| {
            builder
                .finish()
                .and_then(|()| builder.get_mut().flush())
                .map_err(|e| self.tree.io("write the archive of", "", e))
        });
        if done.is_err() {
            builder.get_mut().closed = true;
        }
        done.map(|()| report)
    }

    fn walk<W: Write>(
        &self,
        builder: &mut tar::Builder<W>,
        dir: &File,
        prefix: &Path,
        depth: usize,
        count: &mut u64,
        report: &mut TarReport,
    ) -> Result<(), WorkspaceError> {
        let io = |e| self.tree.io("list", &prefix.to_string_lossy(), e);
        let room = usize::try_from(MAX_TREE_ENTRIES - *count).unwrap_or(usize::MAX);
        let (mut names, more) = husk_runtime::sys::read_dir_names(dir.as_fd(), room).map_err(io)?;
        if more {
            return Err(WorkspaceError::TooManyEntries {
                place: self.tree.place.clone(),
                limit: MAX_TREE_ENTRIES,
            });
        }
        *count += names.len() as u64;
        names.sort();
        for name in names {
            let Some(st) = lstat(dir, &name).map_err(io)? else {
                continue;
            };
            let path = prefix.join(os_name(&name));
            self.add(builder, dir, &name, &path, &st, report)?;
            if !st.is_dir() {
                continue;
            }
            let text = path.to_string_lossy();
            if depth >= MAX_DEPTH {
                return Err(WorkspaceError::TooDeep {
                    place: self.tree.place.clone(),
                    path: text.into_owned(),
                    max: MAX_DEPTH,
                });
            }
            match open_dir(dir.as_fd(), &name) {
                Ok(sub) => self.walk(builder, &sub, &path, depth + 1, count, report)?,
                // Gone or swapped since the stat: its header went out, its content cannot.
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP)
                    ) => {}
                Err(e) => return Err(self.tree.io("open", &text, e)),
            }
        }
        Ok(())
    }

    /// Appends one entry (a directory's header only).
    fn add<W: Write>(
        &self,
        builder: &mut tar::Builder<W>,
        dir: &File,
        name: &CStr,
        tar_path: &Path,
        st: &FileStat,
        report: &mut TarReport,
    ) -> Result<(), WorkspaceError> {
        let io = |e| self.tree.io("archive", &tar_path.to_string_lossy(), e);
        match st.file_type() {
            libc::S_IFDIR => {
                let mut h = header(EntryType::Directory, st);
                builder
                    .append_data(&mut h, tar_path, io::empty())
                    .map_err(io)?;
                report.dirs += 1;
            }
            libc::S_IFREG => {
                let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
                let file = match openat2(dir.as_fd(), name, flags, 0, RESOLVE) {
                    Ok(fd) => File::from(fd),
                    // Removed or swapped for a symlink since the stat.
                    Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ELOOP)) => {
                        report.skipped += 1;
                        return Ok(());
                    }
                    Err(e) => return Err(io(e)),
                };
                let st = husk_runtime::sys::fstatat_nofollow(file.as_fd(), c"").map_err(io)?;
                if !st.is_file() {
                    report.skipped += 1;
                    return Ok(());
                }
                // Exactly the size in the header, whatever the file does meanwhile: cut if it
                // grows, zero-filled if it shrinks.
                let data = (&file).take(st.size).chain(io::repeat(0)).take(st.size);
                let mut h = header(EntryType::Regular, &st);
                h.set_size(st.size);
                builder.append_data(&mut h, tar_path, data).map_err(io)?;
                report.files += 1;
                report.bytes += st.size;
            }
            libc::S_IFLNK => {
                let target = match readlinkat(dir.as_fd(), name) {
                    Ok(t) => t,
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
                    Err(e) => return Err(io(e)),
                };
                let mut h = header(EntryType::Symlink, st);
                if h.set_link_name_literal(&target).is_ok() {
                    builder
                        .append_data(&mut h, tar_path, io::empty())
                        .map_err(io)?;
                } else {
                    // Too long for the header: a GNU long-link record.
                    builder
                        .append_link(&mut h, tar_path, OsStr::from_bytes(&target))
                        .map_err(io)?;
                }
                report.symlinks += 1;
            }
            _ => report.skipped += 1,
        }
        Ok(())
    }
}

/// A header for an entry of `st`, with its mode bits, owner and time.
fn header(kind: EntryType, st: &FileStat) -> Header {
    let mut h = Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(st.mode & 0o7777);
    h.set_uid(st.uid.into());
    h.set_gid(st.gid.into());
    h.set_mtime(st.mtime.max(0) as u64);
    h.set_size(0);
    h
}

/// Writes a tar of the local directory `dir` (symlinks as symlinks, never followed): what
/// `husk workspace put` sends of a directory.
pub fn export_local(dir: &Path, writer: impl Write) -> Result<TarReport, WorkspaceError> {
    let tree = Tree::local(dir)?;
    let root = tree.parse("")?;
    TarExport::new(tree, &root)?.write_to(writer)
}

/// Unpacks a tar (or tar.gz) into the existing local directory `dir`, with the same rules as
/// a workspace import (merged with what is there; files replaced), owned by the caller.
pub fn import_local(
    dir: &Path,
    reader: impl Read,
    limits: ImportLimits,
) -> Result<TarReport, WorkspaceError> {
    let tree = Tree::local(dir)?;
    let root = tree.parse("")?;
    import(&tree, &root, reader, limits)
}
