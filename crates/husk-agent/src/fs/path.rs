//! Resolving the paths clients send, the way envd's `ExpandAndResolve` does.

use std::path::PathBuf;

use husk_proto::{AgentError, ErrorKind, User};

/// Longest path a client may send (Linux's `PATH_MAX`); longer ones could never be opened.
const MAX_PATH: usize = 4096;

/// Resolves a client path: `~` and `~/x` → the user's home; relative paths → against the
/// user's home; `.` and `..` are normalised lexically without ever going above `/`
/// (`/../../etc` → `/etc`). An empty path is the home directory.
///
/// Lexical, not kernel, resolution of `..` is what envd does too (Go's `filepath.Join`).
/// It never lets a path escape anything: the agent runs after `pivot_root`, so `/` is
/// the sandbox's root whatever the path says. `~name` (another user's home) is refused as
/// envd refuses it, and so are NUL bytes and paths longer than `PATH_MAX`.
pub fn resolve(path: &str, user: User) -> Result<PathBuf, AgentError> {
    if path.len() > MAX_PATH {
        return Err(AgentError::new(
            ErrorKind::InvalidArgument,
            format!("path is longer than {MAX_PATH} bytes"),
        ));
    }
    if path.contains('\0') {
        return Err(AgentError::new(
            ErrorKind::InvalidArgument,
            "path contains a NUL byte",
        ));
    }
    let home = user.home();
    let joined = if path.is_empty() || path == "~" {
        home.to_owned()
    } else if let Some(rest) = path.strip_prefix("~/") {
        format!("{home}/{rest}")
    } else if path.starts_with('~') {
        return Err(AgentError::new(
            ErrorKind::InvalidArgument,
            format!("cannot expand user-specific home dir in '{path}'"),
        ));
    } else if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("{home}/{path}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            name => parts.push(name),
        }
    }
    let mut out = String::with_capacity(joined.len() + 1);
    for part in &parts {
        out.push('/');
        out.push_str(part);
    }
    if out.is_empty() {
        out.push('/');
    }
    Ok(PathBuf::from(out))
}
