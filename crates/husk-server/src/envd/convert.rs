//! Conversions between the envd wire messages and the agent protocol.
//!
//! Requests are validated here, before they reach the agent: a missing process selector, an
//! empty command, a terminal size that does not fit the kernel's `u16`, an unknown signal or a
//! NUL byte in a string the agent would pass to the kernel all become `invalid_argument`.
//! Replies come from the agent (inside the sandbox) and are converted totally: values the wire
//! cannot express are clamped or dropped, never trusted to be in range.

use husk_proto::{
    Entry, FileType as AgentFileType, FsEvent, FsOp, ProcEnd, ProcEvent, ProcInfo, Request,
    Selector, StartProc, User,
};

use crate::connect::ConnectError;
use husk_core::manager::EnvVars;

use super::filesystem::{
    EntryInfo, EventType, FileType, FilesystemEvent, ListDirRequest, MakeDirRequest, MoveRequest,
    RemoveRequest, StatRequest, WatchDirRequest,
};
use super::process::{
    CloseStdinRequest, ConnectRequest, DataEvent, EndEvent, ListRequest, ProcessConfig,
    ProcessEvent, ProcessInfo, ProcessInput, ProcessSelector, Pty, SendInputRequest,
    SendSignalRequest, Signal, StartRequest, StartResponse, StreamInputData, StreamInputStart,
    UpdateRequest,
};
use super::wire::Timestamp;

/// A unary request that maps onto exactly one agent request.
pub trait ToAgentRequest {
    /// Validates the request and builds the agent request, on behalf of `user` (from the
    /// call's Basic auth, or the sandbox's default user).
    fn into_request(self, user: User) -> Result<Request, ConnectError>;
}

fn selector(sel: Option<ProcessSelector>) -> Result<Selector, ConnectError> {
    sel.map(Selector::from)
        .ok_or_else(|| ConnectError::invalid_argument("missing process selector (pid or tag)"))
}

/// Refuses NUL bytes, which no path, argument or environment entry can carry to the kernel.
fn no_nul(what: &str, text: &str) -> Result<(), ConnectError> {
    if text.contains('\0') {
        return Err(ConnectError::invalid_argument(format!(
            "{what} contains a NUL byte"
        )));
    }
    Ok(())
}

impl From<ProcessSelector> for Selector {
    fn from(sel: ProcessSelector) -> Self {
        match sel {
            ProcessSelector::Pid(pid) => Selector::Pid(pid),
            ProcessSelector::Tag(tag) => Selector::Tag(tag),
        }
    }
}

impl Pty {
    /// The terminal size as `(cols, rows)`: both are required, at least 1 and at most 65535.
    pub fn cols_rows(&self) -> Result<(u16, u16), ConnectError> {
        let size = self
            .size
            .ok_or_else(|| ConnectError::invalid_argument("pty without a size"))?;
        let dim = |name: &str, v: u32| {
            u16::try_from(v).ok().filter(|&v| v >= 1).ok_or_else(|| {
                ConnectError::invalid_argument(format!(
                    "pty {name} must be between 1 and 65535, got {v}"
                ))
            })
        };
        Ok((dim("cols", size.cols)?, dim("rows", size.rows)?))
    }
}

impl StartRequest {
    /// The process to start. `timeout_ms` is the call's `Connect-Timeout-Ms`, which envd uses
    /// as the process's lifetime. An empty `cwd` or `tag` counts as unset.
    pub fn into_start_proc(
        self,
        user: User,
        timeout_ms: Option<u64>,
    ) -> Result<StartProc, ConnectError> {
        let config = self
            .process
            .ok_or_else(|| ConnectError::invalid_argument("missing process config"))?;
        if config.cmd.is_empty() {
            return Err(ConnectError::invalid_argument("empty command"));
        }
        no_nul("command", &config.cmd)?;
        for arg in &config.args {
            no_nul("argument", arg)?;
        }
        let envs = EnvVars::new(config.envs.into_iter().collect())
            .map_err(|e| ConnectError::invalid_argument(e.to_string()))?;
        let cwd = config.cwd.filter(|c| !c.is_empty());
        if let Some(cwd) = &cwd {
            no_nul("cwd", cwd)?;
        }
        let pty = self.pty.as_ref().map(Pty::cols_rows).transpose()?;
        Ok(StartProc {
            cmd: config.cmd,
            args: config.args,
            envs: envs.into_vec(),
            cwd,
            user,
            pty,
            tag: self.tag.filter(|t| !t.is_empty()),
            stdin: self.stdin.unwrap_or(true),
            timeout_ms,
            secret_envs: Vec::new(),
        })
    }
}

