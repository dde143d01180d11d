//! A sandbox paused to disk, as the store keeps it: everything a resume needs to boot it again
//! as the same sandbox (id, team, credentials, what it was created with) beside the name of its
//! saved layer. Versioned: a newer husk reads what an older one wrote, or says why not.

use std::collections::BTreeMap;
use std::time::Duration;

use husk_runtime::Limits;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::{CoreError, CreateRequest, EnvVars, Lifecycle, LiveSandbox, MaskedHost, PauseMode};
use super::{Identity, WorkspaceMount};
use crate::net_rules::NetRules;
use crate::store::SavedSandboxRecord;

/// The description's format; bump on a change old readers cannot take (and read the old one).
pub const DESCRIPTION_VERSION: u32 = 1;

/// A sandbox kept on disk while paused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Description {
    pub version: u32,
    pub id: String,
    pub team: String,
    pub template: String,
    /// Unix nanoseconds.
    pub started_at: i128,
    /// Unix nanoseconds.
    pub paused_at: i128,
    /// The timeout it was created with, in seconds.
    pub timeout_secs: u64,
    pub metadata: BTreeMap<String, String>,
    /// As created (secrets as `husk-secret://` references, never their values).
    pub env: Vec<(String, String)>,
    pub limits: Limits,
    pub workspaces: Vec<WorkspaceMount>,
    /// Its egress policy; `None`: it had no link out.
    pub network: Option<husk_net::NetPolicy>,
    /// Header rules as written (placeholders, not secrets).
    pub rules: NetRules,
    pub allow_internet_access: Option<bool>,
    pub public_traffic: bool,
    pub mask_request_host: Option<String>,
    pub access_token: String,
    pub traffic_access_token: String,
    pub lifecycle: Lifecycle,
    /// Its saved layer (below `STATE_DIR/paused/<id>/`).
    pub layer: String,
    /// How it was paused (a full pause is saved to disk when the server stops).
    pub mode: PauseMode,
    /// The snapshot it was created from (its layers stay while it is paused).
    #[serde(default)]
    pub snapshot: Option<String>,
}

/// A record of the core's (JSON with a `version`) read back, if this husk reads its version:
/// one another husk wrote is refused with a message that says so, never misread.
pub(super) fn read_versioned<T: serde::de::DeserializeOwned>(
    json: &str,
    version: u32,
    what: &str,
) -> Result<T, String> {
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| format!("not JSON: {e}"))?;
    let found = v.get("version").and_then(|v| v.as_u64()).unwrap_or(0);
    if found != u64::from(version) {
        return Err(format!(
            "written by a husk whose {what} version is {found}; this one reads {version}"
        ));
    }
    serde_json::from_value(v).map_err(|e| e.to_string())
}

fn nanos(t: OffsetDateTime) -> i128 {
    t.unix_timestamp_nanos()
}

fn time_of(n: i128) -> Result<OffsetDateTime, CoreError> {
    OffsetDateTime::from_unix_timestamp_nanos(n)
        .map_err(|e| CoreError::internal("a saved sandbox's time", e))
}

impl Description {
    /// `sb` as saved, on `layer`.
    pub fn of(sb: &LiveSandbox, layer: String, mode: PauseMode) -> Description {
        Description {
            version: DESCRIPTION_VERSION,
            id: sb.id.clone(),
            team: sb.team.clone(),
            template: sb.template.clone(),
            started_at: nanos(sb.started_at),
            // A sandbox paused in place and saved at the server's stop keeps its pause time.
            paused_at: nanos(
                sb.paused_at
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .unwrap_or_else(OffsetDateTime::now_utc),
            ),
            timeout_secs: sb.timeout.as_secs(),
            metadata: sb.metadata.clone(),
            env: sb.env.clone(),
            limits: sb.limits.clone(),
            workspaces: sb.workspaces.clone(),
            network: sb.net.as_ref().map(|n| n.policy()),
            rules: sb.net_rules(),
            allow_internet_access: sb.allow_internet_access,
            public_traffic: sb.public_traffic,
            mask_request_host: sb.mask_request_host.as_ref().map(|m| m.as_str().to_owned()),
            access_token: sb.access_token.clone(),
            traffic_access_token: sb.traffic_access_token.clone(),
            lifecycle: sb.lifecycle,
            layer,
            mode,
            snapshot: sb.origin.snapshot.clone(),
        }
    }

    /// The store's record of it.
    pub fn record(&self) -> Result<SavedSandboxRecord, CoreError> {
        Ok(SavedSandboxRecord {
            id: self.id.clone(),
            team: self.team.clone(),
            saved_at: time_of(self.paused_at)?,
            description: serde_json::to_string(self)
                .map_err(|e| CoreError::internal("describing the sandbox", e))?,
        })
    }

    /// A record read back: its description, checked against the record's own id and team.
    pub fn from_record(r: &SavedSandboxRecord) -> Result<Description, String> {
        let d: Description = read_versioned(&r.description, DESCRIPTION_VERSION, "description")?;
        if d.id != r.id || d.team != r.team {
            return Err("its description names another sandbox".into());
        }
        crate::saved_layers::check_sandbox(&d.id).map_err(|e| e.to_string())?;
        crate::saved_layers::check_layer(&d.layer).map_err(|e| e.to_string())?;
        if let Some(s) = &d.snapshot {
            crate::saved_layers::check_sandbox(s).map_err(|e| e.to_string())?;
        }
        Ok(d)
    }

    pub fn started_at(&self) -> OffsetDateTime {
        time_of(self.started_at).unwrap_or(OffsetDateTime::UNIX_EPOCH)
    }

    pub fn paused_at(&self) -> OffsetDateTime {
        time_of(self.paused_at).unwrap_or(OffsetDateTime::UNIX_EPOCH)
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_secs)
    }

    /// The create request that boots it again (with [`Description::identity`]).
    pub fn request(&self) -> Result<CreateRequest, CoreError> {
        let bad =
            |what: &str, e: String| CoreError::internal(format!("the saved sandbox's {what}"), e);
        // Checked again as a client's rules are: the description is read from disk.
        let rules = if self.rules.is_empty() {
            None
        } else {
            let hosts = (self.rules.hosts.iter())
                .map(|h| (h.host.clone(), h.rules.clone()))
                .collect();
            Some(NetRules::new(hosts).map_err(|e| bad("network rules", e.to_string()))?)
        };
        Ok(CreateRequest {
            template: self.template.clone(),
            timeout: self.timeout(),
            metadata: self.metadata.clone(),
            env: EnvVars::new(self.env.clone()).map_err(|e| bad("environment", e.to_string()))?,
            allow_internet_access: self.allow_internet_access,
            workspaces: self.workspaces.clone(),
            limits: Some(self.limits.clone()),
            network: self.network.clone(),
            allow_public_traffic: Some(self.public_traffic),
            mask_request_host: self
                .mask_request_host
                .as_deref()
                .map(MaskedHost::new)
                .transpose()
                .map_err(|e| bad("masked host", e))?,
            rules,
            lifecycle: self.lifecycle,
        })
    }

    /// Who it is when booted again.
    pub fn identity(&self) -> Identity {
        Identity {
            id: self.id.clone(),
            access_token: self.access_token.clone(),
            traffic_access_token: self.traffic_access_token.clone(),
            started_at: self.started_at(),
            layer: self.layer.clone(),
        }
    }
}
