//! Conversions between the envd wire messages and the core's calls.
//!
//! Requests become [`Call`]s and [`ProcessSpec`]s here, before they reach the core: a missing
//! process selector, a missing terminal size or an unknown signal is a malformed message, and
//! whatever the core's checked values refuse (an empty command, a NUL byte in a path, argument
//! or environment entry, a terminal size that does not fit the kernel) becomes
//! `invalid_argument` too. Replies come from the agent (inside the sandbox) and are converted
//! totally: values the wire cannot express are clamped or dropped, never trusted to be in
//! range.

use husk_core::calls::{
    Call, Entry, FileType as CoreFileType, FsEvent, FsOp, InvalidValue, ProcEnd, ProcEvent,
    ProcInfo, ProcessSpec, SandboxPath, Selector, Signal as CoreSignal, TerminalSize, User,
};
use husk_core::manager::EnvVars;

use crate::connect::ConnectError;

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

/// A unary request that is exactly one call of the core.
pub trait ToCall {
    /// Validates the request and builds the call, on behalf of `user` (from the call's Basic
    /// auth, or the sandbox's default user).
    fn into_call(self, user: User) -> Result<Call, ConnectError>;
}

impl From<InvalidValue> for ConnectError {
    fn from(e: InvalidValue) -> Self {
        ConnectError::invalid_argument(e.to_string())
    }
}

fn selector(sel: Option<ProcessSelector>) -> Result<Selector, ConnectError> {
    sel.map(Selector::from)
        .ok_or_else(|| ConnectError::invalid_argument("missing process selector (pid or tag)"))
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
    /// The terminal size: both sides are required (see [`TerminalSize`]).
    pub fn size(&self) -> Result<TerminalSize, ConnectError> {
        let size = self
            .size
            .ok_or_else(|| ConnectError::invalid_argument("pty without a size"))?;
        Ok(TerminalSize::new(size.cols, size.rows)?)
    }
}

