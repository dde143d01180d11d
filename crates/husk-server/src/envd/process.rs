//! proto3-JSON messages of the `process.Process` service.
//!
//! Field names are written in lowerCamelCase and read in lowerCamelCase or the proto's
//! snake_case; default values are left out when writing; unknown fields are ignored. A oneof is
//! a Rust enum written as the single key of its set member; reading one with several members
//! set fails, and so does reading an input oneof with none set (`ProcessSelector`,
//! `ProcessInput`), as no call can proceed without it.

use std::collections::BTreeMap;

use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};

use super::wire::{self, proto_enum, Base64, Base64Ref, Int};

/// Messages without fields: `KeepAlive`, `StartEvent` of a watch, and the empty responses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Empty {}

pub type KeepAlive = Empty;
pub type ListRequest = Empty;
pub type UpdateResponse = Empty;
pub type SendInputResponse = Empty;
pub type StreamInputResponse = Empty;
pub type SendSignalResponse = Empty;
pub type CloseStdinResponse = Empty;

proto_enum! {
    /// `process.Signal`.
    pub enum Signal ("process.Signal") {
        Unspecified = 0 => "SIGNAL_UNSPECIFIED",
        Sigterm = 15 => "SIGNAL_SIGTERM",
        Sigkill = 9 => "SIGNAL_SIGKILL",
    }
}

/// `process.ProcessSelector`: which process a call is about.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "ProcessSelectorRaw")]
pub enum ProcessSelector {
    Pid(u32),
    Tag(String),
}

#[derive(Deserialize)]
struct ProcessSelectorRaw {
    #[serde(default)]
    pid: Option<Int<u32>>,
    #[serde(default)]
    tag: Option<String>,
}

impl TryFrom<ProcessSelectorRaw> for ProcessSelector {
    type Error = String;

    fn try_from(raw: ProcessSelectorRaw) -> Result<Self, String> {
        let members = [
            raw.pid.map(|p| ProcessSelector::Pid(p.0)),
            raw.tag.map(ProcessSelector::Tag),
        ];
        wire::oneof("process.ProcessSelector.selector", members)?
            .ok_or_else(|| "process selector needs a pid or a tag".to_string())
    }
}

impl Serialize for ProcessSelector {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(1))?;
        match self {
            ProcessSelector::Pid(pid) => map.serialize_entry("pid", pid)?,
            ProcessSelector::Tag(tag) => map.serialize_entry("tag", tag)?,
        }
        map.end()
    }
}

/// `process.ProcessConfig`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ProcessConfig {
    #[serde(
        default,
        deserialize_with = "wire::nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub cmd: String,
    #[serde(
        default,
        deserialize_with = "wire::nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub args: Vec<String>,
    #[serde(
        default,
        deserialize_with = "wire::nullable",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub envs: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

/// `process.PTY.Size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PtySize {
    #[serde(
        default,
        deserialize_with = "wire::int",
        skip_serializing_if = "wire::is_zero"
    )]
    pub cols: u32,
    #[serde(
        default,
        deserialize_with = "wire::int",
        skip_serializing_if = "wire::is_zero"
    )]
    pub rows: u32,
}

/// `process.PTY`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Pty {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<PtySize>,
}

/// `process.StartRequest`. An unset `stdin` means `true` (SDKs before the flag existed
/// expected an open stdin).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StartRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<Pty>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<bool>,
}

/// `process.ConnectRequest`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ConnectRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessSelector>,
}

/// `process.ProcessInfo`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ProcessInfo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<ProcessConfig>,
    #[serde(
        default,
        deserialize_with = "wire::int",
        skip_serializing_if = "wire::is_zero"
    )]
    pub pid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// `process.ListResponse`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ListResponse {
    #[serde(
        default,
        deserialize_with = "wire::nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub processes: Vec<ProcessInfo>,
}

/// `process.UpdateRequest` (terminal resize).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct UpdateRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<Pty>,
}

/// `process.ProcessInput`: bytes for the process's stdin or its terminal.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "ProcessInputRaw")]
pub enum ProcessInput {
    Stdin(Vec<u8>),
    Pty(Vec<u8>),
}

