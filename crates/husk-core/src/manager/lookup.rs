//! Finding sandboxes under tenancy, and what a team may do with its own: list, kill, change
//! the timeout or the egress policy, read usage.

use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;

use std::collections::BTreeMap;

use super::{read, CoreError, Lifecycle, LiveSandbox, Manager, PauseMode, WorkspaceMount};
use crate::store::Principal;

/// Filters of a list call.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub metadata: Vec<(String, String)>,
    pub template: Option<String>,
    pub started_after: Option<OffsetDateTime>,
    /// Running sandboxes (when neither this nor `paused` is set, both are listed).
    pub running: bool,
    /// Paused sandboxes (in place or on disk).
    pub paused: bool,
}

/// When and why a sandbox was lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostInfo {
    pub at: OffsetDateTime,
    pub reason: String,
}

impl ListFilter {
    /// Whether a sandbox with these properties is listed (checked before its view is made).
    fn admits(
        &self,
        paused: bool,
        metadata: &BTreeMap<String, String>,
        template: &str,
        started_at: OffsetDateTime,
    ) -> bool {
        // Neither state asked for: both.
        let state_ok = (self.running == self.paused) || (self.paused == paused);
        state_ok
            && self
                .metadata
                .iter()
                .all(|(k, v)| metadata.get(k) == Some(v))
            && self.template.as_deref().is_none_or(|t| t == template)
            && self.started_after.is_none_or(|t| started_at > t)
    }
}

/// What a client sees of a sandbox, running or paused: its info and list entries.
#[derive(Debug, Clone)]
pub struct SandboxView {
    pub id: String,
    pub template: String,
    pub started_at: OffsetDateTime,
    /// When it times out; for a paused sandbox, when it was paused.
    pub end_at: OffsetDateTime,
    pub cpu_count: u32,
    pub memory_mb: u64,
    pub disk_mb: u64,
    /// `None` while it runs; how it was paused otherwise.
    pub paused: Option<PauseMode>,
    pub access_token: String,
    pub traffic_access_token: String,
    pub metadata: BTreeMap<String, String>,
    pub allow_internet_access: Option<bool>,
    pub network: husk_net::NetPolicy,
    pub net_rules: crate::net_rules::NetRules,
    pub public_traffic: bool,
    pub mask_request_host: Option<String>,
    pub workspaces: Vec<WorkspaceMount>,
    pub lifecycle: Lifecycle,
    /// Set for a sandbox that ended with the server that ran it.
    pub lost: Option<LostInfo>,
}

impl SandboxView {
    /// A lost sandbox: what its record kept (the rest is gone with it).
    fn of_lost(l: &crate::store::LostSandbox) -> SandboxView {
        SandboxView {
            id: l.record.id.clone(),
            template: l.record.template.clone(),
            started_at: l.record.created_at,
            end_at: l.lost_at,
            cpu_count: 0,
            memory_mb: 0,
            disk_mb: 0,
            paused: None,
            access_token: String::new(),
            traffic_access_token: String::new(),
            metadata: l.record.metadata.clone(),
            allow_internet_access: None,
            network: husk_net::NetPolicy::None,
            net_rules: crate::net_rules::NetRules::default(),
            public_traffic: false,
            mask_request_host: None,
            workspaces: Vec::new(),
            lifecycle: Lifecycle::default(),
            lost: Some(LostInfo {
                at: l.lost_at,
                reason: l.reason.clone(),
            }),
        }
    }

    fn of_live(sb: &LiveSandbox) -> SandboxView {
        SandboxView {
            id: sb.id.clone(),
            template: sb.template.clone(),
            started_at: sb.started_at,
            end_at: sb.end_at(),
            cpu_count: sb.cpu_count(),
            memory_mb: sb.memory_mb(),
            disk_mb: sb.disk_mb(),
            paused: sb.is_paused().then_some(PauseMode::Full),
            access_token: sb.access_token.clone(),
            traffic_access_token: sb.traffic_access_token.clone(),
            metadata: sb.metadata.clone(),
            allow_internet_access: sb.allow_internet_access,
            network: sb.network_policy(),
            net_rules: sb.net_rules(),
            public_traffic: sb.public_traffic,
            mask_request_host: sb.mask_request_host.as_ref().map(|m| m.as_str().to_owned()),
            workspaces: sb.workspaces.clone(),
            lifecycle: sb.lifecycle,
            lost: None,
        }
    }