impl ProcessInput {
    /// The bytes and whether they go to the terminal (`pty`) rather than stdin.
    pub fn into_parts(self) -> (Vec<u8>, bool) {
        match self {
            ProcessInput::Stdin(data) => (data, false),
            ProcessInput::Pty(data) => (data, true),
        }
    }
}

impl StreamInputStart {
    /// The process a StreamInput call writes to.
    pub fn selector(self) -> Result<Selector, ConnectError> {
        selector(self.process)
    }
}

impl StreamInputData {
    /// The agent request writing this chunk to the process chosen by the stream's start.
    pub fn into_request(self, sel: Selector) -> Result<Request, ConnectError> {
        let (data, pty) = self
            .input
            .ok_or_else(|| ConnectError::invalid_argument("data event without input"))?
            .into_parts();
        Ok(Request::Input { sel, data, pty })
    }
}

impl ToAgentRequest for ConnectRequest {
    /// `Find`: re-attaching needs the process to exist.
    fn into_request(self, _user: User) -> Result<Request, ConnectError> {
        Ok(Request::Find(selector(self.process)?))
    }
}

impl ToAgentRequest for ListRequest {
    fn into_request(self, _user: User) -> Result<Request, ConnectError> {
        Ok(Request::List)
    }
}

impl ToAgentRequest for UpdateRequest {
    /// `Resize`; without a pty the update changes nothing, and becomes `Find`, so the call
    /// still fails with `not_found` for a process that does not exist.
    fn into_request(self, _user: User) -> Result<Request, ConnectError> {
        let sel = selector(self.process)?;
        match self.pty {
            Some(pty) => {
                let (cols, rows) = pty.cols_rows()?;
                Ok(Request::Resize { sel, cols, rows })
            }
            None => Ok(Request::Find(sel)),
        }
    }
}

impl ToAgentRequest for SendInputRequest {
    fn into_request(self, _user: User) -> Result<Request, ConnectError> {
        let sel = selector(self.process)?;
        StreamInputData { input: self.input }.into_request(sel)
    }
}

impl ToAgentRequest for SendSignalRequest {
    /// Only the two signals the protocol defines are sent.
    fn into_request(self, _user: User) -> Result<Request, ConnectError> {
        let sel = selector(self.process)?;
        let signal = match self.signal {
            Signal::Sigterm => 15,
            Signal::Sigkill => 9,
            Signal::Unspecified => {
                return Err(ConnectError::invalid_argument(
                    "signal must be SIGNAL_SIGTERM or SIGNAL_SIGKILL",
                ))
            }
        };
        Ok(Request::Signal { sel, signal })
    }
}

impl ToAgentRequest for CloseStdinRequest {
    fn into_request(self, _user: User) -> Result<Request, ConnectError> {
        Ok(Request::CloseStdin(selector(self.process)?))
    }
}

impl ToAgentRequest for StatRequest {
    fn into_request(self, user: User) -> Result<Request, ConnectError> {
        no_nul("path", &self.path)?;
        Ok(Request::Stat {
            path: self.path,
            user,
        })
    }
}

impl ToAgentRequest for MakeDirRequest {
    fn into_request(self, user: User) -> Result<Request, ConnectError> {
        no_nul("path", &self.path)?;
        Ok(Request::MakeDir {
            path: self.path,
            user,
        })
    }
}

impl ToAgentRequest for RemoveRequest {
    fn into_request(self, user: User) -> Result<Request, ConnectError> {
        no_nul("path", &self.path)?;
        Ok(Request::Remove {
            path: self.path,
            user,
        })
    }
}

