//! What a create request may ask for, and the checks of its values.

use std::collections::BTreeMap;
use std::time::Duration;

use husk_runtime::Limits;

/// What a client asks for when creating a sandbox.
#[derive(Debug, Clone, Default)]
pub struct CreateRequest {
    pub template: String,
    pub timeout: Duration,
    pub metadata: BTreeMap<String, String>,
    /// Checked when the request is made (see [`EnvVars`]).
    pub env: EnvVars,
    pub allow_internet_access: Option<bool>,
    /// The team's workspaces to mount (E2B `volumeMounts`, runs).
    pub workspaces: Vec<WorkspaceMount>,
    /// Resources of this sandbox, when not the server's (each at most the server's).
    pub limits: Option<Limits>,
    /// Egress policy; `None`: the server's default.
    pub network: Option<husk_net::NetPolicy>,
    /// E2B `network.allowPublicTraffic`: `Some(false)` makes the sandbox's ports private (they
    /// need its traffic token or a key of its team); unset is public, as on E2B.
    pub allow_public_traffic: Option<bool>,
    /// E2B `network.maskRequestHost`: the `Host` its own servers are sent, with `${PORT}` for
    /// the port (see [`MaskedHost`]); `None`: the client's.
    pub mask_request_host: Option<MaskedHost>,
    /// E2B `network.rules`: headers the domain proxy sets on the sandbox's requests to the
    /// hosts named (`None` or non-empty).
    pub rules: Option<crate::net_rules::NetRules>,
    /// What happens at the timeout, and whether activity resumes a paused sandbox.
    pub lifecycle: Lifecycle,
}

/// What a pause keeps (E2B's `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PauseMode {
    /// Processes and memory as they were (husk: the sandbox frozen in place, its memory kept).
    #[default]
    Full,
    /// Only the files: they are saved to disk, the processes end and the memory is freed; a
    /// resume boots the sandbox again on its files.
    Filesystem,
}

/// What a sandbox does at its timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    #[default]
    Kill,
    Pause(PauseMode),
}

/// E2B's `lifecycle`: the timeout's action, and auto-resume (a paused sandbox resumes on the
/// next call to it, or on traffic to one of its ports).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Lifecycle {
    pub on_timeout: OnTimeout,
    pub auto_resume: bool,
}

/// A `Host` to send a sandbox's servers instead of the client's: printable ASCII without
/// spaces, at most 253 bytes, `${PORT}` standing for the port asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaskedHost(String);

impl MaskedHost {
    pub fn new(mask: &str) -> Result<MaskedHost, String> {
        if mask.is_empty() || mask.len() > 253 {
            return Err("network.maskRequestHost must have 1 to 253 characters".into());
        }
        if !mask.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("network.maskRequestHost must be printable ASCII without spaces".into());
        }
        Ok(MaskedHost(mask.to_owned()))
    }

    /// The `Host` for a request to `port`.
    pub fn for_port(&self, port: u16) -> String {
        self.0.replace("${PORT}", &port.to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A team's workspace mounted into a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WorkspaceMount {
    /// The workspace's name.
    pub name: String,
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Read-only unless asked for.
    pub writable: bool,
}

/// Sandbox paths a workspace may not be mounted on (or under): the sandbox's own kernel
/// interfaces and device nodes, which husk mounts itself.
const RESERVED_MOUNT_PATHS: &[&str] = &["/proc", "/dev", "/sys"];

/// Most workspaces one sandbox may mount.
pub const MAX_WORKSPACE_MOUNTS: usize = 16;

/// A workspace mount path: absolute, normalised (no `.`/`..`/empty components), not `/` and not
/// under a [`RESERVED_MOUNT_PATHS`] entry.
pub fn check_mount_path(path: &str) -> Result<(), String> {
    if !path.starts_with('/') {
        return Err(format!("mount path '{path}' must be absolute"));
    }
    let comps: Vec<&str> = path.split('/').skip(1).filter(|c| !c.is_empty()).collect();
    if comps.is_empty() {
        return Err("a workspace cannot be mounted on '/'".into());
    }
    if comps.iter().any(|c| *c == "." || *c == "..") || path.len() > 1024 || path.contains('\0') {
        return Err(format!("invalid mount path '{path}'"));
    }
    let norm = format!("/{}", comps.join("/"));
    if let Some(r) = RESERVED_MOUNT_PATHS
        .iter()
        .find(|r| norm == **r || norm.starts_with(&format!("{r}/")))
    {
        return Err(format!(
            "a workspace cannot be mounted on {r} (husk mounts it itself)"
        ));
    }
    Ok(())
}

pub use husk_runtime::env::{EnvVars, MAX_ENV_BYTES};
