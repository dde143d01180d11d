//! Owners and modes a client chooses (E2B's volume content API takes `uid`, `gid` and
//! `mode` on writes, new directories and metadata updates), and the tree operations that
//! take them: making a directory, changing an entry's owner and mode.
//!
//! Ids are the sandbox's: a workspace is mounted with [`MountIds::Shared`], so the host's
//! id N is the sandbox's id N, and only ids a sandbox can map (below [`MAX_ID`]) are
//! accepted. Set-user-id and set-group-id bits are refused: a workspace's files are run by
//! sandboxes, and a client must not be able to plant a file that raises whoever runs it.
//!
//! [`MountIds::Shared`]: husk_runtime::MountIds::Shared

use std::fs::{File, Permissions};
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;

use husk_runtime::libc;
use husk_runtime::sys::{fchownat_nofollow, fstatat_nofollow, mkdirat, openat2};

use super::tree::{entry, open_dir, RelPath, Tree, RESOLVE};
use super::{kind_name, Entry, WorkspaceError};

/// Ids a sandbox maps (its user namespace holds 65,536 ids from 0).
pub const MAX_ID: u32 = 65_535;

/// Permission bits a client may set: read, write and execute for all, and the sticky bit.
pub const MODE_BITS: u32 = 0o1777;

/// An owner and mode to give an entry; what is `None` is left as it is (or, for an entry
/// husk makes, husk's default: [`super::WORKSPACE_OWNER`], 0644 for files, 0755 for
/// directories).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Attrs {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub mode: Option<u32>,
}

impl Attrs {
    /// Why these attributes are refused, if they are.
    pub fn problem(&self) -> Option<String> {
        for (what, id) in [("uid", self.uid), ("gid", self.gid)] {
            if id.is_some_and(|id| id > MAX_ID) {
                return Some(format!(
                    "{what} {} is out of range: sandboxes map ids 0-{MAX_ID}",
                    id.unwrap_or_default()
                ));
            }
        }
        match self.mode {
            Some(m) if m & (libc::S_ISUID | libc::S_ISGID) != 0 => Some(format!(
                "mode {m:o} has the set-user-id or set-group-id bit, which husk never sets"
            )),
            Some(m) if m & !MODE_BITS != 0 => Some(format!(
                "mode {m:o} is not a permission mode (at most {MODE_BITS:o})"
            )),
            _ => None,
        }
    }

    fn is_empty(&self) -> bool {
        self.uid.is_none() && self.gid.is_none() && self.mode.is_none()
    }
}

/// How [`Tree::write_file`] treats what is there, and what it gives the new file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WriteOptions {
    /// Replace a file or symlink at the path (else: [`WorkspaceError::Conflict`]).
    pub replace: bool,
    pub attrs: Attrs,
}

impl Default for WriteOptions {
    /// Replacing, husk's owner and mode: what husk's own API and CLI do.
    fn default() -> WriteOptions {
        WriteOptions {
            replace: true,
            attrs: Attrs::default(),
        }
    }
}

impl Tree {
    /// The attributes' problem as this tree's error for `path`.
    pub(super) fn check_attrs(&self, rel: &RelPath, attrs: &Attrs) -> Result<(), WorkspaceError> {
        match attrs.problem() {
            Some(reason) => Err(self.invalid(&rel.text, reason)),
            None => Ok(()),
        }
    }

    /// The owner for an entry husk makes: the client's ids where given, the tree's otherwise.
    pub(super) fn owner_for(&self, attrs: &Attrs) -> Option<(u32, u32)> {
        match (self.owner, attrs.uid, attrs.gid) {
            (_, Some(u), Some(g)) => Some((u, g)),
            (Some((u, g)), uid, gid) => Some((uid.unwrap_or(u), gid.unwrap_or(g))),
            (None, Some(u), None) => Some((u, u32::MAX)),
            (None, None, Some(g)) => Some((u32::MAX, g)),
            (None, None, None) => None,
        }
    }

