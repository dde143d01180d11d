//! Snapshots and forks, with E2B's semantics.
//!
//! A **snapshot** is a template a team makes of one of its running sandboxes: the sandbox is
//! frozen for as long as its writable layer takes to copy (the files helper,
//! `crate::saved_layers`, into `STATE_DIR/snapshots/<id>/`), then thawed; it keeps running
//! with the same id. The snapshot stores only what the sandbox changed over its template:
//! its layers are that copy on top of the layers of the snapshot the sandbox was itself
//! created from (shared, never copied again), over the template's image. A sandbox created
//! from it boots on those layers and runs the template's start command and code contexts
//! again: processes and memory are not part of a snapshot (husk cannot restore them yet).
//!
//! Snapshots belong to a team: only its keys see, use and delete them. They are named by id
//! (`<id>:default`) or, when given a name, `<team>/<name>:<tag>`; a second snapshot under a
//! name takes the name over (E2B: "a new build of the same template").
//!
//! A **fork** is a snapshot no one names, from which `count` sandboxes start with the
//! source's settings (environment, metadata, network, workspaces, limits, lifecycle).
//!
//! A deleted (or replaced, or a fork's) snapshot is *retired*: no longer listed or created
//! from, its files kept while a sandbox (running or paused) or another snapshot stands on
//! them, and removed once none does ([`Manager::collect_snapshots`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use husk_runtime::RootSource;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::saved::Description;
use super::{read, CoreError, LiveSandbox, Manager, PauseMode};
use crate::saved_layers::{Home, LayerRef};
use crate::store::{Principal, SnapshotRow};
use crate::template::{Resolved, TemplateDefaults};

/// The record's format; bump on a change old readers cannot take.
pub const SNAPSHOT_VERSION: u32 = 1;

/// Most sandboxes one fork starts (E2B's bound).
pub const MAX_FORKS: u32 = 20;

/// The default [`super::Config::snapshot_quota`].
pub const DEFAULT_SNAPSHOT_QUOTA: u32 = 1000;

/// The tag of a name given without one.
const DEFAULT_TAG: &str = "default";

/// Whether a snapshot can still be listed and created from by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotState {
    Live,
    /// Deleted, replaced under its name, or a fork's: kept only while something stands on it.
    Retired,
}

impl SnapshotState {
    fn as_str(self) -> &'static str {
        match self {
            SnapshotState::Live => "live",
            SnapshotState::Retired => "retired",
        }
    }
}

/// A snapshot as the store keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub version: u32,
    pub id: String,
    pub team: String,
    /// `<name>:<tag>`, if it was given a name.
    pub name: Option<String>,
    /// The sandbox it was taken of.
    pub source: String,
    /// The template that sandbox was created from, as it was named (its parent).
    pub parent: String,
    /// The template's root (an image, kept while a snapshot uses it).
    pub rootfs: RootSource,
    /// Its layers over that root, top first: its own, then those it was taken over.
    pub layers: Vec<LayerRef>,
    /// The template's defaults: start command, code contexts, user, environment.
    pub defaults: TemplateDefaults,
    /// Unix nanoseconds.
    pub created_at: i128,
    /// Bytes copied into its own layer.
    pub bytes: u64,
    pub state: SnapshotState,
}

impl Snapshot {
    /// What E2B's SDKs call it: `<team>/<name>:<tag>` when it has a name, else `<id>:default`.
    pub fn snapshot_id(&self) -> String {
        match &self.name {
            Some(n) => format!("{}/{n}", self.team),
            None => format!("{}:{DEFAULT_TAG}", self.id),
        }
    }

    /// Its full names (E2B's `names`).
    pub fn names(&self) -> Vec<String> {
        self.name
            .iter()
            .map(|n| format!("{}/{n}", self.team))
            .collect()
    }

    /// As husk's CLI and API list it beside the templates.
    pub fn summary_json(&self) -> serde_json::Value {
        use time::format_description::well_known::Rfc3339;
        serde_json::json!({
            "name": self.snapshot_id(),
            "digest": null,
            "image": null,
            "manifest": null,
            "kind": "snapshot",
            "team": self.team,
            "parent": self.parent,
            "source": self.source,
            "size": self.bytes,
            "layers": self.layers.len(),
            "created_at": self.created_at().format(&Rfc3339).unwrap_or_default(),
        })
    }