#[derive(Deserialize)]
struct ProcessInputRaw {
    #[serde(default)]
    stdin: Option<Base64>,
    #[serde(default)]
    pty: Option<Base64>,
}

impl TryFrom<ProcessInputRaw> for ProcessInput {
    type Error = String;

    fn try_from(raw: ProcessInputRaw) -> Result<Self, String> {
        let members = [
            raw.stdin.map(|b| ProcessInput::Stdin(b.0)),
            raw.pty.map(|b| ProcessInput::Pty(b.0)),
        ];
        wire::oneof("process.ProcessInput.input", members)?
            .ok_or_else(|| "process input needs stdin or pty".to_string())
    }
}

impl Serialize for ProcessInput {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(1))?;
        match self {
            ProcessInput::Stdin(b) => map.serialize_entry("stdin", &Base64Ref(b))?,
            ProcessInput::Pty(b) => map.serialize_entry("pty", &Base64Ref(b))?,
        }
        map.end()
    }
}

/// `process.SendInputRequest`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SendInputRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<ProcessInput>,
}

/// `process.StreamInputRequest.StartEvent`: names the process the stream writes to.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StreamInputStart {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessSelector>,
}

/// `process.StreamInputRequest.DataEvent`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StreamInputData {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<ProcessInput>,
}

/// `process.StreamInputRequest`: one message of the client stream. `None` when the client sent
/// an empty message (valid proto; callers skip it like a keepalive).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(try_from = "StreamInputRequestRaw")]
pub struct StreamInputRequest {
    pub event: Option<StreamInputEvent>,
}

/// The `event` oneof of [`StreamInputRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamInputEvent {
    Start(StreamInputStart),
    Data(StreamInputData),
    Keepalive,
}

#[derive(Deserialize)]
struct StreamInputRequestRaw {
    #[serde(default)]
    start: Option<StreamInputStart>,
    #[serde(default)]
    data: Option<StreamInputData>,
    #[serde(default)]
    keepalive: Option<KeepAlive>,
}

impl TryFrom<StreamInputRequestRaw> for StreamInputRequest {
    type Error = String;

    fn try_from(raw: StreamInputRequestRaw) -> Result<Self, String> {
        let members = [
            raw.start.map(StreamInputEvent::Start),
            raw.data.map(StreamInputEvent::Data),
            raw.keepalive.map(|_| StreamInputEvent::Keepalive),
        ];
        let event = wire::oneof("process.StreamInputRequest.event", members)?;
        Ok(StreamInputRequest { event })
    }
}

impl Serialize for StreamInputRequest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        match &self.event {
            Some(StreamInputEvent::Start(start)) => map.serialize_entry("start", start)?,
            Some(StreamInputEvent::Data(data)) => map.serialize_entry("data", data)?,
            Some(StreamInputEvent::Keepalive) => map.serialize_entry("keepalive", &Empty {})?,
            None => {}
        }
        map.end()
    }
}

/// `process.SendSignalRequest`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SendSignalRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessSelector>,
    #[serde(default, skip_serializing_if = "wire::is_zero")]
    pub signal: Signal,
}

/// `process.CloseStdinRequest`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CloseStdinRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessSelector>,
}

/// `process.ProcessEvent.StartEvent`: the first event of every Start/Connect stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StartEvent {
    #[serde(
        default,
        deserialize_with = "wire::int",
        skip_serializing_if = "wire::is_zero"
    )]
    pub pid: u32,
}

/// `process.ProcessEvent.DataEvent`: a chunk of output.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "DataEventRaw")]
pub enum DataEvent {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Pty(Vec<u8>),
}

#[derive(Deserialize)]
struct DataEventRaw {
    #[serde(default)]
    stdout: Option<Base64>,
    #[serde(default)]
    stderr: Option<Base64>,
    #[serde(default)]
    pty: Option<Base64>,
}

impl TryFrom<DataEventRaw> for DataEvent {
    type Error = String;

