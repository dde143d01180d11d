//! Directory watches (the filesystem service's `WatchDir` and watcher calls) over one inotify
//! instance, polled by the agent's loop.
//!
//! inotify watches inodes, not paths, and hands out one watch descriptor (wd) per inode and
//! instance: two husk watches on one directory, or a recursive watch and a watch on one of its
//! subdirectories, share a wd. So the table maps each wd to a list of registrations
//! (husk watch id, path prefix relative to that watch's root), and a wd is removed from the
//! kernel only when its last registration goes.
//!
//! Events map to envd's (fsnotify's) kinds: `IN_CREATE` and `IN_MOVED_TO` → Create,
//! `IN_MODIFY` → Write (`IN_CLOSE_WRITE` is not watched, so one write is one event, as with
//! fsnotify), `IN_DELETE` → Remove, `IN_MOVED_FROM` → Rename, `IN_ATTRIB` → Chmod. When a
//! watch's own directory is deleted or moved away the watch ends: it sends nothing more but
//! stays known (and counted) until it is stopped.
//!
//! Recursive watches add a wd for every subdirectory at start and for each directory created
//! or moved in later. A directory's content can appear before its wd is added; to cover that,
//! the new directory is scanned right after and a Create is sent for every entry found (best
//! effort: an entry created between the wd and the scan is reported twice, and a directory
//! moved around outside the watch's view may keep a stale path for later additions).
//!
//! Everything is bounded: watches per agent, wds, entries scanned, bytes per batch and per
//! drain. A kernel queue overflow loses events; it is logged and skipped, as fsnotify does.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use husk_proto::{AgentError, ErrorKind, FsEvent, FsOp, User};
use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};

use crate::fs::{invalid, io_error, resolve};

/// Most husk watches at once (ended ones included, until stopped).
pub const MAX_WATCHES: usize = 64;
/// Most inotify wds of the agent: directories under all recursive watches together.
pub const MAX_WDS: usize = 8192;
/// Most directory entries a recursive start examines (a huge tree is refused, not walked
/// for minutes on the agent's only thread).
const MAX_SCAN: usize = 1_000_000;
/// Most entries examined (and Creates sent) for one directory appearing in a recursive watch.
const MAX_SCAN_EVENTS: usize = 4096;
/// One read of the inotify fd; room for at least 60 events with the longest names.
const READ_BUF: usize = 16 << 10;
/// Most reads per drain; the fd stays readable and the loop comes back for the rest.
const MAX_READS: usize = 16;
/// Most bytes of names in one returned batch: one batch is one frame to the server.
const MAX_BATCH_BYTES: usize = 256 << 10;
/// A drain stops reading once its events hold this many bytes.
const SOFT_DRAIN_BYTES: usize = 1 << 20;
/// A drain never holds more than this: the rest of a read's events is dropped (and logged).
/// Reached only when many watches share deep directories.
const MAX_DRAIN_BYTES: usize = 16 << 20;

/// What every wd watches. `IN_ONLYDIR` makes adding a watch on something that just turned
/// into a non-directory fail instead of watching it.
fn base_mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::MODIFY
        | WatchMask::DELETE
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::ATTRIB
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
        | WatchMask::ONLYDIR
}

/// One husk watch.
struct Watch {
    recursive: bool,
    /// The wd of the watched directory; `None` once the watch ended (its directory went).
    root_wd: Option<i32>,
}

/// A husk watch's interest in a wd.
struct Reg {
    watch: u32,
    /// Path of the wd's directory relative to the watch's root, with a trailing `/`
    /// (empty for the root itself): event names are `prefix + name`.
    prefix: String,
}

/// One inotify wd.
struct Wd {
    wd: WatchDescriptor,
    /// The directory's path as last seen, for adding watches on subdirectories created in it.
    dir: PathBuf,
    regs: Vec<Reg>,
}

/// One event as read, owned so the table can change while events are handled.
struct Raw {
    wd: i32,
    mask: EventMask,
    name: Option<OsString>,
}

/// The inotify instance and the watch table.
pub struct Watches {
    inotify: Inotify,
    watches: HashMap<u32, Watch>,
    wds: HashMap<i32, Wd>,
    last: u32,
}