    fn of_dormant(d: &super::Dormant) -> SandboxView {
        let d = d.description();
        let limits = &d.limits;
        SandboxView {
            id: d.id.clone(),
            template: d.template.clone(),
            started_at: d.started_at(),
            end_at: d.paused_at(),
            cpu_count: limits.cpu_millis.div_ceil(1000).max(1) as u32,
            memory_mb: limits.memory_bytes >> 20,
            disk_mb: limits.disk_bytes >> 20,
            paused: Some(PauseMode::Filesystem),
            access_token: d.access_token.clone(),
            traffic_access_token: d.traffic_access_token.clone(),
            metadata: d.metadata.clone(),
            allow_internet_access: d.allow_internet_access,
            network: d.network.clone().unwrap_or(husk_net::NetPolicy::None),
            net_rules: d.rules.clone(),
            public_traffic: d.public_traffic,
            mask_request_host: d.mask_request_host.clone(),
            workspaces: d.workspaces.clone(),
            lifecycle: d.lifecycle,
            lost: None,
        }
    }
}

impl Manager {
    /// A live sandbox of `who`'s team.
    pub fn get(&self, who: &Principal, id: &str) -> Result<Arc<LiveSandbox>, CoreError> {
        read(&self.sandboxes)
            .get(id)
            .filter(|s| s.team == who.team)
            .cloned()
            .ok_or_else(|| CoreError::NotFound(id.to_string()))
    }

    /// A live sandbox by id alone (the in-sandbox API authenticates by the sandbox's access
    /// token instead of an API key).
    pub fn get_any(&self, id: &str) -> Option<Arc<LiveSandbox>> {
        read(&self.sandboxes).get(id).cloned()
    }

    /// Every live sandbox, of every team: for a request that names no sandbox but proves
    /// which one it is for by a secret of the sandbox's (a signed file URL). Taken under the
    /// lock and returned, so that the caller's checks do not hold it.
    pub fn all_sandboxes(&self) -> Vec<Arc<LiveSandbox>> {
        read(&self.sandboxes).values().cloned().collect()
    }

    /// A sandbox of `who`'s team as its info shows it, running or paused.
    pub fn view(&self, who: &Principal, id: &str) -> Result<SandboxView, CoreError> {
        if let Ok(sb) = self.get(who, id) {
            return Ok(SandboxView::of_live(&sb));
        }
        match self.dormant(&who.team, id) {
            Some(d) => Ok(SandboxView::of_dormant(&d)),
            None => Err(self.not_found(&who.team, id)),
        }
    }

    /// Why no sandbox `id` of `team` is there: it was lost (when and why), or it is not known.
    pub(super) fn not_found(&self, team: &str, id: &str) -> CoreError {
        match self.store.lost_sandboxes(Some(team), Some(id)) {
            Ok(l) if !l.is_empty() => CoreError::Lost {
                id: id.to_owned(),
                at: l[0]
                    .lost_at
                    .format(&time::format_description::well_known::Rfc3339)
                    .unwrap_or_default(),
                reason: l[0].reason.clone(),
            },
            _ => CoreError::NotFound(id.to_owned()),
        }
    }

    /// The team's lost sandboxes matching `filter`'s metadata, template and start, most
    /// recently lost first.
    pub fn lost_views(
        &self,
        who: &Principal,
        filter: &ListFilter,
    ) -> Result<Vec<SandboxView>, CoreError> {
        let all = ListFilter {
            running: false,
            paused: false,
            ..filter.clone()
        };
        Ok((self.store.lost_sandboxes(Some(&who.team), None)?.iter())
            .filter(|l| {
                let r = &l.record;
                all.admits(false, &r.metadata, &r.template, r.created_at)
            })
            .map(SandboxView::of_lost)
            .collect())
    }