    fn try_from(raw: DataEventRaw) -> Result<Self, String> {
        let members = [
            raw.stdout.map(|b| DataEvent::Stdout(b.0)),
            raw.stderr.map(|b| DataEvent::Stderr(b.0)),
            raw.pty.map(|b| DataEvent::Pty(b.0)),
        ];
        wire::oneof("process.ProcessEvent.DataEvent.output", members)?
            .ok_or_else(|| "data event without output".to_string())
    }
}

impl Serialize for DataEvent {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(1))?;
        let (key, bytes) = match self {
            DataEvent::Stdout(b) => ("stdout", b),
            DataEvent::Stderr(b) => ("stderr", b),
            DataEvent::Pty(b) => ("pty", b),
        };
        map.serialize_entry(key, &Base64Ref(bytes))?;
        map.end()
    }
}

/// `process.ProcessEvent.EndEvent`: how the process ended (the last event of a stream).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndEvent {
    #[serde(
        default,
        alias = "exit_code",
        deserialize_with = "wire::int",
        skip_serializing_if = "wire::is_zero"
    )]
    pub exit_code: i32,
    #[serde(
        default,
        deserialize_with = "wire::nullable",
        skip_serializing_if = "wire::is_false"
    )]
    pub exited: bool,
    #[serde(
        default,
        deserialize_with = "wire::nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `process.ProcessEvent`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "ProcessEventRaw")]
pub enum ProcessEvent {
    Start(StartEvent),
    Data(DataEvent),
    End(EndEvent),
    Keepalive,
}

#[derive(Deserialize)]
struct ProcessEventRaw {
    #[serde(default)]
    start: Option<StartEvent>,
    #[serde(default)]
    data: Option<DataEvent>,
    #[serde(default)]
    end: Option<EndEvent>,
    #[serde(default)]
    keepalive: Option<KeepAlive>,
}

impl TryFrom<ProcessEventRaw> for ProcessEvent {
    type Error = String;

    fn try_from(raw: ProcessEventRaw) -> Result<Self, String> {
        let members = [
            raw.start.map(ProcessEvent::Start),
            raw.data.map(ProcessEvent::Data),
            raw.end.map(ProcessEvent::End),
            raw.keepalive.map(|_| ProcessEvent::Keepalive),
        ];
        wire::oneof("process.ProcessEvent.event", members)?
            .ok_or_else(|| "process event without a member".to_string())
    }
}

impl Serialize for ProcessEvent {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(1))?;
        match self {
            ProcessEvent::Start(e) => map.serialize_entry("start", e)?,
            ProcessEvent::Data(e) => map.serialize_entry("data", e)?,
            ProcessEvent::End(e) => map.serialize_entry("end", e)?,
            ProcessEvent::Keepalive => map.serialize_entry("keepalive", &Empty {})?,
        }
        map.end()
    }
}

/// `process.StartResponse`, and `process.ConnectResponse`, which has the same shape.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StartResponse {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<ProcessEvent>,
}

pub type ConnectResponse = StartResponse;

impl StartResponse {
    /// The first message of a Start or Connect stream.
    pub fn start(pid: u32) -> Self {
        ProcessEvent::Start(StartEvent { pid }).into()
    }

    /// A keepalive message, sent every `Keepalive-Ping-Interval` seconds.
    pub fn keepalive() -> Self {
        ProcessEvent::Keepalive.into()
    }
}