    pub fn created_at(&self) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp_nanos(self.created_at)
            .unwrap_or(OffsetDateTime::UNIX_EPOCH)
    }

    /// The store's row.
    fn row(&self) -> Result<SnapshotRow, CoreError> {
        Ok(SnapshotRow {
            id: self.id.clone(),
            team: self.team.clone(),
            name: self.name.clone(),
            state: self.state.as_str().to_owned(),
            digest: match &self.rootfs {
                RootSource::Image { digest, .. } => Some(digest.clone()),
                _ => None,
            },
            created_at: self.created_at(),
            record: serde_json::to_string(self)
                .map_err(|e| CoreError::internal("describing the snapshot", e))?,
        })
    }

    /// A row read back, checked against the row's own id, team and state.
    pub fn from_row(r: &SnapshotRow) -> Result<Snapshot, String> {
        let s: Snapshot = super::saved::read_versioned(&r.record, SNAPSHOT_VERSION, "snapshot")?;
        if s.id != r.id || s.team != r.team || s.state.as_str() != r.state {
            return Err("its record names another snapshot".into());
        }
        crate::saved_layers::check_sandbox(&s.id).map_err(|e| e.to_string())?;
        if s.layers.is_empty() || s.layers.len() > husk_runtime::spec::MAX_SAVED_LAYERS {
            return Err(format!("{} layers", s.layers.len()));
        }
        for l in &s.layers {
            // Checked as names before they are ever paths.
            crate::saved_layers::check_sandbox(&l.owner).map_err(|e| e.to_string())?;
            crate::saved_layers::check_layer(&l.layer).map_err(|e| e.to_string())?;
        }
        Ok(s)
    }

    /// What a sandbox created from it is made of.
    fn resolved(&self) -> Resolved {
        Resolved {
            name: self.snapshot_id(),
            rootfs: self.rootfs.clone(),
            defaults: self.defaults.clone(),
            layers: self.layers.clone(),
            snapshot: Some(self.id.clone()),
        }
    }
}

/// The team's snapshots, and what stands on them while it is being created.
#[derive(Default)]
pub(super) struct SnapshotTable {
    map: HashMap<String, Arc<Snapshot>>,
    /// Snapshots that sandboxes being created (or forks being started) stand on, counted.
    pins: HashMap<String, usize>,
    /// Ids whose records this husk could not read: never collected.
    unread: HashSet<String>,
}

/// A snapshot kept from collection while a sandbox is being created from it.
pub(super) struct Pin {
    manager: std::sync::Weak<Manager>,
    id: String,
}

impl Drop for Pin {
    fn drop(&mut self) {
        let Some(m) = self.manager.upgrade() else {
            return;
        };
        let unpinned_retired = {
            let mut t = m.snapshots.lock().unwrap_or_else(|p| p.into_inner());
            let last = match t.pins.get_mut(&self.id) {
                Some(n) => {
                    *n -= 1;
                    *n == 0
                }
                None => false,
            };
            if last {
                t.pins.remove(&self.id);
            }
            last && (t.map.get(&self.id)).is_some_and(|s| s.state == SnapshotState::Retired)
        };
        // A create from a snapshot deleted meanwhile that failed: nothing else may come to
        // collect it.
        if unpinned_retired {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    m.collect_snapshots().await;
                });
            }
        }
    }
}

/// A name given for a snapshot: `name` or `name:tag`, each part 1–64 characters of
/// `[a-z0-9._-]` starting with a letter or digit. Returns it as `name:tag`.
pub fn canonical_name(given: &str) -> Result<String, CoreError> {
    let (name, tag) = given.split_once(':').unwrap_or((given, DEFAULT_TAG));
    let part_ok = |p: &str| {
        !p.is_empty()
            && p.len() <= 64
            && p.as_bytes()[0].is_ascii_alphanumeric()
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
    };
    if !part_ok(name) || !part_ok(tag) {
        return Err(CoreError::InvalidArgument(format!(
            "invalid snapshot name {:?}: use `name` or `name:tag`, each 1-64 characters of \
             a-z, 0-9, '.', '_' and '-', starting with a letter or digit",
            given.chars().take(140).collect::<String>()
        )));
    }
    Ok(format!("{name}:{tag}"))
}

/// What a list of snapshots is filtered by (E2B's `sandboxID` and `name`).
#[derive(Debug, Default, Clone)]
pub struct SnapshotFilter {
    pub sandbox: Option<String>,
    /// A name or id, optionally tag-qualified or team-qualified.
    pub name: Option<String>,
}