    /// Makes the directory at `rel` with `attrs` (default owner, 0755). With `parents`,
    /// missing parents are made too and a directory already there is fine (as `mkdir -p`);
    /// without, the parent must exist and nothing may be at `rel`
    /// ([`WorkspaceError::Conflict`]).
    pub fn make_dir(
        &self,
        rel: &RelPath,
        parents: bool,
        attrs: &Attrs,
    ) -> Result<Entry, WorkspaceError> {
        self.check_attrs(rel, attrs)?;
        let exists = || WorkspaceError::Conflict {
            place: self.place.clone(),
            reason: format!("{:?} already exists", rel.text),
        };
        let Some((parent, name)) = rel.split_last() else {
            return if parents {
                self.stat(rel)
            } else {
                Err(exists())
            };
        };
        let dir = if parents {
            self.ensure_dirs(parent, rel)?
        } else {
            self.open_dirs(parent, rel)?
        };
        match mkdirat(dir.as_fd(), name, 0o700) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                let st = fstatat_nofollow(dir.as_fd(), name)
                    .map_err(|e| self.io("stat", &rel.text, e))?;
                return if parents && st.is_dir() {
                    Ok(entry(&dir, name, &rel.text, st))
                } else if parents {
                    Err(WorkspaceError::NotADirectory {
                        place: self.place.clone(),
                        path: rel.text.clone(),
                        kind: kind_name(&st),
                    })
                } else {
                    Err(exists())
                };
            }
            Err(e) => return Err(self.io("create", &rel.text, e)),
        }
        let made = open_dir(dir.as_fd(), name).map_err(|e| self.io("open", &rel.text, e))?;
        set(&made, self.owner_for(attrs), attrs.mode.unwrap_or(0o755))
            .map_err(|e| self.io("chown", &rel.text, e))?;
        let st = fstatat_nofollow(made.as_fd(), c"").map_err(|e| self.io("stat", &rel.text, e))?;
        Ok(entry(&dir, name, &rel.text, st))
    }

    /// Gives the entry at `rel` the owner and mode `attrs` name (what is `None` stays). A
    /// symlink gets an owner but no mode (links have none); fifos, sockets and devices are
    /// refused: they are never opened. The entry is changed through an fd opened without
    /// following anything, and checked again once open, so an entry swapped for a symlink
    /// meanwhile is never followed.
    pub fn set_attrs(&self, rel: &RelPath, attrs: &Attrs) -> Result<Entry, WorkspaceError> {
        self.check_attrs(rel, attrs)?;
        let (dir, name, open) = if rel.is_root() {
            let root = self.root.try_clone().map_err(|e| self.io("open", "", e))?;
            (
                root.try_clone().map_err(|e| self.io("open", "", e))?,
                c"".to_owned(),
                root,
            )
        } else {
            let (dir, name, st) = self.lookup(rel)?;
            let st = st.ok_or_else(|| WorkspaceError::PathNotFound {
                place: self.place.clone(),
                path: rel.text.clone(),
            })?;
            if st.is_symlink() {
                if attrs.mode.is_some() {
                    return Err(self.invalid(&rel.text, "a symlink has no mode of its own"));
                }
                if attrs.uid.is_some() || attrs.gid.is_some() {
                    let (u, g) = (attrs.uid.unwrap_or(u32::MAX), attrs.gid.unwrap_or(u32::MAX));
                    fchownat_nofollow(dir.as_fd(), name, u, g)
                        .map_err(|e| self.io("chown", &rel.text, e))?;
                }
                let st = fstatat_nofollow(dir.as_fd(), name)
                    .map_err(|e| self.io("stat", &rel.text, e))?;
                return Ok(entry(&dir, name, &rel.text, st));
            }
            if !st.is_dir() && !st.is_file() {
                return Err(WorkspaceError::NotAFile {
                    place: self.place.clone(),
                    path: rel.text.clone(),
                    kind: kind_name(&st),
                });
            }
            let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
            let open = match openat2(dir.as_fd(), name, flags, 0, RESOLVE) {
                Ok(fd) => File::from(fd),
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    return Err(WorkspaceError::PathNotFound {
                        place: self.place.clone(),
                        path: rel.text.clone(),
                    })
                }
                Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                    return Err(self.invalid(&rel.text, "it became a symlink meanwhile"))
                }
                Err(e) => return Err(self.io("open", &rel.text, e)),
            };
            (dir, name.to_owned(), open)
        };
        let st = fstatat_nofollow(open.as_fd(), c"").map_err(|e| self.io("stat", &rel.text, e))?;
        if !st.is_dir() && !st.is_file() {
            return Err(WorkspaceError::NotAFile {
                place: self.place.clone(),
                path: rel.text.clone(),
                kind: kind_name(&st),
            });
        }
        if !attrs.is_empty() {
            // chown first: it clears set-id bits, which the mode then cannot bring back.
            if attrs.uid.is_some() || attrs.gid.is_some() {
                std::os::unix::fs::fchown(&open, attrs.uid, attrs.gid)
                    .map_err(|e| self.io("chown", &rel.text, e))?;
            }
            let mode = attrs.mode.unwrap_or(st.mode & MODE_BITS);
            open.set_permissions(Permissions::from_mode(mode))
                .map_err(|e| self.io("chmod", &rel.text, e))?;
        }
        let st = fstatat_nofollow(open.as_fd(), c"").map_err(|e| self.io("stat", &rel.text, e))?;
        Ok(entry(&dir, &name, &rel.text, st))
    }
}

/// chown (when an owner is given; `u32::MAX` leaves that id) and chmod of an open entry.
pub(super) fn set(file: &File, owner: Option<(u32, u32)>, mode: u32) -> std::io::Result<()> {
    if let Some((uid, gid)) = owner {
        let keep = |id: u32| (id != u32::MAX).then_some(id);
        std::os::unix::fs::fchown(file, keep(uid), keep(gid))?;
    }
    file.set_permissions(Permissions::from_mode(mode))
}
