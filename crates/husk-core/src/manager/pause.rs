//! Pausing and resuming, with E2B's semantics.
//!
//! - A **full** pause freezes every process of the sandbox in place (its cgroup's freezer): it
//!   keeps its memory, processes, connections and id, costs no CPU, and resumes in about a
//!   millisecond by thawing. It stays in the live map, marked paused.
//! - A **filesystem** pause copies the sandbox's writable layer to disk (the files helper,
//!   `crate::saved_layers`), records the sandbox in the store and destroys it: its processes
//!   end and its memory is freed. It is then *dormant*: known by id, team, metadata and
//!   credentials, in the store and here. A resume boots a new sandbox with the same id on the
//!   saved layer (the template's start command runs again), and the layer stays its base until
//!   it is killed, or merged into the next layer when it is paused again.
//!
//! Paused sandboxes do not count against the team's quota of running sandboxes; they have a
//! quota of their own ([`super::Config::paused_quota`]). They never time out; an operator's
//! retention is left to `husk sandbox kill`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;

use super::saved::Description;
use super::{read, write, CoreError, LiveSandbox, Manager, PauseMode};
use crate::saved_layers::{Home, LayerError, LayerRef, SavedLayers};
use crate::store::Principal;

/// A sandbox paused to disk.
pub struct Dormant {
    pub(super) description: Description,
    /// Held while it is being resumed, so that two resumes boot it once.
    pub(super) resuming: tokio::sync::Mutex<()>,
}

impl Dormant {
    pub fn description(&self) -> &Description {
        &self.description
    }
}

/// The answer of a pause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paused {
    /// It is paused now.
    Paused,
    /// It was paused already (E2B answers 409).
    AlreadyPaused,
}

/// What the credentials of a request to a paused sandbox are checked against before the
/// request may resume it (a request that would not be let in must not wake it either).
pub struct Credentials<'a> {
    pub access_token: &'a str,
    pub traffic_access_token: &'a str,
    pub public_traffic: bool,
}

/// Why no running sandbox answers a request to its own API.
#[derive(Debug)]
pub enum Inactive {
    NotFound,
    /// Paused, and the request may not (or cannot) resume it.
    Paused,
    /// It was to be resumed, and that failed.
    ResumeFailed(CoreError),
}

/// Where saved layers are made and found.
pub(super) struct LayerStore {
    pub(super) layers: Arc<dyn SavedLayers>,
    pub(super) state_dir: PathBuf,
}

pub(super) fn layer_error(e: LayerError) -> CoreError {
    match e {
        LayerError::Unavailable => CoreError::Unsupported(e.to_string()),
        other => CoreError::internal("saving the sandbox's files", other),
    }
}

impl Manager {
    /// Lets sandboxes be paused to disk: their layers are saved by `layers`, below
    /// `state_dir`. Also takes up the sandboxes an earlier server left paused there.
    pub fn set_saved_layers(&self, layers: Arc<dyn SavedLayers>, state_dir: PathBuf) {
        let _ = self.layer_store.set(LayerStore { layers, state_dir });
        // Without the records, nothing can be told apart: nothing is removed.
        if let Ok(unread) = self.load_dormant() {
            self.prune_layers(unread);
        }
        match self.load_snapshots() {
            Ok(()) => self.prune_snapshot_files(),
            Err(e) => tracing::warn!(error = %e, "cannot read the snapshots"),
        }
    }

    /// Removes the saved layers no paused sandbox needs: those a sandbox booted on and
    /// kept until it was killed, when the server that ran it stopped without killing it
    /// (a crash), and copies cut short. Called at start, while no sandbox runs.
    fn prune_layers(&self, unread: Vec<String>) {
        let Some(store) = self.layer_store.get() else {
            return;
        };
        let keep: Vec<(String, String)> = read(&self.dormant)
            .values()
            .map(|d| (d.description.id.clone(), d.description.layer.clone()))
            .chain(unread.into_iter().map(|id| (id, String::new())))
            .collect();
        match store.layers.prune(Home::Paused, &keep) {
            Ok(0) => {}
            Ok(n) => tracing::info!(count = n, "removed saved files no paused sandbox needs"),
            Err(e) => tracing::warn!(error = %e, "could not prune saved files"),
        }
    }