impl ToAgentRequest for MoveRequest {
    fn into_request(self, user: User) -> Result<Request, ConnectError> {
        no_nul("source", &self.source)?;
        no_nul("destination", &self.destination)?;
        Ok(Request::Move {
            from: self.source,
            to: self.destination,
            user,
        })
    }
}

impl ToAgentRequest for ListDirRequest {
    /// Depth 0 (unset) lists the directory's own entries, like depth 1.
    fn into_request(self, user: User) -> Result<Request, ConnectError> {
        no_nul("path", &self.path)?;
        Ok(Request::ListDir {
            path: self.path,
            depth: self.depth.max(1),
            user,
        })
    }
}

impl ToAgentRequest for WatchDirRequest {
    /// `WatchStart`. `include_entry` and `allow_network_mounts` stay with the caller: the
    /// former asks it to stat each event's path, the latter has no meaning inside a husk
    /// sandbox (it has no network mounts).
    fn into_request(self, user: User) -> Result<Request, ConnectError> {
        no_nul("path", &self.path)?;
        Ok(Request::WatchStart {
            path: self.path,
            recursive: self.recursive,
            user,
        })
    }
}

impl From<Entry> for EntryInfo {
    fn from(entry: Entry) -> Self {
        let file_type = match entry.file_type {
            AgentFileType::File => FileType::File,
            AgentFileType::Dir => FileType::Directory,
            AgentFileType::Symlink => FileType::Symlink,
            AgentFileType::Other => FileType::Unspecified,
        };
        EntryInfo {
            name: entry.name,
            file_type,
            path: entry.path,
            size: i64::try_from(entry.size).unwrap_or(i64::MAX),
            mode: entry.mode,
            permissions: entry.permissions,
            owner: entry.owner,
            group: entry.group,
            modified_time: Timestamp::new(entry.mtime_secs, entry.mtime_nanos),
            symlink_target: entry.symlink_target,
            metadata: entry.metadata.into_iter().collect(),
            is_symlink: entry.file_type == AgentFileType::Symlink,
        }
    }
}

impl From<ProcInfo> for ProcessInfo {
    fn from(info: ProcInfo) -> Self {
        ProcessInfo {
            config: Some(ProcessConfig {
                cmd: info.cmd,
                args: info.args,
                envs: info.envs.into_iter().collect(),
                cwd: info.cwd,
            }),
            pid: info.pid,
            tag: info.tag,
        }
    }
}

impl From<ProcEnd> for EndEvent {
    fn from(end: ProcEnd) -> Self {
        EndEvent {
            exit_code: end.exit_code,
            exited: end.exited,
            status: end.status,
            error: end.error,
        }
    }
}

impl From<ProcEvent> for ProcessEvent {
    fn from(event: ProcEvent) -> Self {
        match event {
            ProcEvent::Stdout(data) => ProcessEvent::Data(DataEvent::Stdout(data)),
            ProcEvent::Stderr(data) => ProcessEvent::Data(DataEvent::Stderr(data)),
            ProcEvent::Pty(data) => ProcessEvent::Data(DataEvent::Pty(data)),
            ProcEvent::End(end) => ProcessEvent::End(end.into()),
        }
    }
}

impl From<ProcEvent> for StartResponse {
    fn from(event: ProcEvent) -> Self {
        ProcessEvent::from(event).into()
    }
}

impl From<FsOp> for EventType {
    fn from(op: FsOp) -> Self {
        match op {
            FsOp::Create => EventType::Create,
            FsOp::Write => EventType::Write,
            FsOp::Remove => EventType::Remove,
            FsOp::Rename => EventType::Rename,
            FsOp::Chmod => EventType::Chmod,
        }
    }
}