impl From<ProcessEvent> for StartResponse {
    fn from(event: ProcessEvent) -> Self {
        StartResponse { event: Some(event) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn out<T: Serialize>(v: &T) -> Value {
        serde_json::to_value(v).unwrap()
    }

    fn parse<T: for<'de> Deserialize<'de>>(v: Value) -> Result<T, serde_json::Error> {
        serde_json::from_value(v)
    }

    #[test]
    fn events_serialize_like_the_sdk_expects() {
        assert_eq!(
            out(&StartResponse::start(123)),
            json!({"event":{"start":{"pid":123}}})
        );
        assert_eq!(
            out(&StartResponse::keepalive()),
            json!({"event":{"keepalive":{}}})
        );
        let data = StartResponse::from(ProcessEvent::Data(DataEvent::Stdout(b"hi".to_vec())));
        assert_eq!(out(&data), json!({"event":{"data":{"stdout":"aGk="}}}));
        let data = StartResponse::from(ProcessEvent::Data(DataEvent::Pty(vec![])));
        assert_eq!(out(&data), json!({"event":{"data":{"pty":""}}}));
        let end = StartResponse::from(ProcessEvent::End(EndEvent {
            exit_code: 1,
            exited: true,
            status: "exit status 1".into(),
            error: None,
        }));
        assert_eq!(
            out(&end),
            json!({"event":{"end":{"exitCode":1,"exited":true,"status":"exit status 1"}}})
        );
        // Defaults are left out: exit code 0 and exited=false disappear.
        let killed = ProcessEvent::End(EndEvent {
            exit_code: 0,
            exited: false,
            status: "signal: killed".into(),
            error: Some("timeout".into()),
        });
        assert_eq!(
            out(&killed),
            json!({"end":{"status":"signal: killed","error":"timeout"}})
        );
        assert_eq!(
            out(&ProcessEvent::End(EndEvent::default())),
            json!({"end":{}})
        );
    }

    #[test]
    fn events_round_trip() {
        for ev in [
            ProcessEvent::Start(StartEvent { pid: 7 }),
            ProcessEvent::Data(DataEvent::Stderr(vec![0, 255, 10])),
            ProcessEvent::End(EndEvent {
                exit_code: -1,
                exited: false,
                status: "signal: killed".into(),
                error: None,
            }),
            ProcessEvent::Keepalive,
        ] {
            let back: ProcessEvent = parse(out(&ev)).unwrap();
            assert_eq!(back, ev);
        }
        let end: EndEvent = parse(json!({"exit_code": "3", "exited": true})).unwrap();
        assert_eq!(end.exit_code, 3);
        assert!(parse::<ProcessEvent>(json!({})).is_err());
        assert!(parse::<ProcessEvent>(json!({"start":{},"keepalive":{}})).is_err());
        assert!(parse::<DataEvent>(json!({"stdout":"%%%"})).is_err());
    }

    #[test]
    fn start_request_as_the_sdk_sends_it() {
        let req: StartRequest = parse(json!({
            "process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"],
                        "envs": {"A": "1"}, "cwd": "/tmp"},
            "stdin": false,
            "somethingNew": {"x": 1}
        }))
        .unwrap();
        let process = req.process.as_ref().unwrap();
        assert_eq!(process.cmd, "/bin/bash");
        assert_eq!(process.args, ["-l", "-c", "echo hi"]);
        assert_eq!(process.envs["A"], "1");
        assert_eq!(process.cwd.as_deref(), Some("/tmp"));
        assert_eq!(req.stdin, Some(false));
        assert_eq!(req.pty, None);

        let pty: StartRequest = parse(json!({
            "process": {"cmd": "/bin/bash", "args": ["-i", "-l"], "envs": null},
            "pty": {"size": {"cols": "80", "rows": 24}},
            "tag": "t1"
        }))
        .unwrap();
        assert_eq!(pty.pty.unwrap().size, Some(PtySize { cols: 80, rows: 24 }));
        assert_eq!(pty.tag.as_deref(), Some("t1"));
        assert_eq!(pty.stdin, None);
        assert!(parse::<StartRequest>(json!({"process": {"cmd": 5}})).is_err());
        assert!(parse::<StartRequest>(json!({"pty": {"size": {"cols": -1}}})).is_err());
    }