impl StartRequest {
    /// The process to start. `timeout_ms` is the call's `Connect-Timeout-Ms`, which envd uses
    /// as the process's lifetime. An empty `cwd` or `tag` counts as unset.
    pub fn into_spec(
        self,
        user: User,
        timeout_ms: Option<u64>,
    ) -> Result<ProcessSpec, ConnectError> {
        let config = self
            .process
            .ok_or_else(|| ConnectError::invalid_argument("missing process config"))?;
        let envs = EnvVars::new(config.envs.into_iter().collect())
            .map_err(|e| ConnectError::invalid_argument(e.to_string()))?;
        let mut spec = ProcessSpec::new(config.cmd, config.args)?
            .env(envs)
            .user(user)
            .tag(self.tag.unwrap_or_default())
            .stdin(self.stdin.unwrap_or(true))
            .timeout_ms(timeout_ms);
        if let Some(cwd) = config.cwd.filter(|c| !c.is_empty()) {
            spec = spec.cwd(SandboxPath::named("cwd", cwd)?);
        }
        if let Some(pty) = &self.pty {
            spec = spec.pty(pty.size()?);
        }
        Ok(spec)
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
    /// The call writing this chunk to the process chosen by the stream's start.
    pub fn into_call(self, process: Selector) -> Result<Call, ConnectError> {
        let (data, pty) = self
            .input
            .ok_or_else(|| ConnectError::invalid_argument("data event without input"))?
            .into_parts();
        Ok(Call::SendInput { process, data, pty })
    }
}

impl ConnectRequest {
    /// The process to re-attach to.
    pub fn selector(self) -> Result<Selector, ConnectError> {
        selector(self.process)
    }
}

impl ToCall for ListRequest {
    fn into_call(self, _user: User) -> Result<Call, ConnectError> {
        Ok(Call::ListProcesses)
    }
}

impl ToCall for UpdateRequest {
    /// `Resize`; without a pty the update changes nothing, and only finds the process, so the
    /// call still fails with `not_found` for a process that does not exist.
    fn into_call(self, _user: User) -> Result<Call, ConnectError> {
        let process = selector(self.process)?;
        match self.pty {
            Some(pty) => Ok(Call::Resize {
                process,
                size: pty.size()?,
            }),
            None => Ok(Call::FindProcess(process)),
        }
    }
}

impl ToCall for SendInputRequest {
    fn into_call(self, _user: User) -> Result<Call, ConnectError> {
        let process = selector(self.process)?;
        StreamInputData { input: self.input }.into_call(process)
    }
}

impl ToCall for SendSignalRequest {
    /// Only the two signals the protocol defines are sent.
    fn into_call(self, _user: User) -> Result<Call, ConnectError> {
        let process = selector(self.process)?;
        let signal = match self.signal {
            Signal::Sigterm => CoreSignal::Terminate,
            Signal::Sigkill => CoreSignal::Kill,
            Signal::Unspecified => {
                return Err(ConnectError::invalid_argument(
                    "signal must be SIGNAL_SIGTERM or SIGNAL_SIGKILL",
                ))
            }
        };
        Ok(Call::Signal { process, signal })
    }
}

impl ToCall for CloseStdinRequest {
    fn into_call(self, _user: User) -> Result<Call, ConnectError> {
        Ok(Call::CloseStdin(selector(self.process)?))
    }
}

impl ToCall for StatRequest {
    fn into_call(self, user: User) -> Result<Call, ConnectError> {
        let path = SandboxPath::new(self.path)?;
        Ok(Call::Stat { path, user })
    }
}

impl ToCall for MakeDirRequest {
    fn into_call(self, user: User) -> Result<Call, ConnectError> {
        let path = SandboxPath::new(self.path)?;
        Ok(Call::MakeDir { path, user })
    }
}

impl ToCall for RemoveRequest {
    fn into_call(self, user: User) -> Result<Call, ConnectError> {
        let path = SandboxPath::new(self.path)?;
        Ok(Call::Remove { path, user })
    }
}

impl ToCall for MoveRequest {
    fn into_call(self, user: User) -> Result<Call, ConnectError> {
        Ok(Call::Move {
            from: SandboxPath::named("source", self.source)?,
            to: SandboxPath::named("destination", self.destination)?,
            user,
        })
    }
}

impl ToCall for ListDirRequest {
    /// Depth 0 (unset) lists the directory's own entries, like depth 1.
    fn into_call(self, user: User) -> Result<Call, ConnectError> {
        let path = SandboxPath::new(self.path)?;
        Ok(Call::ListDir {
            path,
            depth: self.depth.max(1),
            user,
        })
    }
}

impl WatchDirRequest {
    /// The directory to watch and whether below it too. `include_entry` and
    /// `allow_network_mounts` stay with the caller: the former asks it to stat each event's
    /// path, the latter has no meaning inside a husk sandbox (it has no network mounts).
    pub fn watched(&self) -> Result<(SandboxPath, bool), ConnectError> {
        Ok((SandboxPath::new(self.path.clone())?, self.recursive))
    }
}

impl From<Entry> for EntryInfo {
    fn from(entry: Entry) -> Self {
        let file_type = match entry.file_type {
            CoreFileType::File => FileType::File,
            CoreFileType::Dir => FileType::Directory,
            CoreFileType::Other => FileType::Unspecified,
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
            // envd as E2B runs it reports a symlink with its target's type and never marks
            // the link itself: the SDKs then show the target's type, and the link in
            // `symlink_target`.
            is_symlink: false,
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

    fn start(v: serde_json::Value) -> Result<ProcessSpec, ConnectError> {
        serde_json::from_value::<StartRequest>(v)
            .unwrap()
            .into_spec(User::User, Some(5000))
    }

    fn path(p: &str) -> SandboxPath {
        SandboxPath::new(p).unwrap()
    }

    #[test]
    fn start_request_converts() {
        let p = start(json!({
            "process": {"cmd": "/bin/bash", "args": ["-l", "-c", "ls"],
                        "envs": {"B": "2", "A": "1"}, "cwd": "~/x"},
            "stdin": false
        }))
        .unwrap();
        let env = EnvVars::new(vec![("A".into(), "1".into()), ("B".into(), "2".into())]).unwrap();
        let expected = ProcessSpec::new("/bin/bash", vec!["-l".into(), "-c".into(), "ls".into()])
            .unwrap()
            .env(env)
            .cwd(path("~/x"))
            .user(User::User)
            .stdin(false)
            .timeout_ms(Some(5000));
        assert_eq!(p, expected);
        let p = start(json!({
            "process": {"cmd": "/bin/bash", "cwd": ""},
            "pty": {"size": {"cols": 80, "rows": 24}},
            "tag": ""
        }))
        .unwrap();
        assert_eq!(p.terminal(), Some((80, 24)));
        assert_eq!(p.working_dir(), None);
        assert_eq!(p.process_tag(), None);
        assert!(p.stdin_open(), "unset stdin means open");
        let p =
            start(json!({"process": {"cmd": "x"}, "pty": {"size": {"cols": 65535, "rows": 1}}}));
        assert_eq!(p.unwrap().terminal(), Some((65535, 1)));
        let p = start(json!({"process": {"cmd": "x"}, "tag": "t"})).unwrap();
        assert_eq!(p.process_tag(), Some("t"));
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

    fn req<T: ToCall + for<'de> serde::Deserialize<'de>>(
        v: serde_json::Value,
    ) -> Result<Call, ConnectError> {
        serde_json::from_value::<T>(v)
            .unwrap()
            .into_call(User::Root)
    }

    #[test]
    fn process_requests_convert() {
        let connect = |v| {
            serde_json::from_value::<ConnectRequest>(v)
                .unwrap()
                .selector()
        };
        assert_eq!(
            connect(json!({"process":{"pid":4}})).unwrap(),
            Selector::Pid(4)
        );
        assert_eq!(connect(json!({})).unwrap_err().code, Code::InvalidArgument);
        assert_eq!(req::<ListRequest>(json!({})).unwrap(), Call::ListProcesses);
        assert_eq!(
            req::<UpdateRequest>(
                json!({"process":{"tag":"t"},"pty":{"size":{"cols":100,"rows":30}}})
            )
            .unwrap(),
            Call::Resize {
                process: Selector::Tag("t".into()),
                size: TerminalSize::new(100, 30).unwrap(),
            }
        );
        assert_eq!(
            req::<UpdateRequest>(json!({"process":{"pid":1}})).unwrap(),
            Call::FindProcess(Selector::Pid(1))
        );
        assert!(req::<UpdateRequest>(
            json!({"process":{"pid":1},"pty":{"size":{"cols":0,"rows":1}}})
        )
        .is_err());
        assert_eq!(
            req::<SendInputRequest>(json!({"process":{"pid":2},"input":{"pty":"aGk="}})).unwrap(),
            Call::SendInput {
                process: Selector::Pid(2),
                data: b"hi".to_vec(),
                pty: true
            }
        );
        assert!(req::<SendInputRequest>(json!({"process":{"pid":2}})).is_err());
        assert_eq!(
            req::<SendSignalRequest>(json!({"process":{"pid":2},"signal":"SIGNAL_SIGKILL"}))
                .unwrap(),
            Call::Signal {
                process: Selector::Pid(2),
                signal: CoreSignal::Kill
            }
        );
        assert_eq!(
            req::<SendSignalRequest>(json!({"process":{"pid":2},"signal":15})).unwrap(),
            Call::Signal {
                process: Selector::Pid(2),
                signal: CoreSignal::Terminate
            }
        );
        let err = req::<SendSignalRequest>(json!({"process":{"pid":2}})).unwrap_err();
        assert_eq!(err.code, Code::InvalidArgument);
        assert_eq!(
            req::<CloseStdinRequest>(json!({"process":{"pid":8}})).unwrap(),
            Call::CloseStdin(Selector::Pid(8))
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
            data.into_call(sel.clone()).unwrap(),
            Call::SendInput {
                process: sel,
                data: b"x".to_vec(),
                pty: false
            }
        );
        assert!(StreamInputStart::default().selector().is_err());
        assert!(StreamInputData::default()
            .into_call(Selector::Pid(1))
            .is_err());
    }

    #[test]
    fn filesystem_requests_convert() {
        let root = User::Root;
        assert_eq!(
            req::<StatRequest>(json!({"path":"~/a"})).unwrap(),
            Call::Stat {
                path: path("~/a"),
                user: root
            }
        );
        assert_eq!(
            req::<MakeDirRequest>(json!({"path":"d"})).unwrap(),
            Call::MakeDir {
                path: path("d"),
                user: root
            }
        );
        assert_eq!(
            req::<RemoveRequest>(json!({"path":"d"})).unwrap(),
            Call::Remove {
                path: path("d"),
                user: root
            }
        );
        assert!(req::<RemoveRequest>(json!({"path":"a\u{0}"})).is_err());
        assert!(req::<StatRequest>(json!({"path":"a\u{0}"})).is_err());
        let long = "x".repeat(husk_core::calls::MAX_PATH + 1);
        assert_eq!(
            req::<StatRequest>(json!({ "path": long }))
                .unwrap_err()
                .code,
            Code::InvalidArgument
        );
        assert_eq!(
            req::<MoveRequest>(json!({"source":"a","destination":"b"})).unwrap(),
            Call::Move {
                from: path("a"),
                to: path("b"),
                user: root
            }
        );
        let err = req::<MoveRequest>(json!({"source":"a","destination":"\u{0}"})).unwrap_err();
        assert_eq!(err.message, "destination contains a NUL byte");
        assert_eq!(
            req::<ListDirRequest>(json!({"path":"/"})).unwrap(),
            Call::ListDir {
                path: path("/"),
                depth: 1,
                user: root
            }
        );
        assert_eq!(
            req::<ListDirRequest>(json!({"path":"/","depth":3})).unwrap(),
            Call::ListDir {
                path: path("/"),
                depth: 3,
                user: root
            }
        );
        let watch: WatchDirRequest =
            serde_json::from_value(json!({"path":"/w","recursive":true})).unwrap();
        assert_eq!(watch.watched().unwrap(), (path("/w"), true));
        let watch: WatchDirRequest = serde_json::from_value(json!({"path":"\u{0}"})).unwrap();
        assert!(watch.watched().is_err());
    }

    fn entry(file_type: CoreFileType) -> Entry {
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
        let e = EntryInfo::from(entry(CoreFileType::File));
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
            EntryInfo::from(entry(CoreFileType::Dir)).file_type,
            FileType::Directory
        );
        let other = EntryInfo::from(entry(CoreFileType::Other));
        assert_eq!(other.file_type, FileType::Unspecified);
        assert!(serde_json::to_value(&other).unwrap().get("type").is_none());
        // A link to a file: the file's type, the link in its target, never marked itself
        // (as E2B's envd reports it; SDK 2.63 would show SYMLINK for `is_symlink`).
        let mut link = entry(CoreFileType::File);
        link.symlink_target = Some("/t".into());
        let link = EntryInfo::from(link);
        assert_eq!(link.file_type, FileType::File);
        assert!(!link.is_symlink);
        assert!(serde_json::to_value(&link)
            .unwrap()
            .get("isSymlink")
            .is_none());
        assert_eq!(link.symlink_target.as_deref(), Some("/t"));

        // Hostile values from the agent are clamped or dropped, never an encoding failure.
        let mut wild = entry(CoreFileType::File);
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