/// Why adding a wd failed.
enum AddError {
    /// The agent's [`MAX_WDS`] or the kernel's watch limit.
    Limit,
    Io(io::Error),
}

impl Watches {
    /// A new inotify instance (close-on-exec, non-blocking) with no watches.
    pub fn new() -> io::Result<Watches> {
        Ok(Watches {
            inotify: Inotify::init()?,
            watches: HashMap::new(),
            wds: HashMap::new(),
            last: 0,
        })
    }

    /// The inotify fd (non-blocking) to poll for `POLLIN`.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.inotify.as_fd()
    }

    /// Starts watching a directory → the watch id. `NotFound` for a missing path,
    /// `InvalidArgument` for a non-directory, `ResourceExhausted` beyond the bounds.
    /// `recursive` also watches every subdirectory, now and later (symlinks never followed).
    pub fn start(&mut self, path: &str, recursive: bool, user: User) -> Result<u32, AgentError> {
        let root = resolve(path, user)?;
        let meta = std::fs::metadata(&root).map_err(|e| io_error("watch", &root, &e))?;
        if !meta.is_dir() {
            return Err(invalid(format!(
                "path '{}' is not a directory",
                root.display()
            )));
        }
        if self.watches.len() >= MAX_WATCHES {
            return Err(AgentError::new(
                ErrorKind::ResourceExhausted,
                format!("too many watches (at most {MAX_WATCHES})"),
            ));
        }
        let id = self.next_id();
        // The root may be reached through a symlink (resolved inside the sandbox).
        let root_wd = match self.add(&root, id, String::new(), true) {
            Ok(Some(wd)) => wd,
            // Unreachable for a fresh id (it has no registrations yet); handled anyway.
            Ok(None) => return Err(AgentError::new(ErrorKind::Internal, "watch id in use")),
            Err(e) => return Err(add_error(&root, e)),
        };
        self.watches.insert(
            id,
            Watch {
                recursive,
                root_wd: Some(root_wd),
            },
        );
        if recursive {
            let mut budget = MAX_SCAN;
            if let Err(e) = self.add_tree(&root, id, "", &mut budget, None) {
                self.watches.remove(&id);
                self.forget(id, |_| true);
                return Err(e);
            }
        }
        Ok(id)
    }

    /// Stops a watch (an ended one too); `NotFound` for an unknown id.
    pub fn stop(&mut self, watch: u32) -> Result<(), AgentError> {
        if self.watches.remove(&watch).is_none() {
            return Err(AgentError::new(
                ErrorKind::NotFound,
                format!("watcher {watch} not found"),
            ));
        }
        self.forget(watch, |_| true);
        Ok(())
    }

    /// Reads the pending inotify events without blocking and maps them to each watch's
    /// events, in order. A watch's events may come in several batches (each bounded by
    /// [`MAX_BATCH_BYTES`] so it fits a frame); batches of one watch keep their order.
    pub fn drain(&mut self) -> Vec<(u32, Vec<FsEvent>)> {
        let mut out = Out::default();
        let mut buf = [0u8; READ_BUF];
        for _ in 0..MAX_READS {
            let raw: Vec<Raw> = match self.inotify.read_events(&mut buf) {
                Ok(events) => events
                    .map(|e| Raw {
                        wd: e.wd.get_watch_descriptor_id(),
                        mask: e.mask,
                        name: e.name.map(OsStr::to_owned),
                    })
                    .collect(),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    eprintln!("husk-agent: reading inotify events: {e}");
                    break;
                }
            };
            for ev in raw {
                self.event(ev, &mut out);
            }
            if out.bytes >= SOFT_DRAIN_BYTES {
                break;
            }
        }
        if out.dropped > 0 {
            eprintln!(
                "husk-agent: dropped {} file-system events over the drain limit",
                out.dropped
            );
        }
        out.batches
    }

    /// Handles one inotify event.
    fn event(&mut self, ev: Raw, out: &mut Out) {
        if ev.mask.contains(EventMask::Q_OVERFLOW) {
            eprintln!("husk-agent: inotify queue overflowed; file-system events were lost");
            return;
        }
        // Events of a wd removed meanwhile (stopped watches, moved directories) are stale.
        let Some(wd) = self.wds.get(&ev.wd) else {
            return;
        };
        let regs: Vec<(u32, String)> = wd
            .regs
            .iter()
            .map(|r| (r.watch, r.prefix.clone()))
            .collect();
        let dir = wd.dir.clone();
        if ev.mask.contains(EventMask::IGNORED) {
            // The kernel dropped the wd (its directory is gone, or unmounted).
            self.wds.remove(&ev.wd);
        }
        if ev
            .mask
            .intersects(EventMask::IGNORED | EventMask::DELETE_SELF | EventMask::MOVE_SELF)
        {
            // For a watch's root this ends the watch; for a subdirectory of a recursive
            // watch the parent's DELETE or MOVED_FROM already told the story.
            for (watch, _) in regs {
                if self.watches.get(&watch).and_then(|w| w.root_wd) == Some(ev.wd) {
                    self.end(watch);
                }
            }
            return;
        }
        // Events about the watched directory itself (e.g. its ATTRIB) have no name; its
        // parent reports them, if watched.
        let Some(name) = ev.name else {
            return;
        };
        let m = ev.mask;
        let op = if m.contains(EventMask::CREATE) || m.contains(EventMask::MOVED_TO) {
            FsOp::Create
        } else if m.contains(EventMask::MODIFY) {
            FsOp::Write
        } else if m.contains(EventMask::DELETE) {
            FsOp::Remove
        } else if m.contains(EventMask::MOVED_FROM) {
            FsOp::Rename
        } else if m.contains(EventMask::ATTRIB) {
            FsOp::Chmod
        } else {
            return;
        };
        let name_str = name.to_string_lossy();
        let is_dir = m.contains(EventMask::ISDIR);
        for (watch, prefix) in regs {
            let Some(w) = self.watches.get(&watch) else {
                continue;
            };
            if w.root_wd.is_none() {
                continue;
            }
            let recursive = w.recursive;
            let rel = format!("{prefix}{name_str}");
            let sub_prefix = format!("{rel}/");
            out.push(watch, FsEvent { name: rel, op });
            if !(recursive && is_dir) {
                continue;
            }
            if m.intersects(EventMask::MOVED_FROM | EventMask::DELETE) {
                // Gone from this place: its wds (if still alive) would report wrong paths.
                self.forget(watch, |p| p.starts_with(&sub_prefix));
            } else if m.intersects(EventMask::CREATE | EventMask::MOVED_TO) {
                let child = dir.join(&name);
                match self.add(&child, watch, sub_prefix.clone(), false) {
                    Ok(Some(_)) => {
                        let mut budget = MAX_SCAN_EVENTS;
                        if let Err(e) =
                            self.add_tree(&child, watch, &sub_prefix, &mut budget, Some(out))
                        {
                            eprintln!("husk-agent: watch {watch}: {}", e.message);
                        }
                    }
                    // Already watched for this watch (a scan got there first).
                    Ok(None) => {}
                    Err(AddError::Limit) => eprintln!(
                        "husk-agent: watch {watch}: watch limit reached, '{}' not watched",
                        child.display()
                    ),
                    // Gone again, or not a directory any more: nothing to watch.
                    Err(AddError::Io(_)) => {}
                }
            }
        }
    }

    /// Adds a wd for `dir` and registers `watch` with `prefix` on it → `Some(wd)`, or `None`
    /// when `watch` is already registered on that inode (so callers don't descend into it
    /// twice: that also stops bind-mount loops). Symlinks are followed only with `follow`.
    fn add(
        &mut self,
        dir: &Path,
        watch: u32,
        prefix: String,
        follow: bool,
    ) -> Result<Option<i32>, AddError> {
        let mut mask = base_mask();
        if !follow {
            mask |= WatchMask::DONT_FOLLOW;
        }
        let wd = match self.inotify.watches().add(dir, mask) {
            Ok(wd) => wd,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::ENOMEM)) => {
                return Err(AddError::Limit)
            }
            Err(e) => return Err(AddError::Io(e)),
        };
        let id = wd.get_watch_descriptor_id();
        match self.wds.get_mut(&id) {
            Some(known) => {
                known.dir = dir.to_owned();
                if known.regs.iter().any(|r| r.watch == watch) {
                    return Ok(None);
                }
                known.regs.push(Reg { watch, prefix });
            }
            None => {
                if self.wds.len() >= MAX_WDS {
                    // Errors of inotify_rm_watch only mean it is gone already.
                    let _ = self.inotify.watches().remove(wd);
                    return Err(AddError::Limit);
                }
                self.wds.insert(
                    id,
                    Wd {
                        wd,
                        dir: dir.to_owned(),
                        regs: vec![Reg { watch, prefix }],
                    },
                );
            }
        }
        Ok(Some(id))
    }

    /// Adds wds for every directory below `top` (whose own wd exists), never following
    /// symlinks, examining at most `budget` entries. With `out`, also sends a Create for each
    /// entry found (a directory that appeared in a recursive watch) and stops quietly at the
    /// budget; without, running out is `ResourceExhausted`.
    fn add_tree(
        &mut self,
        top: &Path,
        watch: u32,
        top_prefix: &str,
        budget: &mut usize,
        mut out: Option<&mut Out>,
    ) -> Result<(), AgentError> {
        let mut pending = vec![(top.to_owned(), top_prefix.to_owned())];
        while let Some((dir, prefix)) = pending.pop() {
            // Unreadable or gone meanwhile: nothing below it to watch.
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for dirent in entries {
                let Ok(dirent) = dirent else { continue };
                if *budget == 0 {
                    return match out {
                        Some(_) => Ok(()),
                        None => Err(AgentError::new(
                            ErrorKind::ResourceExhausted,
                            format!(
                                "'{}' has more than {MAX_SCAN} entries to watch",
                                top.display()
                            ),
                        )),
                    };
                }
                *budget -= 1;
                let name = dirent.file_name();
                let rel = format!("{prefix}{}", name.to_string_lossy());
                if let Some(out) = out.as_deref_mut() {
                    out.push(
                        watch,
                        FsEvent {
                            name: rel.clone(),
                            op: FsOp::Create,
                        },
                    );
                }
                if !dirent.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                let child = dir.join(&name);
                let sub_prefix = format!("{rel}/");
                match self.add(&child, watch, sub_prefix.clone(), false) {
                    Ok(Some(_)) => pending.push((child, sub_prefix)),
                    Ok(None) => {}
                    Err(AddError::Limit) => return Err(add_error(&child, AddError::Limit)),
                    // Removed, replaced or too deep meanwhile: skip it.
                    Err(AddError::Io(_)) => {}
                }
            }
        }
        Ok(())
    }

    /// Drops `watch`'s registrations whose prefix matches, removing wds nobody needs.
    fn forget(&mut self, watch: u32, matches: impl Fn(&str) -> bool) {
        let mut dead = Vec::new();
        for (id, wd) in &mut self.wds {
            wd.regs.retain(|r| r.watch != watch || !matches(&r.prefix));
            if wd.regs.is_empty() {
                dead.push(*id);
            }
        }
        for id in dead {
            if let Some(wd) = self.wds.remove(&id) {
                // Errors only mean the kernel dropped it already.
                let _ = self.inotify.watches().remove(wd.wd);
            }
        }
    }

    /// Ends a watch whose directory went: no more events, but it stays known until stopped.
    fn end(&mut self, watch: u32) {
        if let Some(w) = self.watches.get_mut(&watch) {
            w.root_wd = None;
        }
        self.forget(watch, |_| true);
    }

    /// A fresh watch id (never 0, never one in use).
    fn next_id(&mut self) -> u32 {
        loop {
            self.last = self.last.wrapping_add(1).max(1);
            if !self.watches.contains_key(&self.last) {
                return self.last;
            }
        }
    }
}