    #[test]
    fn selectors_and_inputs() {
        let c: ConnectRequest = parse(json!({"process":{"pid":42}})).unwrap();
        assert_eq!(c.process, Some(ProcessSelector::Pid(42)));
        let c: ConnectRequest = parse(json!({"process":{"pid":"42"}})).unwrap();
        assert_eq!(c.process, Some(ProcessSelector::Pid(42)));
        let c: ConnectRequest = parse(json!({"process":{"tag":"web"}})).unwrap();
        assert_eq!(c.process, Some(ProcessSelector::Tag("web".into())));
        assert_eq!(out(&c), json!({"process":{"tag":"web"}}));
        assert!(parse::<ConnectRequest>(json!({"process":{}})).is_err());
        assert!(parse::<ConnectRequest>(json!({"process":{"pid":1,"tag":"x"}})).is_err());
        assert_eq!(parse::<ConnectRequest>(json!({})).unwrap().process, None);

        let s: SendInputRequest =
            parse(json!({"process":{"pid":1},"input":{"stdin":"aGk="}})).unwrap();
        assert_eq!(s.input, Some(ProcessInput::Stdin(b"hi".to_vec())));
        let s: SendInputRequest =
            parse(json!({"process":{"pid":1},"input":{"pty":"AQI"}})).unwrap();
        assert_eq!(s.input, Some(ProcessInput::Pty(vec![1, 2])));
        assert_eq!(out(&s), json!({"process":{"pid":1},"input":{"pty":"AQI="}}));
        assert!(parse::<SendInputRequest>(json!({"input":{"stdin":"not base64!"}})).is_err());
    }

    #[test]
    fn stream_input_messages() {
        let m: StreamInputRequest = parse(json!({"start":{"process":{"pid":42}}})).unwrap();
        assert_eq!(
            m.event,
            Some(StreamInputEvent::Start(StreamInputStart {
                process: Some(ProcessSelector::Pid(42))
            }))
        );
        let m: StreamInputRequest = parse(json!({"data":{"input":{"stdin":"eA=="}}})).unwrap();
        assert_eq!(
            m.event,
            Some(StreamInputEvent::Data(StreamInputData {
                input: Some(ProcessInput::Stdin(b"x".to_vec()))
            }))
        );
        let m: StreamInputRequest = parse(json!({"keepalive":{}})).unwrap();
        assert_eq!(m.event, Some(StreamInputEvent::Keepalive));
        assert_eq!(out(&m), json!({"keepalive":{}}));
        let m: StreamInputRequest = parse(json!({})).unwrap();
        assert_eq!(m.event, None);
        assert!(parse::<StreamInputRequest>(json!({"keepalive":{},"data":{}})).is_err());
    }

    #[test]
    fn signals_by_name_and_number() {
        let s: SendSignalRequest =
            parse(json!({"process":{"pid":3},"signal":"SIGNAL_SIGKILL"})).unwrap();
        assert_eq!(s.signal, Signal::Sigkill);
        let s: SendSignalRequest = parse(json!({"process":{"pid":3},"signal":15})).unwrap();
        assert_eq!(s.signal, Signal::Sigterm);
        assert_eq!(
            out(&s),
            json!({"process":{"pid":3},"signal":"SIGNAL_SIGTERM"})
        );
        let s: SendSignalRequest = parse(json!({"process":{"pid":3}})).unwrap();
        assert_eq!(s.signal, Signal::Unspecified);
        assert_eq!(out(&s), json!({"process":{"pid":3}}));
        for bad in [
            json!("SIGKILL"),
            json!("SIGNAL_SIGINT"),
            json!(2),
            json!("9"),
        ] {
            let res = parse::<SendSignalRequest>(json!({"signal": bad.clone()}));
            assert!(res.is_err(), "{bad}");
        }
    }

    #[test]
    fn list_response_and_process_info() {
        let list = ListResponse {
            processes: vec![ProcessInfo {
                config: Some(ProcessConfig {
                    cmd: "sleep".into(),
                    args: vec!["10".into()],
                    envs: BTreeMap::new(),
                    cwd: None,
                }),
                pid: 9,
                tag: None,
            }],
        };
        assert_eq!(
            out(&list),
            json!({"processes":[{"config":{"cmd":"sleep","args":["10"]},"pid":9}]})
        );
        assert_eq!(out(&ListResponse::default()), json!({}));
        assert_eq!(
            parse::<ListResponse>(json!({"processes":null})).unwrap(),
            ListResponse::default()
        );
        assert_eq!(out(&Empty {}), json!({}));
        assert_eq!(parse::<Empty>(json!({"anything": [1]})).unwrap(), Empty {});
    }
}
