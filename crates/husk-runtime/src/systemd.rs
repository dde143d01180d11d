//! Getting a delegated cgroup from systemd, as the systemd cgroup drivers of runc and crun do.
//!
//! On a systemd host every cgroup belongs to a unit, and systemd enables in a unit's cgroup
//! only the controllers the unit asked for. A process that is not in a delegated unit (a root
//! shell's session scope, a cron job, an ordinary service) must neither write below its own
//! cgroup nor expect `cpu` to be there: it asks systemd for a transient scope with
//! `Delegate=yes` and moves into it. systemd then enables every controller on the way down, and
//! the subtree below the scope is husk's alone.
//!
//! D-Bus needs threads (the connection runs on an async runtime) and husk's spawner must stay
//! single-threaded (it forks sandboxes), so the conversation happens in a short-lived child
//! process that reports back over a pipe. The child asks for the *parent's* pid to be moved.

use std::io;
use std::os::fd::AsFd;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::sys;

/// How long the whole conversation with systemd may take (a slow VM under TCG needs seconds).
const DEADLINE: Duration = Duration::from_secs(30);

/// Errors of asking systemd for a delegated cgroup. The texts of D-Bus errors come from the
/// helper process, so they travel as text inside their typed variant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum SystemdError {
    /// Neither the system bus nor systemd's private socket answered.
    #[error(
        "cannot reach systemd over D-Bus (system bus: {bus}; /run/systemd/private: {private})"
    )]
    Connect { bus: String, private: String },
    /// systemd answered a call with an error.
    #[error("systemd refused {call}: {message}")]
    Call { call: String, message: String },
    /// The job starting the scope did not end in `done`.
    #[error("systemd could not start {unit}: its job ended with `{result}`")]
    Job { unit: String, result: String },
    /// systemd did not answer within [`DEADLINE`].
    #[error("systemd did not answer within {} s", DEADLINE.as_secs())]
    Timeout,
    /// The helper process could not run or report.
    #[error("the D-Bus helper process: {0}")]
    Helper(String),
    /// The scope husk processes share ([`crate::shared_scope`]) could not be used.
    #[error("the shared scope: cannot {what}: {}", io::Error::from_raw_os_error(*.errno))]
    SharedScope { what: String, errno: i32 },
}

/// How the calling process got, or already had, a delegated cgroup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Delegation {
    /// The unit it runs in already has `Delegate=yes` (the shipped `husk.service`, a
    /// `systemd-run -p Delegate=yes`).
    Delegated { unit: String },
    /// systemd started the transient scope `unit` with `Delegate=yes` and moved the process
    /// into it; `from` is the unit it left.
    Scope { unit: String, from: String },
}

/// Whether systemd is the host's service manager (sd_booted(3)'s test).
pub fn booted() -> bool {
    std::path::Path::new("/run/systemd/system").is_dir()
}

/// Makes sure the calling process sits in a cgroup that systemd delegated: if its unit has no
/// `Delegate=yes`, asks systemd for a delegated transient scope and moves the process into it.
///
/// The caller must be single-threaded (it forks).
pub fn ensure_delegated() -> Result<Delegation, SystemdError> {
    ensure_delegated_with(false)
}

/// [`ensure_delegated`]; with `own_scope`, a scope of its own even when the unit is delegated
/// already (see [`crate::cgroup::CgroupOptions::own_scope`]).
pub fn ensure_delegated_with(own_scope: bool) -> Result<Delegation, SystemdError> {
    ensure(own_scope, None)
}

/// The scope to ask for instead of `husk-<pid>.scope`: one that other processes join too
/// ([`crate::shared_scope`]).
#[derive(Debug, Clone)]
pub(crate) struct ScopeSpec {
    /// The unit's name (`….scope`).
    pub unit: String,
    /// Processes moved into it besides the caller (its holder).
    pub also: Vec<u32>,
    /// Its `Description=`.
    pub description: String,
}

/// [`ensure_delegated`], with the scope `spec` asks for when the caller's unit is not delegated.
pub(crate) fn ensure_delegated_into(spec: ScopeSpec) -> Result<Delegation, SystemdError> {
    ensure(false, Some(spec))
}