/// Whether `s` (of `team`) is what `given` names: its id (`id`, `id:default`), or its name
/// (`name`, `name:tag`, `team/name`, `team/name:tag`; a name without a tag matches every tag
/// only when `any_tag`).
fn is_named(s: &Snapshot, team: &str, given: &str, any_tag: bool) -> bool {
    if given == s.id || given.strip_suffix(":default") == Some(s.id.as_str()) {
        return true;
    }
    let Some(own) = &s.name else {
        return false;
    };
    let bare = match given.split_once('/') {
        Some((ns, rest)) if ns == team => rest,
        Some(_) => return false,
        None => given,
    };
    if bare.contains(':') {
        return own == bare;
    }
    if any_tag {
        own.split_once(':').is_some_and(|(n, _)| n == bare)
    } else {
        *own == format!("{bare}:{DEFAULT_TAG}")
    }
}

impl Manager {
    fn snapshot_table(&self) -> std::sync::MutexGuard<'_, SnapshotTable> {
        self.snapshots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes up the snapshots the store holds (at start). One whose record cannot be read is
    /// reported and kept whole, with its files.
    pub(super) fn load_snapshots(&self) -> Result<(), CoreError> {
        let rows = self.store.snapshots()?;
        let mut t = self.snapshot_table();
        for r in rows {
            match Snapshot::from_row(&r) {
                Ok(s) => {
                    t.map.insert(s.id.clone(), Arc::new(s));
                }
                Err(e) => {
                    tracing::warn!(snapshot = %r.id, error = %e, "cannot take up a snapshot");
                    t.unread.insert(r.id.clone());
                }
            }
        }
        Ok(())
    }

    /// Removes the retired snapshots nothing stands on (an earlier server's, whose last
    /// sandbox ended with it), and the files no record names (copies cut short). Called at
    /// start, while no sandbox runs.
    pub(super) fn prune_snapshot_files(&self) {
        let Ok(store) = self.layer_store() else {
            return;
        };
        for id in self.forget_unkept_snapshots() {
            if let Err(e) = store.layers.drop_layers(Home::Snapshot, &id, None) {
                tracing::warn!(snapshot = %id, error = %e, "removing a snapshot's files failed");
            }
        }
        let keep: Vec<(String, String)> = {
            let t = self.snapshot_table();
            let own = t.map.values().flat_map(|s| {
                s.layers
                    .iter()
                    .filter(|l| l.home == Home::Snapshot && l.owner == s.id)
                    .map(|l| (l.owner.clone(), l.layer.clone()))
            });
            own.chain(t.unread.iter().map(|id| (id.clone(), String::new())))
                .collect()
        };
        match store.layers.prune(Home::Snapshot, &keep) {
            Ok(0) => {}
            Ok(n) => tracing::info!(count = n, "removed snapshot files no record names"),
            Err(e) => tracing::warn!(error = %e, "could not prune snapshot files"),
        }
    }

    /// What `name` means for a new sandbox of `team`: one of the team's snapshots (by
    /// `team/name[:tag]`, by id, or by name when no template has that name), else a
    /// template. `pin` names the snapshot a sandbox stands on (a fork, a resume), whatever
    /// its state. A snapshot comes with a [`Pin`] held until the sandbox is registered.
    pub(super) async fn resolve_for(
        self: &Arc<Self>,
        team: &str,
        name: &str,
        pin: Option<&str>,
    ) -> Result<(Resolved, Option<Pin>), CoreError> {
        if let Some(id) = pin {
            return self
                .pin_snapshot(Some(id), |s| s.team == team)
                .ok_or_else(|| CoreError::TemplateNotFound(format!("{id}:default")));
        }
        let live = |s: &Snapshot| s.team == team && s.state == SnapshotState::Live;
        if name.contains('/') {
            return self
                .pin_snapshot(None, |s| live(s) && is_named(s, team, name, false))
                .ok_or_else(|| CoreError::TemplateNotFound(name.to_owned()));
        }
        // By id first (a lookup: every create passes here); by bare name only when no
        // template has that name.
        let id = name.strip_suffix(":default").unwrap_or(name);
        if let Some(found) = self.pin_snapshot(Some(id), live) {
            return Ok(found);
        }
        match self.resolve_template(name).await {
            Err(CoreError::TemplateNotFound(n)) => self
                .pin_snapshot(None, |s| live(s) && is_named(s, team, name, false))
                .ok_or(CoreError::TemplateNotFound(n)),
            other => other.map(|r| (r, None)),
        }
    }

