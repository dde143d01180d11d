//! Finding sandboxes under tenancy, and what a team may do with its own: list, kill, change
//! the timeout or the egress policy, read usage.

use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;

use super::{read, CoreError, LiveSandbox, Manager};
use crate::store::Principal;

/// Filters of a list call.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub metadata: Vec<(String, String)>,
    pub template: Option<String>,
    pub started_after: Option<OffsetDateTime>,
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

    /// The team's sandboxes matching `filter`, oldest first.
    pub fn list(&self, who: &Principal, filter: &ListFilter) -> Vec<Arc<LiveSandbox>> {
        let mut v: Vec<Arc<LiveSandbox>> = read(&self.sandboxes)
            .values()
            .filter(|s| s.team == who.team)
            .filter(|s| {
                filter
                    .metadata
                    .iter()
                    .all(|(k, v)| s.metadata.get(k) == Some(v))
            })
            .filter(|s| filter.template.as_ref().is_none_or(|t| &s.template == t))
            .filter(|s| filter.started_after.is_none_or(|t| s.started_at > t))
            .cloned()
            .collect();
        v.sort_by(|a, b| (a.started_at, &a.id).cmp(&(b.started_at, &b.id)));
        v
    }

    /// Kills a sandbox of `who`'s team.
    pub async fn kill(&self, who: &Principal, id: &str) -> Result<(), CoreError> {
        self.get(who, id)?;
        if self.remove(id).await {
            Ok(())
        } else {
            Err(CoreError::NotFound(id.to_string()))
        }
    }

    /// Sets the sandbox to end `timeout` from now (may shorten).
    pub fn set_timeout(
        &self,
        who: &Principal,
        id: &str,
        timeout: Duration,
    ) -> Result<(), CoreError> {
        let sb = self.get(who, id)?;
        let end = OffsetDateTime::now_utc() + self.clamp_timeout(timeout);
        sb.set_end_at(end);
        let _ = self.store.update_sandbox_end(id, end);
        Ok(())
    }

    /// Connecting extends the timeout to `timeout` from now, never shortens it.
    pub fn connect(
        &self,
        who: &Principal,
        id: &str,
        timeout: Duration,
    ) -> Result<Arc<LiveSandbox>, CoreError> {
        let sb = self.get(who, id)?;
        let end = OffsetDateTime::now_utc() + self.clamp_timeout(timeout);
        if end > sb.end_at() {
            sb.set_end_at(end);
            let _ = self.store.update_sandbox_end(id, end);
        }
        Ok(sb)
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
