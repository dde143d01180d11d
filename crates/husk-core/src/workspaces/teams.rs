//! Team directories: opened for every operation, and their file systems (see [`super::quota`]
//! for the decisions and the tools) mounted when missing, made with a team's first workspace,
//! and adopted, grown and checked by [`Workspaces::open`](super::Workspaces::open).

use std::fs::{self, File};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;

use husk_runtime::libc;
use husk_runtime::sys::{mkdirat, read_dir_names};

use super::{cstring, quota, size_text, tree, LocalWorkspaces, WorkspaceError};

impl LocalWorkspaces {
    /// The team's directory, open; created (0700) with `create`, else `None` when missing.
    /// Its file system is mounted first when the team has one, and made first when the
    /// team's first workspace is created under a quota.
    pub(super) fn team_dir(
        &self,
        team: &str,
        create: bool,
    ) -> Result<Option<File>, WorkspaceError> {
        crate::store::validate_team(team)
            .map_err(|_| WorkspaceError::InvalidTeam(team.to_string()))?;
        let name = cstring(team);
        let io = |op, source| self.team_io(team, op, source);
        // The usual case: the team's file system is there.
        match tree::open_dir(self.fd.as_fd(), &name) {
            Ok(dir) if self.is_mount(&dir) => return Ok(Some(dir)),
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(io("open", e)),
        }
        let found = self.inspect(team).map_err(|e| io("inspect", e))?;
        match quota::plan(found, self.teams.quota(), create) {
            quota::Plan::Mount | quota::Plan::Create(_) => {
                let _lock = self.teams.lock().map_err(|e| io("lock", e))?;
                // Again under the lock: another thread or process may have done it meanwhile.
                let found = self.inspect(team).map_err(|e| io("inspect", e))?;
                let unavailable = |reason| WorkspaceError::TeamUnavailable {
                    team: team.to_string(),
                    reason,
                };
                match quota::plan(found, self.teams.quota(), create) {
                    quota::Plan::Mount => self.mount_team(team).map_err(unavailable)?,
                    quota::Plan::Create(size) => {
                        self.teams.make_image(team, size).map_err(unavailable)?;
                        self.mount_team(team).map_err(unavailable)?;
                    }
                    _ => {}
                }
            }
            quota::Plan::Blocked => return Err(self.blocked(team)),
            quota::Plan::AsIs | quota::Plan::Legacy => {}
        }
        if create {
            match mkdirat(self.fd.as_fd(), &name, 0o700) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                Err(e) => return Err(io("create", e)),
            }
        }
        match tree::open_dir(self.fd.as_fd(), &name) {
            Ok(dir) => Ok(Some(dir)),
            Err(e) if !create && e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(io("open", e)),
        }
    }

    /// Whether `dir` (a team directory) is on another file system than the workspaces
    /// directory: a mounted team file system.
    pub(super) fn is_mount(&self, dir: &File) -> bool {
        dir.metadata().is_ok_and(|m| m.dev() != self.dev)
    }

    /// What is on disk for a team.
    fn inspect(&self, team: &str) -> io::Result<quota::Found> {
        let image = self.teams.image_size(team)?;
        let (mounted, dir) = match tree::open_dir(self.fd.as_fd(), &cstring(team)) {
            Ok(dir) if self.is_mount(&dir) => (true, quota::DirState::NotEmpty),
            Ok(dir) => {
                let (names, _) = read_dir_names(dir.as_fd(), 1)?;
                let state = if names.is_empty() {
                    quota::DirState::Empty
                } else {
                    quota::DirState::NotEmpty
                };
                (false, state)
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => (false, quota::DirState::Missing),
            Err(e) => return Err(e),
        };
        Ok(quota::Found {
            image,
            mounted,
            dir,
        })
    }

    /// Mounts the team's image on its directory (made if missing), then makes the file
    /// system's root what a team directory is: root's, 0700, nothing but workspaces in it.
    fn mount_team(&self, team: &str) -> Result<(), String> {
        let name = cstring(team);
        match mkdirat(self.fd.as_fd(), &name, 0o700) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => return Err(format!("create its directory: {e}")),
        }
        let target = self.dir.join(team);
        self.teams.mount(team, &target)?;
        let root = tree::open_dir(self.fd.as_fd(), &name)
            .map_err(|e| format!("open {}: {e}", target.display()))?;
        if !self.is_mount(&root) {
            return Err(format!(
                "{} is not a mount point after mounting",
                target.display()
            ));
        }
        use std::os::unix::fs::PermissionsExt;
        std::os::unix::fs::fchown(&root, Some(0), Some(0))
            .and_then(|()| root.set_permissions(fs::Permissions::from_mode(0o700)))
            .map_err(|e| format!("chmod {}: {e}", target.display()))?;
        // mkfs's lost+found is not a workspace (listings skip it, its name being invalid,
        // but nothing that is not a workspace belongs here); e2fsck makes it when needed.
        match husk_runtime::sys::unlinkat(root.as_fd(), c"lost+found", true) {
            Err(e) if e.raw_os_error() != Some(libc::ENOENT) => {
                tracing::warn!(team, error = %e, "removing lost+found of a team file system");
            }
            _ => {}
        }
        tracing::info!(team, image = %self.teams.image(team).display(), "mounted the team's workspace file system");
        Ok(())
    }

    /// Mounts every team's image (adopting mounts already there), grows those smaller than
    /// the quota, and notes what the operator should know. Then checks that mounting works
    /// here at all, unless a team's file system just showed it does.
    pub(super) fn adopt(&mut self) {
        let mut teams = self.teams.teams();
        // Held throughout: a server's open and the command-line tools' never mount, grow or
        // try at the same time (an offline grow unmounts for a moment).
        let _lock = if teams.is_empty() && self.teams.quota().is_none() {
            None
        } else {
            match self.teams.lock() {
                Ok(lock) => Some(lock),
                Err(e) => {
                    self.notice(format!("cannot lock the workspace images: {e}"));
                    None
                }
            }
        };
        if let Ok((names, _)) = read_dir_names(self.fd.as_fd(), 100_000) {
            teams.extend(
                names
                    .into_iter()
                    .filter_map(|n| n.into_string().ok())
                    .filter(|n| crate::store::validate_team(n).is_ok()),
            );
        }
        teams.sort();
        teams.dedup();
        let mut works = false;
        for team in &teams {
            let found = match self.inspect(team) {
                Ok(f) => f,
                Err(e) => {
                    self.notice(format!("team '{team}': cannot inspect its workspaces: {e}"));
                    continue;
                }
            };
            let mounted = match quota::plan(found, self.teams.quota(), false) {
                quota::Plan::AsIs => found.mounted,
                quota::Plan::Mount => match self.mount_team(team) {
                    Ok(()) => true,
                    Err(reason) => {
                        self.notice(format!(
                            "the workspaces of team '{team}' are unavailable: their file \
                                 system {} cannot be mounted: {reason}",
                            self.teams.image(team).display()
                        ));
                        false
                    }
                },
                quota::Plan::Legacy => {
                    if let Some(q) = self.teams.quota() {
                        self.notice(format!(
                            "the workspaces of team '{team}' predate workspace quotas and are \
                             NOT bounded by the quota of {}: they stay plain directories in \
                             {}. To bring them under it: `husk workspace export` each, \
                             `husk workspace rm` them all, then create and `import` them again \
                             (the team's first new workspace gets its size-capped file system)",
                            size_text(q),
                            self.dir.join(team).display()
                        ));
                    }
                    false
                }
                quota::Plan::Blocked => {
                    let e = self.blocked(team);
                    self.notice(e.to_string());
                    false
                }
                quota::Plan::Create(_) => false,
            };
            works |= mounted;
            if mounted {
                self.resize(team);
            }
        }
        if !works && self.teams.quota().is_some() {
            if let Err(reason) = self.teams.trial() {
                let text = self.teams.disable(reason);
                self.notice(text);
            }
        }
    }

    /// Grows the team's mounted image to the quota, or notes that it is larger.
    fn resize(&mut self, team: &str) {
        let Ok(Some(size)) = self.teams.image_size(team) else {
            return;
        };
        match quota::resize(size, self.teams.quota()) {
            quota::Resize::Keep => {}
            quota::Resize::Grow(to) => {
                match self.teams.grow(team, &self.dir.join(team), size, to) {
                    Ok(()) => tracing::info!(
                        team,
                        from = size,
                        to,
                        "grew the team's workspace file system to the quota"
                    ),
                    Err(reason) => self.notice(format!(
                    "the workspace file system of team '{team}' stays at {} (the quota is {}): \
                     growing it failed: {reason}",
                    size_text(size),
                    size_text(to)
                )),
                }
            }
            quota::Resize::Larger => self.notice(format!(
                "the workspace file system of team '{team}' is {}, more than the quota of {}: \
                 it is not shrunk (its quota stays {})",
                size_text(size),
                size_text(self.teams.quota().unwrap_or_default()),
                size_text(size)
            )),
        }
    }

    pub(super) fn notice(&mut self, text: String) {
        tracing::warn!("{text}");
        self.notices.push(text);
    }

    fn blocked(&self, team: &str) -> WorkspaceError {
        WorkspaceError::TeamUnavailable {
            team: team.to_string(),
            reason: format!(
                "its file system {} is not mounted, and {} holds files that mounting it would \
                 hide; move them away",
                self.teams.image(team).display(),
                self.dir.join(team).display()
            ),
        }
    }

    /// The size of the team's file system, when its directory is one (`None` for a name no
    /// team can have: it may come from the files helper's hostile channel).
    pub(super) fn team_quota(&self, team: &str) -> Option<u64> {
        crate::store::validate_team(team).ok()?;
        let dir = tree::open_dir(self.fd.as_fd(), &cstring(team)).ok()?;
        if !self.is_mount(&dir) {
            return None;
        }
        self.teams.image_size(team).ok().flatten()
    }

    /// `e`, or [`WorkspaceError::QuotaExceeded`] when it is a write that found the team's
    /// file system full.
    pub(super) fn no_space(&self, team: &str, e: WorkspaceError) -> WorkspaceError {
        match &e {
            WorkspaceError::Io { source, .. } if quota::is_no_space(source) => {
                self.quota_error(team).unwrap_or(e)
            }
            _ => e,
        }
    }

    pub(super) fn team_io(
        &self,
        team: &str,
        op: &'static str,
        source: io::Error,
    ) -> WorkspaceError {
        WorkspaceError::Io {
            place: format!("team '{team}'"),
            op: op.into(),
            path: self.dir.join(team).display().to_string(),
            source,
        }
    }
}