    /// The team's sandboxes, running and paused, matching `filter`, oldest first.
    pub fn list_views(&self, who: &Principal, filter: &ListFilter) -> Vec<SandboxView> {
        let mut v: Vec<SandboxView> = read(&self.sandboxes)
            .values()
            .filter(|s| s.team == who.team)
            .filter(|s| filter.admits(s.is_paused(), &s.metadata, &s.template, s.started_at))
            .map(|s| SandboxView::of_live(s))
            .collect();
        v.extend(
            self.dormant_of(&who.team)
                .iter()
                .filter(|d| {
                    let d = d.description();
                    filter.admits(true, &d.metadata, &d.template, d.started_at())
                })
                .map(|d| SandboxView::of_dormant(d)),
        );
        v.sort_by(|a, b| (a.started_at, &a.id).cmp(&(b.started_at, &b.id)));
        v
    }

    /// Kills a sandbox of `who`'s team, running or paused.
    pub async fn kill(&self, who: &Principal, id: &str) -> Result<(), CoreError> {
        let killed = (self.get(who, id).is_ok() && self.remove(id).await)
            || self.kill_dormant(&who.team, id).await
            // A resume under way when the kill came has made it live meanwhile.
            || (self.get(who, id).is_ok() && self.remove(id).await);
        if killed {
            self.count_end(super::EndReason::Killed);
            return Ok(());
        }
        // A lost one is not there to kill either; the answer says what became of it.
        Err(self.not_found(&who.team, id))
    }

    /// Sets the sandbox to end `timeout` from now (may shorten).
    pub fn set_timeout(
        &self,
        who: &Principal,
        id: &str,
        timeout: Duration,
    ) -> Result<(), CoreError> {
        if self.dormant(&who.team, id).is_some() {
            return Err(CoreError::Paused(id.to_string()));
        }
        let sb = self.get(who, id)?;
        if sb.is_paused() {
            return Err(CoreError::Paused(id.to_string()));
        }
        let end = OffsetDateTime::now_utc() + self.clamp_timeout(timeout);
        sb.set_end_at(end);
        let _ = self.store.update_sandbox_end(id, end);
        Ok(())
    }

    /// How many sandboxes are alive.
    pub fn count(&self) -> usize {
        read(&self.sandboxes).len()
    }

    /// Changes a running sandbox's egress policy and header rules (empty: none), both
    /// replaced as E2B's update does.
    pub async fn set_network_policy(
        &self,
        who: &Principal,
        id: &str,
        policy: husk_net::NetPolicy,
        rules: crate::net_rules::NetRules,
    ) -> Result<(), CoreError> {
        if self.dormant(&who.team, id).is_some() {
            return Err(CoreError::Paused(id.to_string()));
        }
        let sb = self.get(who, id)?;
        let Some(net) = &sb.net else {
            if policy == husk_net::NetPolicy::None && rules.is_empty() {
                return Ok(());
            }
            return Err(CoreError::Unsupported(
                "this server gives sandboxes no network (start husk serve with --egress)".into(),
            ));
        };
        if !rules.is_empty() && net.ca_pem().is_none() {
            return Err(CoreError::InvalidArgument(
                husk_net::sandboxes::NoCa.to_string(),
            ));
        }
        let resolved = self.resolve_rules(&sb.team, &rules)?;
        let sb2 = sb.clone();
        tokio::task::spawn_blocking(move || match &sb2.net {
            Some(net) => net.set_policy(policy, resolved),
            None => Ok(()),
        })
        .await
        .map_err(|e| CoreError::internal("the policy task", e))?
        .map_err(|e| CoreError::internal("changing the sandbox's egress policy", e))?;
        *sb.net_rules.lock().unwrap_or_else(|p| p.into_inner()) = rules;
        sb.changed.notify_one();
        Ok(())
    }

    /// `rules` with `team`'s secrets filled in (the values go to the network helper only).
    pub(super) fn resolve_rules(
        &self,
        team: &str,
        rules: &crate::net_rules::NetRules,
    ) -> Result<husk_net::rules::HeaderRules, CoreError> {
        use crate::net_rules::NetRulesError;
        rules
            .resolve(team, self.secrets().map(|s| s.as_ref()))
            .map_err(|e| match e {
                NetRulesError::Secret {
                    source: crate::secrets::SecretError::Store(s),
                    ..
                } => CoreError::Store(s),
                other => CoreError::InvalidArgument(other.to_string()),
            })
    }
}