fn ensure(own_scope: bool, spec: Option<ScopeSpec>) -> Result<Delegation, SystemdError> {
    match sys::settled_thread_count() {
        Ok(1) => {}
        Ok(n) => {
            return Err(SystemdError::Helper(format!(
                "must be called before any thread starts (this process has {n})"
            )))
        }
        Err(e) => return Err(SystemdError::Helper(format!("count threads: {e}"))),
    }
    let pid = sys::getpid();
    let (rd, wr) = sys::pipe().map_err(|e| SystemdError::Helper(format!("pipe: {e}")))?;
    // SAFETY: the process is single-threaded (checked above).
    let child = unsafe { sys::fork() }.map_err(|e| SystemdError::Helper(format!("fork: {e}")))?;
    if child == 0 {
        drop(rd);
        let answer = converse(pid as u32, own_scope, spec);
        let bytes = postcard::to_allocvec(&answer).unwrap_or_default();
        let _ = sys::write_all(wr.as_fd(), &bytes);
        sys::exit_now(0);
    }
    drop(wr);
    let read = read_answer(rd.as_fd());
    if read.is_err() {
        let _ = sys::kill(child, libc::SIGKILL);
    }
    let _ = sys::waitpid(child, 0);
    let bytes = read?;
    postcard::from_bytes::<Result<Delegation, SystemdError>>(&bytes)
        .map_err(|e| SystemdError::Helper(format!("bad answer: {e}")))?
}

/// Reads the helper's whole answer, bounded in size and by [`DEADLINE`] plus a margin.
fn read_answer(fd: std::os::fd::BorrowedFd<'_>) -> Result<Vec<u8>, SystemdError> {
    let deadline = std::time::Instant::now() + DEADLINE + Duration::from_secs(5);
    sys::read_to_eof_within(fd, deadline, 64 << 10).map_err(|e| match e.kind() {
        io::ErrorKind::TimedOut => SystemdError::Timeout,
        _ => SystemdError::Helper(format!("read: {e}")),
    })
}

/// In the helper process: the whole conversation, on a single-threaded async runtime.
fn converse(
    pid: u32,
    own_scope: bool,
    spec: Option<ScopeSpec>,
) -> Result<Delegation, SystemdError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| SystemdError::Helper(format!("runtime: {e}")))?;
    rt.block_on(async {
        tokio::time::timeout(DEADLINE, dbus::delegate(pid, own_scope, spec))
            .await
            .unwrap_or(Err(SystemdError::Timeout))
    })
}

mod dbus {
    use futures_util::StreamExt;
    use zbus::zvariant::{OwnedObjectPath, OwnedValue, Value};
    use zbus::Connection;

    use super::{Delegation, ScopeSpec, SystemdError};

    const DEST: &str = "org.freedesktop.systemd1";
    const PATH: &str = "/org/freedesktop/systemd1";
    const MANAGER: &str = "org.freedesktop.systemd1.Manager";