/// The error for a failed wd.
fn add_error(path: &Path, e: AddError) -> AgentError {
    match e {
        AddError::Limit => AgentError::new(
            ErrorKind::ResourceExhausted,
            format!(
                "too many watched directories (at most {MAX_WDS}) for '{}'",
                path.display()
            ),
        ),
        AddError::Io(e) => io_error("watch", path, &e),
    }
}

/// The events of one drain, batched per watch.
#[derive(Default)]
struct Out {
    batches: Vec<(u32, Vec<FsEvent>)>,
    /// Per watch: index of its open batch in `batches` and that batch's bytes.
    open: HashMap<u32, (usize, usize)>,
    bytes: usize,
    dropped: usize,
}

impl Out {
    fn push(&mut self, watch: u32, ev: FsEvent) {
        let cost = ev.name.len() + 8;
        if self.bytes + cost > MAX_DRAIN_BYTES {
            self.dropped += 1;
            return;
        }
        self.bytes += cost;
        match self.open.get_mut(&watch) {
            Some((i, bytes)) if *bytes + cost <= MAX_BATCH_BYTES => {
                *bytes += cost;
                self.batches[*i].1.push(ev);
            }
            _ => {
                self.open.insert(watch, (self.batches.len(), cost));
                self.batches.push((watch, vec![ev]));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::PermissionsExt;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::fs::tests::TempDir;

    /// Long enough for a loaded CI machine; tests finish as soon as their events arrive.
    const DEADLINE: Duration = Duration::from_secs(10);

    fn ev(name: &str, op: FsOp) -> FsEvent {
        FsEvent {
            name: name.into(),
            op,
        }
    }

    /// Polls and drains into `got` until `done(got)` or the deadline; returns whether done.
    fn wait_for(
        w: &mut Watches,
        got: &mut Vec<(u32, FsEvent)>,
        done: impl Fn(&[(u32, FsEvent)]) -> bool,
    ) -> bool {
        let end = Instant::now() + DEADLINE;
        loop {
            if done(got) {
                return true;
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let mut fds = [libc::pollfd {
                fd: w.fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
            let _ = husk_runtime::sys::poll(&mut fds, ms.saturating_add(1));
            for (id, events) in w.drain() {
                got.extend(events.into_iter().map(|e| (id, e)));
            }
        }
    }

    fn has(got: &[(u32, FsEvent)], id: u32, name: &str, op: FsOp) -> bool {
        got.iter()
            .any(|(i, e)| *i == id && e.name == name && e.op == op)
    }

    /// The events of `id`, consecutive duplicates merged (inotify merges some, not all).
    fn of(got: &[(u32, FsEvent)], id: u32) -> Vec<FsEvent> {
        let mut out: Vec<FsEvent> = Vec::new();
        for (_, e) in got.iter().filter(|(i, _)| *i == id) {
            if out.last() != Some(e) {
                out.push(e.clone());
            }
        }
        out
    }

    #[test]
    fn create_write_rename_chmod_remove_in_order() {
        let t = TempDir::new("watch-order");
        let mut w = Watches::new().unwrap();
        let id = w.start(&t.join(""), false, User::Root).unwrap();
        let mut f = fs::File::create(t.path().join("a.txt")).unwrap();
        f.write_all(b"x").unwrap();
        drop(f);
        fs::rename(t.path().join("a.txt"), t.path().join("b.txt")).unwrap();
        fs::set_permissions(t.path().join("b.txt"), fs::Permissions::from_mode(0o600)).unwrap();
        fs::remove_file(t.path().join("b.txt")).unwrap();
        let mut got = Vec::new();
        assert!(
            wait_for(&mut w, &mut got, |g| has(g, id, "b.txt", FsOp::Remove)),
            "{got:?}"
        );
        let mut seen = of(&got, id);
        // unlink(2) changes the link count: some kernels report that as an ATTRIB first.
        if seen.len() == 7 && seen[5] == ev("b.txt", FsOp::Chmod) {
            seen.remove(5);
        }
        assert_eq!(
            seen,
            [
                ev("a.txt", FsOp::Create),
                ev("a.txt", FsOp::Write),
                ev("a.txt", FsOp::Rename),
                ev("b.txt", FsOp::Create),
                ev("b.txt", FsOp::Chmod),
                ev("b.txt", FsOp::Remove),
            ]
        );
    }

    #[test]
    fn recursive_watch_follows_new_and_moved_directories() {
        let t = TempDir::new("watch-rec");
        fs::create_dir_all(t.path().join("pre/deep")).unwrap();
        // A symlink to a directory is an entry, never a watched directory.
        std::os::unix::fs::symlink(t.path(), t.path().join("loop")).unwrap();
        let mut w = Watches::new().unwrap();
        let id = w.start(&t.join(""), true, User::Root).unwrap();
        // wds: the root, pre, pre/deep; not loop.
        assert_eq!(w.wds.len(), 3);
        let mut got = Vec::new();

        fs::write(t.path().join("pre/deep/x.txt"), b"1").unwrap();
        assert!(
            wait_for(&mut w, &mut got, |g| has(
                g,
                id,
                "pre/deep/x.txt",
                FsOp::Write
            )),
            "{got:?}"
        );
        assert!(has(&got, id, "pre/deep/x.txt", FsOp::Create));

        fs::create_dir(t.path().join("new")).unwrap();
        assert!(wait_for(&mut w, &mut got, |g| has(
            g,
            id,
            "new",
            FsOp::Create
        )));
        fs::write(t.path().join("new/inner.txt"), b"2").unwrap();
        assert!(
            wait_for(&mut w, &mut got, |g| has(
                g,
                id,
                "new/inner.txt",
                FsOp::Write
            )),
            "{got:?}"
        );

        // A tree made at once: its content may exist before its wd; the scan reports it.
        fs::create_dir_all(t.path().join("quick/a/b")).unwrap();
        fs::write(t.path().join("quick/a/b/f"), b"3").unwrap();
        assert!(
            wait_for(&mut w, &mut got, |g| has(
                g,
                id,
                "quick/a/b/f",
                FsOp::Create
            )),
            "{got:?}"
        );
        fs::write(t.path().join("quick/a/b/g"), b"4").unwrap();
        assert!(
            wait_for(&mut w, &mut got, |g| has(g, id, "quick/a/b/g", FsOp::Write)),
            "{got:?}"
        );

        // A directory renamed inside the watch reports under its new name.
        fs::rename(t.path().join("new"), t.path().join("renamed")).unwrap();
        assert!(wait_for(&mut w, &mut got, |g| has(
            g,
            id,
            "renamed",
            FsOp::Create
        )));
        assert!(has(&got, id, "new", FsOp::Rename));
        fs::write(t.path().join("renamed/after.txt"), b"5").unwrap();
        assert!(
            wait_for(&mut w, &mut got, |g| has(
                g,
                id,
                "renamed/after.txt",
                FsOp::Write
            )),
            "{got:?}"
        );
        assert!(!got.iter().any(|(_, e)| e.name.starts_with("new/after")));
        assert!(!got.iter().any(|(_, e)| e.name.starts_with("loop/")));

        // A removed subtree drops its wds.
        fs::remove_dir_all(t.path().join("quick")).unwrap();
        assert!(wait_for(&mut w, &mut got, |g| has(
            g,
            id,
            "quick",
            FsOp::Remove
        )));
        w.drain();
        assert_eq!(w.wds.len(), 4, "root, pre, pre/deep, renamed");
        w.stop(id).unwrap();
        assert!(w.wds.is_empty());
    }

    #[test]
    fn shared_directories_and_stop() {
        let t = TempDir::new("watch-shared");
        fs::create_dir(t.path().join("d")).unwrap();
        let mut w = Watches::new().unwrap();
        let w1 = w.start(&t.join("d"), false, User::Root).unwrap();
        let w2 = w.start(&t.join("d"), false, User::Root).unwrap();
        let w3 = w.start(&t.join(""), true, User::Root).unwrap();
        assert_eq!(w.wds.len(), 2, "one wd per directory");
        let mut got = Vec::new();

        fs::write(t.path().join("d/f"), b"").unwrap();
        assert!(
            wait_for(&mut w, &mut got, |g| has(g, w1, "f", FsOp::Create)
                && has(g, w2, "f", FsOp::Create)
                && has(g, w3, "d/f", FsOp::Create)),
            "{got:?}"
        );

        w.stop(w1).unwrap();
        got.clear();
        fs::write(t.path().join("d/g"), b"").unwrap();
        assert!(
            wait_for(&mut w, &mut got, |g| has(g, w2, "g", FsOp::Create)
                && has(g, w3, "d/g", FsOp::Create)),
            "{got:?}"
        );
        // w1's events would have come in the same read as w2's.
        assert!(!got.iter().any(|(i, _)| *i == w1), "{got:?}");

        w.stop(w2).unwrap();
        got.clear();
        fs::write(t.path().join("d/h"), b"").unwrap();
        assert!(wait_for(&mut w, &mut got, |g| has(
            g,
            w3,
            "d/h",
            FsOp::Create
        )));
        assert!(!got.iter().any(|(i, _)| *i != w3), "{got:?}");
        assert_eq!(w.stop(w1).unwrap_err().kind, ErrorKind::NotFound);
    }

    #[test]
    fn removing_the_watched_directory_ends_the_watch() {
        let t = TempDir::new("watch-end");
        fs::create_dir(t.path().join("d")).unwrap();
        let mut w = Watches::new().unwrap();
        let gone = w.start(&t.join("d"), false, User::Root).unwrap();
        let parent = w.start(&t.join(""), false, User::Root).unwrap();
        let mut got = Vec::new();
        fs::remove_dir(t.path().join("d")).unwrap();
        assert!(wait_for(&mut w, &mut got, |g| has(
            g,
            parent,
            "d",
            FsOp::Remove
        )));
        // A new directory of the same name is another inode: the ended watch stays silent.
        fs::create_dir(t.path().join("d")).unwrap();
        fs::write(t.path().join("d/x"), b"").unwrap();
        fs::write(t.path().join("marker"), b"").unwrap();
        assert!(wait_for(&mut w, &mut got, |g| has(
            g,
            parent,
            "marker",
            FsOp::Create
        )));
        assert!(!got.iter().any(|(i, _)| *i == gone), "{got:?}");
        assert!(w.watches[&gone].root_wd.is_none());
        w.stop(gone).unwrap();
        w.stop(parent).unwrap();
        assert!(w.wds.is_empty());
    }

    #[test]
    fn errors_and_limits() {
        let t = TempDir::new("watch-limits");
        fs::write(t.path().join("file"), b"").unwrap();
        let mut w = Watches::new().unwrap();
        let kind = |r: Result<u32, AgentError>| r.unwrap_err().kind;
        assert_eq!(
            kind(w.start(&t.join("nope"), false, User::Root)),
            ErrorKind::NotFound
        );
        assert_eq!(
            kind(w.start(&t.join("file"), false, User::Root)),
            ErrorKind::InvalidArgument
        );
        assert_eq!(w.stop(12345).unwrap_err().kind, ErrorKind::NotFound);
        let ids: Vec<u32> = (0..MAX_WATCHES)
            .map(|_| w.start(&t.join(""), false, User::Root).unwrap())
            .collect();
        assert_eq!(
            kind(w.start(&t.join(""), false, User::Root)),
            ErrorKind::ResourceExhausted
        );
        w.stop(ids[3]).unwrap();
        w.start(&t.join(""), false, User::Root).unwrap();
        assert!(w.drain().is_empty());
    }

    #[test]
    fn batches_stay_bounded() {
        let mut out = Out::default();
        let name = "n".repeat(4000);
        for _ in 0..200 {
            out.push(1, ev(&name, FsOp::Write));
            out.push(2, ev("x", FsOp::Create));
        }
        assert!(out.batches.len() > 2);
        for (_, events) in &out.batches {
            let bytes: usize = events.iter().map(|e| e.name.len() + 8).sum();
            assert!(bytes <= MAX_BATCH_BYTES);
        }
        let ones: usize = out
            .batches
            .iter()
            .filter(|(i, _)| *i == 1)
            .map(|(_, e)| e.len())
            .sum();
        assert_eq!(ones, 200);
    }
}