    /// A place among the team's layer copies (pauses to disk and snapshots) under way: at
    /// most [`CAPTURES_PER_TEAM`] at once, the rest wait, so one team's copies never take
    /// every channel of the files helper from the others'.
    pub(super) async fn capture_slot(&self, team: &str) -> tokio::sync::OwnedSemaphorePermit {
        let slots = {
            let mut map = self.capture_slots.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(team.to_owned())
                .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(CAPTURES_PER_TEAM)))
                .clone()
        };
        // Never closed: acquiring cannot fail.
        slots
            .acquire_owned()
            .await
            .expect("a semaphore that is never closed")
    }

    pub(super) fn layer_store(&self) -> Result<&LayerStore, CoreError> {
        self.layer_store
            .get()
            .ok_or_else(|| layer_error(LayerError::Unavailable))
    }

    /// The path of a saved layer (what a sandbox's spec names).
    pub(super) fn layer_path(&self, layer: &LayerRef) -> Result<PathBuf, CoreError> {
        layer
            .path(&self.layer_store()?.state_dir)
            .map_err(|e| CoreError::internal("a saved layer's name", e))
    }

    /// The sandboxes paused to disk that the store holds (an earlier server's): each is
    /// taken up as it was. One whose description cannot be read is left in the store and
    /// reported (a newer husk wrote it, say), never deleted.
    /// Returns the ids of the records it could not read (their files are kept whole).
    fn load_dormant(&self) -> Result<Vec<String>, ()> {
        let records = match self.store.saved_sandboxes() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the paused sandboxes");
                return Err(());
            }
        };
        let mut unread = Vec::new();
        let mut map = write(&self.dormant);
        for r in records {
            match Description::from_record(&r) {
                Ok(description) => {
                    map.insert(
                        r.id.clone(),
                        Arc::new(Dormant {
                            description,
                            resuming: tokio::sync::Mutex::new(()),
                        }),
                    );
                }
                Err(e) => {
                    tracing::warn!(sandbox = %r.id, error = %e, "cannot take up a paused sandbox");
                    unread.push(r.id.clone());
                }
            }
        }
        if !map.is_empty() {
            tracing::info!(count = map.len(), "took up sandboxes paused to disk");
        }
        Ok(unread)
    }

    /// A dormant sandbox of `who`'s team.
    pub(super) fn dormant(&self, team: &str, id: &str) -> Option<Arc<Dormant>> {
        read(&self.dormant)
            .get(id)
            .filter(|d| d.description.team == team)
            .cloned()
    }

    /// The team's dormant sandboxes.
    pub(super) fn dormant_of(&self, team: &str) -> Vec<Arc<Dormant>> {
        read(&self.dormant)
            .values()
            .filter(|d| d.description.team == team)
            .cloned()
            .collect()
    }

    /// Whether a sandbox of `who`'s team is paused (in place or on disk).
    pub fn is_paused(&self, who: &Principal, id: &str) -> Result<bool, CoreError> {
        if self.dormant(&who.team, id).is_some() {
            return Ok(true);
        }
        self.get(who, id).map(|sb| sb.is_paused())
    }

    /// How many sandboxes of `team` are paused (in place or on disk).
    fn paused_count(&self, team: &str) -> usize {
        let resident = read(&self.sandboxes)
            .values()
            .filter(|s| s.team == team && s.is_paused())
            .count();
        let dormant = read(&self.dormant)
            .values()
            .filter(|d| d.description.team == team)
            .count();
        resident + dormant
    }

    /// Pauses a sandbox of `who`'s team.
    pub async fn pause(
        self: &Arc<Self>,
        who: &Principal,
        id: &str,
        mode: PauseMode,
    ) -> Result<Paused, CoreError> {
        if self.dormant(&who.team, id).is_some() {
            return Ok(Paused::AlreadyPaused);
        }
        let sb = self.get(who, id)?;
        if sb.is_paused() {
            return Ok(Paused::AlreadyPaused);
        }
        let limit = self.config.paused_quota;
        if self.paused_count(&who.team) >= limit as usize {
            return Err(CoreError::PausedQuotaExceeded {
                team: who.team.clone(),
                limit,
            });
        }
        self.pause_sandbox(&sb, mode).await
    }

    /// Pauses `sb` (a kill or another pause may have got there first).
    pub(super) async fn pause_sandbox(
        self: &Arc<Self>,
        sb: &Arc<LiveSandbox>,
        mode: PauseMode,
    ) -> Result<Paused, CoreError> {
        let _transition = sb.transition.lock().await;
        if !read(&self.sandboxes)
            .get(&sb.id)
            .is_some_and(|s| Arc::ptr_eq(s, sb))
        {
            return Err(CoreError::NotFound(sb.id.clone()));
        }
        match mode {
            PauseMode::Full => {
                if sb.is_paused() {
                    return Ok(Paused::AlreadyPaused);
                }
                self.clear_backstop(sb).await;
                let host = self.host.clone();
                let rid = sb.runtime_id.clone();
                tokio::task::spawn_blocking(move || host.freeze(&rid))
                    .await
                    .map_err(|e| CoreError::internal("the pause task", e))?
                    .map_err(|e| CoreError::internal("freezing the sandbox", e))?;
                *sb.paused_at.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(OffsetDateTime::now_utc());
                sb.paused.store(true, Ordering::Release);
                // The supervisor stops counting its timeout.
                sb.timeout_changed.notify_one();
                tracing::info!(sandbox = %sb.id, "paused in place");
                Ok(Paused::Paused)
            }
            // A sandbox paused in place is saved as it is (its processes stay frozen while
            // its files are copied, then end).
            PauseMode::Filesystem => {
                self.save_to_disk(sb, PauseMode::Filesystem).await?;
                Ok(Paused::Paused)
            }
        }
    }

    /// Copies `sb`'s files to disk, records it as dormant and destroys it. The caller holds
    /// its transition lock.
    async fn save_to_disk(
        self: &Arc<Self>,
        sb: &Arc<LiveSandbox>,
        mode: PauseMode,
    ) -> Result<(), CoreError> {
        let store = self.layer_store()?;
        let layers = store.layers.clone();
        let (rid, id, below) = (sb.runtime_id.clone(), sb.id.clone(), sb.base_layer_ref());
        let _slot = self.capture_slot(&sb.team).await;
        let captured = tokio::task::spawn_blocking(move || {
            layers.capture(&rid, Home::Paused, &id, below.as_ref())
        })
        .await
        .map_err(|e| CoreError::internal("the pause task", e))?;
        let captured = match captured {
            Ok(c) => c,
            Err(e) => {
                // The capture may have frozen it: it goes on as it was.
                if !sb.is_paused() {
                    self.thaw(sb).await;
                }
                return Err(layer_error(e));
            }
        };
        let description = Description::of(sb, captured.layer.clone(), mode);
        let recorded = description
            .record()
            .and_then(|r| self.store.put_saved_sandbox(&r).map_err(CoreError::Store));
        if let Err(e) = recorded {
            let (layers, id, layer) = (store.layers.clone(), sb.id.clone(), captured.layer);
            let _ = tokio::task::spawn_blocking(move || {
                layers.drop_layers(Home::Paused, &id, Some(&layer))
            })
            .await;
            if !sb.is_paused() {
                self.thaw(sb).await;
            }
            return Err(e);
        }
        // Dormant before it stops being live: a lookup always finds one or the other.
        write(&self.dormant).insert(
            sb.id.clone(),
            Arc::new(Dormant {
                description,
                resuming: tokio::sync::Mutex::new(()),
            }),
        );
        self.remove_with(&sb.id, false).await;
        // The layer it was booted on is merged into the new one.
        if let Some(old) = sb.base_layer.clone() {
            let (layers, id) = (store.layers.clone(), sb.id.clone());
            let _ = tokio::task::spawn_blocking(move || {
                layers.drop_layers(Home::Paused, &id, Some(&old))
            })
            .await;
        }
        tracing::info!(
            sandbox = %sb.id,
            bytes = captured.bytes,
            entries = captured.entries,
            "paused to disk"
        );
        Ok(())
    }

    pub(super) async fn thaw(&self, sb: &LiveSandbox) {
        let host = self.host.clone();
        let rid = sb.runtime_id.clone();
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || host.thaw(&rid)).await {
            tracing::warn!(sandbox = %sb.id, error = %e, "thawing failed");
        }
    }

    /// Connects to a sandbox of `who`'s team, resuming it if it is paused (its timeout then
    /// `timeout` from now, else the one it was created with); for a running one the timeout
    /// is extended to `timeout` from now, never shortened. With `reboot`, a sandbox paused in
    /// place is booted again on its files instead of thawed (E2B's `on_resume="reboot"`).
    /// Returns whether it was resumed.
    pub async fn resume(
        self: &Arc<Self>,
        who: &Principal,
        id: &str,
        timeout: Option<Duration>,
        reboot: bool,
    ) -> Result<(Arc<LiveSandbox>, bool), CoreError> {
        if let Ok(sb) = self.get(who, id) {
            if sb.is_paused() && reboot {
                {
                    let _transition = sb.transition.lock().await;
                    if sb.is_paused() {
                        self.save_to_disk(&sb, PauseMode::Full).await?;
                    }
                }
                if let Some(d) = self.dormant(&who.team, id) {
                    return self.resume_from_disk(who, d, timeout).await;
                }
            }
            if sb.is_paused() {
                let resumed = self.resume_in_place(&sb, timeout).await?;
                return Ok((sb, resumed));
            }
            if let Some(t) = timeout {
                let end = OffsetDateTime::now_utc() + self.clamp_timeout(t);
                if end > sb.end_at() {
                    sb.set_end_at(end);
                    let _ = self.store.update_sandbox_end(id, end);
                }
            }
            return Ok((sb, false));
        }
        match self.dormant(&who.team, id) {
            Some(d) => self.resume_from_disk(who, d, timeout).await,
            None => Err(self.not_found(&who.team, id)),
        }
    }

    /// Thaws a sandbox paused in place; `false` when another resume got there first.
    async fn resume_in_place(
        self: &Arc<Self>,
        sb: &Arc<LiveSandbox>,
        timeout: Option<Duration>,
    ) -> Result<bool, CoreError> {
        let _transition = sb.transition.lock().await;
        if !sb.is_paused() {
            return Ok(false);
        }
        // It takes a place among the team's running sandboxes again.
        let reservation = self.reserve(&sb.team)?;
        let host = self.host.clone();
        let rid = sb.runtime_id.clone();
        tokio::task::spawn_blocking(move || host.thaw(&rid))
            .await
            .map_err(|e| CoreError::internal("the resume task", e))?
            .map_err(|e| CoreError::internal("thawing the sandbox", e))?;
        let end = OffsetDateTime::now_utc() + self.clamp_timeout(timeout.unwrap_or(sb.timeout));
        reservation.settle(|| sb.paused.store(false, Ordering::Release));
        sb.set_end_at(end);
        let _ = self.store.update_sandbox_end(&sb.id, end);
        tracing::info!(sandbox = %sb.id, "resumed in place");
        Ok(true)
    }

    /// Boots a dormant sandbox again on its saved files.
    async fn resume_from_disk(
        self: &Arc<Self>,
        who: &Principal,
        d: Arc<Dormant>,
        timeout: Option<Duration>,
    ) -> Result<(Arc<LiveSandbox>, bool), CoreError> {
        let id = d.description.id.clone();
        let _resuming = d.resuming.lock().await;
        if !read(&self.dormant)
            .get(&id)
            .is_some_and(|x| Arc::ptr_eq(x, &d))
        {
            // Resumed (or killed) meanwhile.
            return self.get(who, &id).map(|sb| (sb, false));
        }
        let mut req = d.description.request()?;
        if let Some(t) = timeout {
            req.timeout = t;
        }
        let owner = Principal {
            team: d.description.team.clone(),
            key_id: who.key_id.clone(),
            admin: false,
        };
        let sb = self
            .create_as(
                &owner,
                req,
                Some(d.description.identity()),
                d.description.snapshot.clone(),
            )
            .await?;
        write(&self.dormant).remove(&id);
        if let Err(e) = self.store.delete_saved_sandbox(&id) {
            tracing::warn!(sandbox = %id, error = %e, "could not forget the paused sandbox's record");
        }
        tracing::info!(sandbox = %id, "resumed from disk");
        Ok((sb, true))
    }

    /// The running sandbox `id` for a request to its own API, resumed first if it is paused
    /// with auto-resume and `admitted` says the request's credentials would let it in.
    pub async fn active(
        self: &Arc<Self>,
        id: &str,
        admitted: impl FnOnce(&Credentials<'_>) -> bool,
    ) -> Result<Arc<LiveSandbox>, Inactive> {
        if let Some(sb) = self.get_any(id) {
            if !sb.is_paused() {
                return Ok(sb);
            }
            let creds = Credentials {
                access_token: &sb.access_token,
                traffic_access_token: &sb.traffic_access_token,
                public_traffic: sb.public_traffic,
            };
            if !sb.lifecycle.auto_resume || !admitted(&creds) {
                return Err(Inactive::Paused);
            }
            return match self.resume_in_place(&sb, None).await {
                Ok(_) => Ok(sb),
                Err(e) => Err(Inactive::ResumeFailed(e)),
            };
        }
        let d = read(&self.dormant).get(id).cloned();
        let Some(d) = d else {
            return Err(Inactive::NotFound);
        };
        let desc = &d.description;
        let creds = Credentials {
            access_token: &desc.access_token,
            traffic_access_token: &desc.traffic_access_token,
            public_traffic: desc.public_traffic,
        };
        if !desc.lifecycle.auto_resume || !admitted(&creds) {
            return Err(Inactive::Paused);
        }
        let who = Principal {
            team: desc.team.clone(),
            key_id: "auto-resume".into(),
            admin: false,
        };
        match self.resume_from_disk(&who, d.clone(), None).await {
            Ok((sb, _)) => Ok(sb),
            Err(e) => Err(Inactive::ResumeFailed(e)),
        }
    }

    /// Kills a dormant sandbox of `team`: its record and its files. `false` if none.
    pub(super) async fn kill_dormant(&self, team: &str, id: &str) -> bool {
        let Some(d) = self.dormant(team, id) else {
            return false;
        };
        let _resuming = d.resuming.lock().await;
        if write(&self.dormant).remove(id).is_none() {
            return false;
        }
        if let Err(e) = self.store.delete_saved_sandbox(id) {
            tracing::warn!(sandbox = %id, error = %e, "could not forget the paused sandbox's record");
        }
        self.drop_layers(id).await;
        if d.description.snapshot.is_some() {
            self.collect_snapshots().await;
        }
        true
    }

    /// Removes every saved layer of sandbox `id`.
    pub(super) async fn drop_layers(&self, id: &str) {
        let Ok(store) = self.layer_store() else {
            return;
        };
        let (layers, id) = (store.layers.clone(), id.to_owned());
        let res =
            tokio::task::spawn_blocking(move || layers.drop_layers(Home::Paused, &id, None)).await;
        if let Ok(Err(e)) = res {
            tracing::warn!(error = %e, "removing a sandbox's saved files failed");
        }
    }

    /// Kills the sandboxes paused for longer than the operator's retention (paused in place
    /// or on disk). Returns how many.
    pub async fn expire_paused(&self) -> usize {
        let Some(keep) = self.config.paused_retention else {
            return 0;
        };
        let before = OffsetDateTime::now_utc() - keep;
        let resident: Vec<String> = read(&self.sandboxes)
            .values()
            .filter(|s| {
                s.is_paused()
                    && s.paused_at
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .is_some_and(|t| t < before)
            })
            .map(|s| s.id.clone())
            .collect();
        let dormant: Vec<(String, String)> = read(&self.dormant)
            .values()
            .filter(|d| d.description.paused_at() < before)
            .map(|d| (d.description.team.clone(), d.description.id.clone()))
            .collect();
        let mut n: usize = 0;
        for id in resident {
            if self.remove(&id).await {
                n += 1;
            }
        }
        for (team, id) in dormant {
            if self.kill_dormant(&team, &id).await {
                n += 1;
            }
        }
        self.count_ends(super::EndReason::Timeout, n as u64);
        if n > 0 {
            tracing::info!(count = n, "killed sandboxes paused beyond the retention");
        }
        n
    }

    /// Checks the retention every minute until the manager is dropped.
    pub fn spawn_paused_expiry(self: &Arc<Self>) {
        if self.config.paused_retention.is_none() {
            return;
        }
        let manager = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(60));
            loop {
                tick.tick().await;
                let Some(m) = manager.upgrade() else { return };
                m.expire_paused().await;
            }
        });
    }

    /// At the server's stop: sandboxes paused in place are saved to disk (their memory cannot
    /// outlive this server yet; their files do). Returns how many were saved.
    pub(super) async fn save_paused_at_stop(self: &Arc<Self>) -> usize {
        let paused: Vec<Arc<LiveSandbox>> = read(&self.sandboxes)
            .values()
            .filter(|s| s.is_paused())
            .cloned()
            .collect();
        let mut saved = 0;
        for sb in paused {
            let _transition = sb.transition.lock().await;
            match self.save_to_disk(&sb, PauseMode::Full).await {
                Ok(()) => saved += 1,
                Err(e) => {
                    tracing::warn!(sandbox = %sb.id, error = %e, "could not save a paused sandbox")
                }
            }
        }
        saved
    }
}

/// Layer copies one team may have under way at once.
pub(super) const CAPTURES_PER_TEAM: usize = 2;

/// The dormant map's type.
pub(super) type DormantMap = HashMap<String, Arc<Dormant>>;