    fn call_err(call: &str) -> impl FnOnce(zbus::Error) -> SystemdError + '_ {
        move |e| SystemdError::Call {
            call: call.to_owned(),
            message: e.to_string(),
        }
    }

    /// The system bus, else systemd's own socket (hosts without a D-Bus daemon: minimal
    /// servers and VMs; root only, which husk is).
    async fn connect() -> Result<Connection, SystemdError> {
        let bus = match Connection::system().await {
            Ok(c) => return Ok(c),
            Err(e) => e.to_string(),
        };
        let private = async {
            zbus::connection::Builder::address("unix:path=/run/systemd/private")?
                .p2p()
                .build()
                .await
        };
        private.await.map_err(|e| SystemdError::Connect {
            bus,
            private: e.to_string(),
        })
    }

    async fn property<T>(
        conn: &Connection,
        path: &OwnedObjectPath,
        iface: &str,
        name: &str,
    ) -> Result<T, SystemdError>
    where
        T: TryFrom<OwnedValue>,
        T::Error: std::fmt::Display,
    {
        let call = format!("Get({iface}.{name})");
        let reply = conn
            .call_method(
                Some(DEST),
                path,
                Some("org.freedesktop.DBus.Properties"),
                "Get",
                &(iface, name),
            )
            .await
            .map_err(call_err(&call))?;
        let value: OwnedValue = reply.body().deserialize().map_err(call_err(&call))?;
        T::try_from(value).map_err(|e| SystemdError::Call {
            call,
            message: e.to_string(),
        })
    }

    pub(super) async fn delegate(
        pid: u32,
        own_scope: bool,
        spec: Option<ScopeSpec>,
    ) -> Result<Delegation, SystemdError> {
        let conn = connect().await?;
        let unit_path: OwnedObjectPath = conn
            .call_method(Some(DEST), PATH, Some(MANAGER), "GetUnitByPID", &(pid,))
            .await
            .map_err(call_err("GetUnitByPID"))?
            .body()
            .deserialize()
            .map_err(call_err("GetUnitByPID"))?;
        let unit: String =
            property(&conn, &unit_path, "org.freedesktop.systemd1.Unit", "Id").await?;
        // Only services and scopes can be delegated (systemd refuses it for other kinds).
        let kind = if unit.ends_with(".service") {
            Some("org.freedesktop.systemd1.Service")
        } else if unit.ends_with(".scope") {
            Some("org.freedesktop.systemd1.Scope")
        } else {
            None
        };
        if let Some(kind) = kind.filter(|_| !own_scope) {
            if property::<bool>(&conn, &unit_path, kind, "Delegate").await? {
                return Ok(Delegation::Delegated { unit });
            }
        }
        let ScopeSpec {
            unit: scope,
            also,
            description,
        } = spec.unwrap_or_else(|| ScopeSpec {
            unit: format!("husk-{pid}.scope"),
            also: Vec::new(),
            description: format!("husk sandboxes of {unit} (pid {pid})"),
        });
        let pids: Vec<u32> = std::iter::once(pid).chain(also).collect();
        // Subscribe before starting, so that the job's end cannot be missed.
        let rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .interface(MANAGER)
            .and_then(|r| r.member("JobRemoved"))
            .map_err(call_err("AddMatch"))?
            .build();
        let mut removed = zbus::MessageStream::for_match_rule(rule, &conn, Some(64))
            .await
            .map_err(call_err("AddMatch"))?;
        // Without a subscriber systemd emits no job signals; an "already subscribed" answer
        // is fine.
        let _ = conn
            .call_method(Some(DEST), PATH, Some(MANAGER), "Subscribe", &())
            .await;
        let properties: Vec<(&str, Value<'_>)> = vec![
            ("Description", Value::from(description)),
            ("PIDs", Value::from(pids)),
            ("Delegate", Value::from(true)),
            // Gone from systemd's memory once its last process is, failed or not.
            ("CollectMode", Value::from("inactive-or-failed")),
            // husk bounds each sandbox's processes itself; the scope must not cap them all.
            ("TasksMax", Value::from(u64::MAX)),
        ];
        let aux: Vec<(&str, Vec<(&str, Value<'_>)>)> = Vec::new();
        let job: OwnedObjectPath = conn
            .call_method(
                Some(DEST),
                PATH,
                Some(MANAGER),
                "StartTransientUnit",
                &(scope.as_str(), "fail", properties, aux),
            )
            .await
            .map_err(call_err("StartTransientUnit"))?
            .body()
            .deserialize()
            .map_err(call_err("StartTransientUnit"))?;
        while let Some(msg) = removed.next().await {
            let Ok(msg) = msg else { continue };
            let Ok((_id, path, _unit, result)) = msg
                .body()
                .deserialize::<(u32, OwnedObjectPath, String, String)>()
            else {
                continue;
            };
            if path != job {
                continue;
            }
            if result != "done" {
                return Err(SystemdError::Job {
                    unit: scope,
                    result,
                });
            }
            return Ok(Delegation::Scope {
                unit: scope,
                from: unit,
            });
        }
        Err(SystemdError::Helper("the D-Bus connection closed".into()))
    }
}