    /// The snapshot `id` (or, without one, the first) that `pred` admits, pinned.
    fn pin_snapshot(
        self: &Arc<Self>,
        id: Option<&str>,
        pred: impl Fn(&Snapshot) -> bool,
    ) -> Option<(Resolved, Option<Pin>)> {
        let mut t = self.snapshot_table();
        let s = match id {
            Some(id) => t.map.get(id).filter(|s| pred(s)),
            None => t.map.values().find(|s| pred(s)),
        }?
        .clone();
        *t.pins.entry(s.id.clone()).or_default() += 1;
        Some((
            s.resolved(),
            Some(Pin {
                manager: Arc::downgrade(self),
                id: s.id.clone(),
            }),
        ))
    }

    /// Snapshots a running sandbox of `who`'s team under `name` (if given).
    pub async fn snapshot(
        self: &Arc<Self>,
        who: &Principal,
        id: &str,
        name: Option<&str>,
    ) -> Result<Arc<Snapshot>, CoreError> {
        let name = name.map(canonical_name).transpose()?;
        let sb = self.running(who, id)?;
        // Checked again when it is recorded; here, so that no copy is made for nothing.
        self.check_snapshot_quota(&self.snapshot_table(), &who.team, name.as_ref())?;
        let (snap, _) = self.take_snapshot(&sb, name, SnapshotState::Live).await?;
        Ok(snap)
    }

    /// Whether `team` may have one more live snapshot (named `name`: taking a name over from
    /// one of its snapshots adds none).
    fn check_snapshot_quota(
        &self,
        t: &SnapshotTable,
        team: &str,
        name: Option<&String>,
    ) -> Result<(), CoreError> {
        let live = || (t.map.values()).filter(|s| s.team == team && s.state == SnapshotState::Live);
        let replaces = name.is_some() && live().any(|s| s.name.as_ref() == name);
        let limit = self.config.snapshot_quota;
        if live().count() >= limit as usize && !replaces {
            return Err(CoreError::SnapshotQuotaExceeded {
                team: team.to_owned(),
                limit,
            });
        }
        Ok(())
    }

    /// A running sandbox of `who`'s team; a paused one is a conflict.
    fn running(&self, who: &Principal, id: &str) -> Result<Arc<LiveSandbox>, CoreError> {
        if self.dormant(&who.team, id).is_some() {
            return Err(CoreError::Paused(id.to_owned()));
        }
        let sb = self.get(who, id)?;
        if sb.is_paused() {
            return Err(CoreError::Paused(id.to_owned()));
        }
        Ok(sb)
    }