impl From<FsEvent> for FilesystemEvent {
    /// Without an entry; a watch with `include_entry` adds it with [`FilesystemEvent::entry`].
    fn from(event: FsEvent) -> Self {
        FilesystemEvent {
            name: event.name,
            event_type: event.op.into(),
            entry: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::connect::Code;
    use crate::envd::process::{PtySize, StreamInputEvent, StreamInputRequest};
    use serde_json::json;

    fn start(v: serde_json::Value) -> Result<StartProc, ConnectError> {
        serde_json::from_value::<StartRequest>(v)
            .unwrap()
            .into_start_proc(User::User, Some(5000))
    }

    #[test]
    fn start_request_converts() {
        let p = start(json!({
            "process": {"cmd": "/bin/bash", "args": ["-l", "-c", "ls"],
                        "envs": {"B": "2", "A": "1"}, "cwd": "~/x"},
            "stdin": false
        }))
        .unwrap();
        assert_eq!(
            p,
            StartProc {
                cmd: "/bin/bash".into(),
                args: vec!["-l".into(), "-c".into(), "ls".into()],
                envs: vec![("A".into(), "1".into()), ("B".into(), "2".into())],
                cwd: Some("~/x".into()),
                user: User::User,
                pty: None,
                tag: None,
                stdin: false,
                timeout_ms: Some(5000),
                secret_envs: Vec::new(),
            }
        );
        let p = start(json!({
            "process": {"cmd": "/bin/bash", "cwd": ""},
            "pty": {"size": {"cols": 80, "rows": 24}},
            "tag": ""
        }))
        .unwrap();
        assert_eq!(p.pty, Some((80, 24)));
        assert_eq!(p.cwd, None);
        assert_eq!(p.tag, None);
        assert!(p.stdin, "unset stdin means open");
        let p =
            start(json!({"process": {"cmd": "x"}, "pty": {"size": {"cols": 65535, "rows": 1}}}));
        assert_eq!(p.unwrap().pty, Some((65535, 1)));
    }

    #[test]
    fn start_request_is_validated() {
        let cases = [
            json!({}),
            json!({"process": {}}),
            json!({"process": {"cmd": ""}}),
            json!({"process": {"cmd": "a\u{0}b"}}),
            json!({"process": {"cmd": "x", "args": ["\u{0}"]}}),
            json!({"process": {"cmd": "x", "envs": {"A=B": "1"}}}),
            json!({"process": {"cmd": "x", "envs": {"": "1"}}}),
            json!({"process": {"cmd": "x", "envs": {"A": "\u{0}"}}}),
            json!({"process": {"cmd": "x", "cwd": "/\u{0}"}}),
            json!({"process": {"cmd": "x"}, "pty": {}}),
            json!({"process": {"cmd": "x"}, "pty": {"size": {"cols": 0, "rows": 24}}}),
            json!({"process": {"cmd": "x"}, "pty": {"size": {"cols": 80}}}),
            json!({"process": {"cmd": "x"}, "pty": {"size": {"cols": 65536, "rows": 24}}}),
            json!({"process": {"cmd": "x"}, "pty": {"size": {"cols": 80, "rows": 4294967295u32}}}),
        ];
        for case in cases {
            let err = start(case.clone()).unwrap_err();
            assert_eq!(err.code, Code::InvalidArgument, "{case}");
        }
    }

    fn req<T: ToAgentRequest + for<'de> serde::Deserialize<'de>>(
        v: serde_json::Value,
    ) -> Result<Request, ConnectError> {
        serde_json::from_value::<T>(v)
            .unwrap()
            .into_request(User::Root)
    }

    #[test]
    fn process_requests_convert() {
        assert_eq!(
            req::<ConnectRequest>(json!({"process":{"pid":4}})).unwrap(),
            Request::Find(Selector::Pid(4))
        );
        assert_eq!(
            req::<ConnectRequest>(json!({})).unwrap_err().code,
            Code::InvalidArgument
        );
        assert_eq!(req::<ListRequest>(json!({})).unwrap(), Request::List);
        assert_eq!(
            req::<UpdateRequest>(
                json!({"process":{"tag":"t"},"pty":{"size":{"cols":100,"rows":30}}})
            )
            .unwrap(),
            Request::Resize {
                sel: Selector::Tag("t".into()),
                cols: 100,
                rows: 30
            }
        );
        assert_eq!(
            req::<UpdateRequest>(json!({"process":{"pid":1}})).unwrap(),
            Request::Find(Selector::Pid(1))
        );
        assert!(req::<UpdateRequest>(
            json!({"process":{"pid":1},"pty":{"size":{"cols":0,"rows":1}}})
        )
        .is_err());
        assert_eq!(
            req::<SendInputRequest>(json!({"process":{"pid":2},"input":{"pty":"aGk="}})).unwrap(),
            Request::Input {
                sel: Selector::Pid(2),
                data: b"hi".to_vec(),
                pty: true
            }
        );
        assert!(req::<SendInputRequest>(json!({"process":{"pid":2}})).is_err());
        assert_eq!(
            req::<SendSignalRequest>(json!({"process":{"pid":2},"signal":"SIGNAL_SIGKILL"}))
                .unwrap(),
            Request::Signal {
                sel: Selector::Pid(2),
                signal: 9
            }
        );
        assert_eq!(
            req::<SendSignalRequest>(json!({"process":{"pid":2},"signal":15})).unwrap(),
            Request::Signal {
                sel: Selector::Pid(2),
                signal: 15
            }
        );
        let err = req::<SendSignalRequest>(json!({"process":{"pid":2}})).unwrap_err();
        assert_eq!(err.code, Code::InvalidArgument);
        assert_eq!(
            req::<CloseStdinRequest>(json!({"process":{"pid":8}})).unwrap(),
            Request::CloseStdin(Selector::Pid(8))
        );
    }

    #[test]
    fn stream_input_converts() {
        let m: StreamInputRequest =
            serde_json::from_value(json!({"start":{"process":{"pid":42}}})).unwrap();
        let Some(StreamInputEvent::Start(start)) = m.event else {
            panic!("not a start")
        };
        let sel = start.selector().unwrap();
        assert_eq!(sel, Selector::Pid(42));
        let m: StreamInputRequest =
            serde_json::from_value(json!({"data":{"input":{"stdin":"eA=="}}})).unwrap();
        let Some(StreamInputEvent::Data(data)) = m.event else {
            panic!("not data")
        };
        assert_eq!(
            data.into_request(sel.clone()).unwrap(),
            Request::Input {
                sel,
                data: b"x".to_vec(),
                pty: false
            }
        );
        assert!(StreamInputStart::default().selector().is_err());
        assert!(StreamInputData::default()
            .into_request(Selector::Pid(1))
            .is_err());
    }

    #[test]
    fn filesystem_requests_convert() {
        assert_eq!(
            req::<StatRequest>(json!({"path":"~/a"})).unwrap(),
            Request::Stat {
                path: "~/a".into(),
                user: User::Root
            }
        );
        assert_eq!(
            req::<MakeDirRequest>(json!({"path":"d"})).unwrap(),
            Request::MakeDir {
                path: "d".into(),
                user: User::Root
            }
        );
        assert_eq!(
            req::<RemoveRequest>(json!({"path":"d"})).unwrap(),
            Request::Remove {
                path: "d".into(),
                user: User::Root
            }
        );
        assert!(req::<RemoveRequest>(json!({"path":"a\u{0}"})).is_err());
        assert!(req::<StatRequest>(json!({"path":"a\u{0}"})).is_err());
        assert_eq!(
            req::<MoveRequest>(json!({"source":"a","destination":"b"})).unwrap(),
            Request::Move {
                from: "a".into(),
                to: "b".into(),
                user: User::Root
            }
        );
        assert_eq!(
            req::<ListDirRequest>(json!({"path":"/"})).unwrap(),
            Request::ListDir {
                path: "/".into(),
                depth: 1,
                user: User::Root
            }
        );
        assert_eq!(
            req::<ListDirRequest>(json!({"path":"/","depth":3})).unwrap(),
            Request::ListDir {
                path: "/".into(),
                depth: 3,
                user: User::Root
            }
        );
        assert_eq!(
            req::<WatchDirRequest>(json!({"path":"/w","recursive":true})).unwrap(),
            Request::WatchStart {
                path: "/w".into(),
                recursive: true,
                user: User::Root
            }
        );
    }

    fn entry(file_type: AgentFileType) -> Entry {
        Entry {
            name: "n".into(),
            path: "/n".into(),
            file_type,
            size: 5,
            mode: 0o600,
            permissions: "-rw-------".into(),
            owner: "user".into(),
            group: "user".into(),
            mtime_secs: 1_796_040_000,
            mtime_nanos: 5,
            symlink_target: None,
            metadata: vec![("b".into(), "2".into()), ("a".into(), "1".into())],
        }
    }

    #[test]
    fn entries_convert() {
        let e = EntryInfo::from(entry(AgentFileType::File));
        assert_eq!(e.file_type, FileType::File);
        assert!(!e.is_symlink);
        assert_eq!(
            serde_json::to_value(&e).unwrap()["modifiedTime"],
            json!("2026-11-30T12:00:00.000000005Z")
        );
        assert_eq!(
            e.metadata,
            BTreeMap::from([("a".into(), "1".into()), ("b".into(), "2".into())])
        );
        assert_eq!(
            EntryInfo::from(entry(AgentFileType::Dir)).file_type,
            FileType::Directory
        );
        let other = EntryInfo::from(entry(AgentFileType::Other));
        assert_eq!(other.file_type, FileType::Unspecified);
        assert!(serde_json::to_value(&other).unwrap().get("type").is_none());
        let mut link = entry(AgentFileType::Symlink);
        link.symlink_target = Some("/t".into());
        let link = EntryInfo::from(link);
        assert_eq!(link.file_type, FileType::Symlink);
        assert!(link.is_symlink);
        assert_eq!(link.symlink_target.as_deref(), Some("/t"));

        // Hostile values from the agent are clamped or dropped, never an encoding failure.
        let mut wild = entry(AgentFileType::File);
        wild.size = u64::MAX;
        wild.mtime_secs = i64::MAX;
        wild.mtime_nanos = u32::MAX;
        let wild = EntryInfo::from(wild);
        assert_eq!(wild.size, i64::MAX);
        assert_eq!(wild.modified_time, None);
        let json = serde_json::to_value(&wild).unwrap();
        assert_eq!(json["size"], json!("9223372036854775807"));
    }

    #[test]
    fn events_and_infos_convert() {
        let ev: StartResponse = ProcEvent::Stdout(b"hi".to_vec()).into();
        assert_eq!(
            serde_json::to_value(&ev).unwrap(),
            json!({"event":{"data":{"stdout":"aGk="}}})
        );
        let end: StartResponse = ProcEvent::End(ProcEnd {
            exit_code: 1,
            exited: true,
            status: "exit status 1".into(),
            error: None,
        })
        .into();
        assert_eq!(
            serde_json::to_value(&end).unwrap(),
            json!({"event":{"end":{"exitCode":1,"exited":true,"status":"exit status 1"}}})
        );
        assert_eq!(
            ProcessEvent::from(ProcEvent::Stderr(vec![1])),
            ProcessEvent::Data(DataEvent::Stderr(vec![1]))
        );
        assert_eq!(
            ProcessEvent::from(ProcEvent::Pty(vec![2])),
            ProcessEvent::Data(DataEvent::Pty(vec![2]))
        );
        let info = ProcessInfo::from(ProcInfo {
            pid: 3,
            tag: Some("t".into()),
            cmd: "c".into(),
            args: vec![],
            envs: vec![("K".into(), "V".into())],
            cwd: Some("/".into()),
        });
        assert_eq!(
            serde_json::to_value(&info).unwrap(),
            json!({"config":{"cmd":"c","envs":{"K":"V"},"cwd":"/"},"pid":3,"tag":"t"})
        );
        for (op, name) in [
            (FsOp::Create, "EVENT_TYPE_CREATE"),
            (FsOp::Write, "EVENT_TYPE_WRITE"),
            (FsOp::Remove, "EVENT_TYPE_REMOVE"),
            (FsOp::Rename, "EVENT_TYPE_RENAME"),
            (FsOp::Chmod, "EVENT_TYPE_CHMOD"),
        ] {
            let ev = FilesystemEvent::from(FsEvent {
                name: "f".into(),
                op,
            });
            assert_eq!(
                serde_json::to_value(&ev).unwrap(),
                json!({"name":"f","type":name})
            );
        }
        let _ = PtySize::default();
    }
}