    /// Copies `sb`'s files into a new snapshot in `state` (named `name`, which it takes over
    /// from a live one of the team), pinned for the caller.
    async fn take_snapshot(
        self: &Arc<Self>,
        sb: &Arc<LiveSandbox>,
        name: Option<String>,
        state: SnapshotState,
    ) -> Result<(Arc<Snapshot>, Pin), CoreError> {
        let store = self.layer_store()?;
        // Room for its own layer and, later, a paused layer of a sandbox made from it.
        if sb.origin.layers.len() + 2 > husk_runtime::spec::MAX_SAVED_LAYERS {
            return Err(CoreError::InvalidArgument(format!(
                "sandbox {} stands on {} snapshots already, the most a snapshot can be taken \
                 over; create a sandbox from its template instead",
                sb.id,
                sb.origin.layers.len()
            )));
        }
        let snap_id = self.new_id()?;
        let captured = {
            let _transition = sb.transition.lock().await;
            if sb.is_paused()
                || !read(&self.sandboxes)
                    .get(&sb.id)
                    .is_some_and(|s| Arc::ptr_eq(s, sb))
            {
                return Err(CoreError::Paused(sb.id.clone()));
            }
            let layers = store.layers.clone();
            let (rid, owner, below) = (sb.runtime_id.clone(), snap_id.clone(), sb.base_layer_ref());
            let _slot = self.capture_slot(&sb.team).await;
            let captured = tokio::task::spawn_blocking(move || {
                layers.capture(&rid, Home::Snapshot, &owner, below.as_ref())
            })
            .await
            .map_err(|e| CoreError::internal("the snapshot task", e));
            // Frozen for the copy only: it goes on whatever came of it.
            self.thaw(sb).await;
            captured?.map_err(super::pause::layer_error)?
        };
        let mut layers = vec![LayerRef {
            home: Home::Snapshot,
            owner: snap_id.clone(),
            layer: captured.layer.clone(),
        }];
        layers.extend(sb.origin.layers.iter().cloned());
        let snap = Arc::new(Snapshot {
            version: SNAPSHOT_VERSION,
            id: snap_id.clone(),
            team: sb.team.clone(),
            name,
            source: sb.id.clone(),
            parent: match &sb.origin.snapshot {
                // A snapshot of a sandbox made from a snapshot: that snapshot's parent.
                Some(p) => (self.snapshot_table().map.get(p))
                    .map_or_else(|| sb.template.clone(), |s| s.parent.clone()),
                None => sb.template.clone(),
            },
            rootfs: sb.origin.rootfs.clone(),
            layers,
            defaults: sb.origin.defaults.clone(),
            created_at: OffsetDateTime::now_utc().unix_timestamp_nanos(),
            bytes: captured.bytes,
            state,
        });
        let recorded = self.record_snapshot(&snap);
        let pin = match recorded {
            Ok(pin) => pin,
            Err(e) => {
                self.drop_snapshot_files(vec![snap_id]).await;
                return Err(e);
            }
        };
        tracing::info!(
            sandbox = %sb.id,
            snapshot = %snap.id,
            bytes = captured.bytes,
            entries = captured.entries,
            "snapshot taken"
        );
        // The one it took the name over from may stand on nothing now.
        self.collect_snapshots().await;
        Ok((snap, pin))
    }

    /// Records a new snapshot (retiring the live one of its name), pinned. The team's quota
    /// of live snapshots is checked here, under the table's lock, where no other snapshot
    /// can be recorded in between (the check before the copy only saves a copy for nothing).
    fn record_snapshot(self: &Arc<Self>, snap: &Arc<Snapshot>) -> Result<Pin, CoreError> {
        let mut t = self.snapshot_table();
        if snap.state == SnapshotState::Live {
            self.check_snapshot_quota(&t, &snap.team, snap.name.as_ref())?;
        }
        let replaced: Vec<Arc<Snapshot>> = match &snap.name {
            Some(n) => (t.map.values())
                .filter(|s| {
                    s.team == snap.team
                        && s.state == SnapshotState::Live
                        && s.name.as_ref() == Some(n)
                })
                .map(|s| {
                    Arc::new(Snapshot {
                        state: SnapshotState::Retired,
                        ..(**s).clone()
                    })
                })
                .collect(),
            None => Vec::new(),
        };
        let mut rows = Vec::with_capacity(replaced.len() + 1);
        for s in &replaced {
            rows.push(s.row()?);
        }
        rows.push(snap.row()?);
        self.store.put_snapshots(&rows)?;
        for s in replaced {
            t.map.insert(s.id.clone(), s);
        }
        t.map.insert(snap.id.clone(), snap.clone());
        *t.pins.entry(snap.id.clone()).or_default() += 1;
        Ok(Pin {
            manager: Arc::downgrade(self),
            id: snap.id.clone(),
        })
    }

    /// The team's live snapshots, newest first.
    pub fn list_snapshots(&self, team: &str, filter: &SnapshotFilter) -> Vec<Arc<Snapshot>> {
        let t = self.snapshot_table();
        let mut out: Vec<Arc<Snapshot>> = (t.map.values())
            .filter(|s| s.team == team && s.state == SnapshotState::Live)
            .filter(|s| filter.sandbox.as_ref().is_none_or(|sb| s.source == *sb))
            .filter(|s| (filter.name.as_ref()).is_none_or(|n| is_named(s, team, n, true)))
            .cloned()
            .collect();
        out.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id)));
        out
    }

    /// Deletes the team's snapshot `given` names (by id or name, a name without a tag meaning
    /// `:default`). Its files go once nothing stands on them. `false` if there is none.
    pub async fn delete_snapshot(&self, team: &str, given: &str) -> Result<bool, CoreError> {
        let retired = {
            let mut t = self.snapshot_table();
            let Some(s) = (t.map.values())
                .find(|s| {
                    s.team == team
                        && s.state == SnapshotState::Live
                        && is_named(s, team, given, false)
                })
                .cloned()
            else {
                return Ok(false);
            };
            let retired = Arc::new(Snapshot {
                state: SnapshotState::Retired,
                ..(*s).clone()
            });
            self.store.put_snapshots(&[retired.row()?])?;
            t.map.insert(retired.id.clone(), retired.clone());
            retired
        };
        tracing::info!(snapshot = %retired.id, team, "snapshot deleted");
        self.collect_snapshots().await;
        Ok(true)
    }

    /// Removes the retired snapshots nothing stands on any more: no running, paused or
    /// starting sandbox, and no snapshot that is kept. Returns how many.
    ///
    /// One collection at a time: a collection that finds nothing left to forget waits for
    /// one under way, so that when a kill returns, the files of the snapshot it was the last
    /// to stand on are gone, even if a collection started elsewhere (a pin dropped) forgot
    /// that snapshot first.
    pub(super) async fn collect_snapshots(&self) -> usize {
        let _one = self.collecting.lock().await;
        let gone = self.forget_unkept_snapshots();
        let n = gone.len();
        if n > 0 {
            self.drop_snapshot_files(gone).await;
            tracing::info!(count = n, "removed snapshots nothing stands on");
        }
        n
    }

    /// Forgets the retired snapshots nothing keeps (records and map); returns their ids, whose
    /// files the caller removes (once forgotten, nothing can name them again).
    fn forget_unkept_snapshots(&self) -> Vec<String> {
        {
            let mut t = self.snapshot_table();
            if !t.map.values().any(|s| s.state == SnapshotState::Retired) {
                return Vec::new();
            }
            let mut roots: HashSet<String> = t.pins.keys().cloned().collect();
            roots.extend(t.unread.iter().cloned());
            roots.extend(
                read(&self.sandboxes)
                    .values()
                    .filter_map(|s| s.origin.snapshot.clone()),
            );
            roots.extend(
                read(&self.dormant)
                    .values()
                    .filter_map(|d| d.description.snapshot.clone()),
            );
            roots.extend(
                (t.map.values())
                    .filter(|s| s.state == SnapshotState::Live)
                    .map(|s| s.id.clone()),
            );
            // Every layer of a kept snapshot keeps its owner (its list holds the whole chain).
            let mut kept = roots.clone();
            for r in &roots {
                if let Some(s) = t.map.get(r) {
                    kept.extend(
                        (s.layers.iter())
                            .filter(|l| l.home == Home::Snapshot)
                            .map(|l| l.owner.clone()),
                    );
                }
            }
            let gone: Vec<String> = (t.map.keys())
                .filter(|id| !kept.contains(*id))
                .cloned()
                .collect();
            for id in &gone {
                if let Err(e) = self.store.delete_snapshot(id) {
                    tracing::warn!(snapshot = %id, error = %e, "could not forget a snapshot");
                }
                t.map.remove(id);
            }
            gone
        }
    }

    async fn drop_snapshot_files(&self, ids: Vec<String>) {
        let Ok(store) = self.layer_store() else {
            return;
        };
        let layers = store.layers.clone();
        let res = tokio::task::spawn_blocking(move || {
            for id in ids {
                if let Err(e) = layers.drop_layers(Home::Snapshot, &id, None) {
                    tracing::warn!(snapshot = %id, error = %e, "removing a snapshot's files failed");
                }
            }
        })
        .await;
        if let Err(e) = res {
            tracing::warn!(error = %e, "the task removing snapshots' files failed");
        }
    }

    /// Forks a running sandbox of `who`'s team: one snapshot of it, then `count` sandboxes
    /// from that snapshot with the source's settings and their own ids, each with a timeout
    /// of `timeout` (else the source's). The source keeps running. One answer per fork.
    pub async fn fork(
        self: &Arc<Self>,
        who: &Principal,
        id: &str,
        count: u32,
        timeout: Option<Duration>,
    ) -> Result<Vec<Result<Arc<LiveSandbox>, CoreError>>, CoreError> {
        if count == 0 || count > MAX_FORKS {
            return Err(CoreError::InvalidArgument(format!(
                "count must be between 1 and {MAX_FORKS}"
            )));
        }
        let sb = self.running(who, id)?;
        let (snap, pin) = self
            .take_snapshot(&sb, None, SnapshotState::Retired)
            .await?;
        let mut req = Description::of(&sb, String::new(), PauseMode::Full).request()?;
        req.timeout = timeout.unwrap_or(sb.timeout);
        // All at once, each its own task; answered in order.
        let tasks: Vec<_> = (0..count)
            .map(|_| {
                let (req, who, pin) = (req.clone(), who.clone(), snap.id.clone());
                let this = self.clone();
                tokio::spawn(async move { this.create_as(&who, req, None, Some(pin)).await })
            })
            .collect();
        let mut results = Vec::with_capacity(tasks.len());
        for t in tasks {
            results.push(
                t.await
                    .unwrap_or_else(|e| Err(CoreError::internal("the fork task", e))),
            );
        }
        drop(pin);
        let ok = results.iter().filter(|r| r.is_ok()).count();
        tracing::info!(sandbox = %id, snapshot = %snap.id, count, started = ok, "forked");
        // Nothing stands on the snapshot if no fork started.
        self.collect_snapshots().await;
        Ok(results)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_canonical_name_and_tag() {
        assert_eq!(canonical_name("my-snap").unwrap(), "my-snap:default");
        assert_eq!(canonical_name("a.b_c:v2").unwrap(), "a.b_c:v2");
        for bad in [
            "", ":", "a:", ":b", "A", "-a", "a/b", "a:b:c", "a b", "../x", "a\0",
        ] {
            assert!(canonical_name(bad).is_err(), "{bad:?}");
        }
        assert!(canonical_name(&"a".repeat(65)).is_err());
        canonical_name(&"a".repeat(64)).unwrap();
    }

    fn snap(name: Option<&str>) -> Snapshot {
        Snapshot {
            version: SNAPSHOT_VERSION,
            id: "abc123".into(),
            team: "t1".into(),
            name: name.map(str::to_owned),
            source: "sb".into(),
            parent: "base".into(),
            rootfs: RootSource::Host,
            layers: vec![LayerRef {
                home: Home::Snapshot,
                owner: "abc123".into(),
                layer: "0123456789abcdef".into(),
            }],
            defaults: TemplateDefaults::default(),
            created_at: 0,
            bytes: 0,
            state: SnapshotState::Live,
        }
    }

    #[test]
    fn a_snapshot_is_named_by_id_or_by_its_teams_name() {
        let s = snap(Some("web:v1"));
        assert_eq!(s.snapshot_id(), "t1/web:v1");
        assert_eq!(s.names(), vec!["t1/web:v1".to_owned()]);
        for yes in ["abc123", "abc123:default", "web:v1", "t1/web:v1"] {
            assert!(is_named(&s, "t1", yes, false), "{yes}");
        }
        for no in ["web", "t1/web", "t2/web:v1", "web:v2", "abc", "abc123:v1"] {
            assert!(!is_named(&s, "t1", no, false), "{no}");
        }
        // A list's filter without a tag matches every tag.
        assert!(is_named(&s, "t1", "web", true));
        assert!(is_named(&s, "t1", "t1/web", true));
        assert!(!is_named(&s, "t1", "t2/web", true));
        let unnamed = snap(None);
        assert_eq!(unnamed.snapshot_id(), "abc123:default");
        assert!(unnamed.names().is_empty());
        assert!(!is_named(&unnamed, "t1", "web", true));
    }

    #[test]
    fn a_record_is_read_back_only_as_the_row_says() {
        let s = snap(Some("web:default"));
        let row = s.row().unwrap();
        assert_eq!(row.digest, None);
        assert_eq!(Snapshot::from_row(&row).unwrap(), s);
        let other_team = SnapshotRow {
            team: "t2".into(),
            ..row.clone()
        };
        assert!(Snapshot::from_row(&other_team).is_err());
        let retired = SnapshotRow {
            state: "retired".into(),
            ..row.clone()
        };
        assert!(Snapshot::from_row(&retired).is_err());
        let newer = SnapshotRow {
            record: row.record.replace("\"version\":1", "\"version\":2"),
            ..row.clone()
        };
        assert!(Snapshot::from_row(&newer)
            .unwrap_err()
            .contains("version is 2"));
        let traversal = SnapshotRow {
            record: row.record.replace("0123456789abcdef", "../../../etc/x"),
            ..row
        };
        assert!(Snapshot::from_row(&traversal).is_err());
    }
}
