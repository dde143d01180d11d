//! proto3-JSON messages of the `filesystem.Filesystem` service (same conventions as
//! [`super::process`]).

use std::collections::BTreeMap;

use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};

use super::process::{Empty, KeepAlive};
use super::wire::{self, proto_enum, Timestamp};

pub type RemoveResponse = Empty;
pub type RemoveWatcherResponse = Empty;

proto_enum! {
    /// `filesystem.FileType`.
    pub enum FileType ("filesystem.FileType") {
        Unspecified = 0 => "FILE_TYPE_UNSPECIFIED",
        File = 1 => "FILE_TYPE_FILE",
        Directory = 2 => "FILE_TYPE_DIRECTORY",
        Symlink = 3 => "FILE_TYPE_SYMLINK",
    }
}

proto_enum! {
    /// `filesystem.EventType`.
    pub enum EventType ("filesystem.EventType") {
        Unspecified = 0 => "EVENT_TYPE_UNSPECIFIED",
        Create = 1 => "EVENT_TYPE_CREATE",
        Write = 2 => "EVENT_TYPE_WRITE",
        Remove = 3 => "EVENT_TYPE_REMOVE",
        Rename = 4 => "EVENT_TYPE_RENAME",
        Chmod = 5 => "EVENT_TYPE_CHMOD",
    }
}

/// `filesystem.EntryInfo`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EntryInfo {
    #[serde(
        default,
        deserialize_with = "wire::nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub name: String,
    #[serde(rename = "type", default, skip_serializing_if = "wire::is_zero")]
    pub file_type: FileType,
    #[serde(
        default,
        deserialize_with = "wire::nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub path: String,
    /// `int64`: written as a string.
    #[serde(
        default,
        deserialize_with = "wire::int",
        serialize_with = "wire::int64_string",
        skip_serializing_if = "wire::is_zero"
    )]
    pub size: i64,
    #[serde(
        default,
        deserialize_with = "wire::int",
        skip_serializing_if = "wire::is_zero"
    )]
    pub mode: u32,
    #[serde(
        default,
        deserialize_with = "wire::nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub permissions: String,
    #[serde(
        default,
        deserialize_with = "wire::nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub owner: String,
    #[serde(
        default,
        deserialize_with = "wire::nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub group: String,
    #[serde(
        default,
        alias = "modified_time",
        skip_serializing_if = "Option::is_none"
    )]
    pub modified_time: Option<Timestamp>,
    #[serde(
        default,
        alias = "symlink_target",
        skip_serializing_if = "Option::is_none"
    )]
    pub symlink_target: Option<String>,
    #[serde(
        default,
        deserialize_with = "wire::nullable",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub metadata: BTreeMap<String, String>,
    #[serde(
        default,
        alias = "is_symlink",
        deserialize_with = "wire::nullable",
        skip_serializing_if = "wire::is_false"
    )]
    pub is_symlink: bool,
}

/// Defines a request naming one path. Stat, MakeDir and Remove share this shape but are
/// distinct types, so a request cannot be converted into another call.
macro_rules! path_request {
    ($($(#[$meta:meta])* $name:ident;)+) => {$(
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
        pub struct $name {
            #[serde(
                default,
                deserialize_with = "wire::nullable",
                skip_serializing_if = "String::is_empty"
            )]
            pub path: String,
        }
    )+};
}

path_request! {
    /// `filesystem.StatRequest`.
    StatRequest;
    /// `filesystem.MakeDirRequest`: creates parents too; `already_exists` if the path exists.
    MakeDirRequest;
    /// `filesystem.RemoveRequest`.
    RemoveRequest;
}

/// Responses carrying one entry: `StatResponse`, `MakeDirResponse`, `MoveResponse`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct EntryResponse {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<EntryInfo>,
}

pub type StatResponse = EntryResponse;
pub type MakeDirResponse = EntryResponse;
pub type MoveResponse = EntryResponse;

impl From<EntryInfo> for EntryResponse {
    fn from(entry: EntryInfo) -> Self {
        EntryResponse { entry: Some(entry) }
    }
}

/// `filesystem.MoveRequest`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MoveRequest {
    #[serde(
        default,
        deserialize_with = "wire::nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub source: String,
    #[serde(
        default,
        deserialize_with = "wire::nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub destination: String,
}

/// `filesystem.ListDirRequest`; depth 0 means 1 (the directory's own entries).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ListDirRequest {
    #[serde(
        default,
        deserialize_with = "wire::nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub path: String,
    #[serde(
        default,
        deserialize_with = "wire::int",
        skip_serializing_if = "wire::is_zero"
    )]
    pub depth: u32,
}

/// `filesystem.ListDirResponse`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ListDirResponse {
    #[serde(
        default,
        deserialize_with = "wire::nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub entries: Vec<EntryInfo>,
}

/// `filesystem.WatchDirRequest`, and `CreateWatcherRequest`, which has the same fields.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchDirRequest {
    #[serde(
        default,
        deserialize_with = "wire::nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub path: String,
    #[serde(
        default,
        deserialize_with = "wire::nullable",
        skip_serializing_if = "wire::is_false"
    )]
    pub recursive: bool,
    /// Send each event's entry (stat of the path after the event).
    #[serde(
        default,
        alias = "include_entry",
        deserialize_with = "wire::nullable",
        skip_serializing_if = "wire::is_false"
    )]
    pub include_entry: bool,
    #[serde(
        default,
        alias = "allow_network_mounts",
        deserialize_with = "wire::nullable",
        skip_serializing_if = "wire::is_false"
    )]
    pub allow_network_mounts: bool,
}

pub type CreateWatcherRequest = WatchDirRequest;

/// `filesystem.FilesystemEvent`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FilesystemEvent {
    /// Path relative to the watched directory.
    #[serde(
        default,
        deserialize_with = "wire::nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub name: String,
    #[serde(rename = "type", default, skip_serializing_if = "wire::is_zero")]
    pub event_type: EventType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<EntryInfo>,
}

/// `filesystem.WatchDirResponse`: the `event` oneof is the message itself (`{"start":{}}`,
/// `{"filesystem":{...}}`, `{"keepalive":{}}`).
///
/// The size difference between variants is accepted: a response lives only until it is
/// serialized, and boxing would cost an allocation per event instead.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "WatchDirResponseRaw")]
pub enum WatchDirResponse {
    /// The first message of every watch stream.
    Start,
    Filesystem(FilesystemEvent),
    Keepalive,
}

#[derive(Deserialize)]
struct WatchDirResponseRaw {
    #[serde(default)]
    start: Option<Empty>,
    #[serde(default)]
    filesystem: Option<FilesystemEvent>,
    #[serde(default)]
    keepalive: Option<KeepAlive>,
}

impl TryFrom<WatchDirResponseRaw> for WatchDirResponse {
    type Error = String;

    fn try_from(raw: WatchDirResponseRaw) -> Result<Self, String> {
        let members = [
            raw.start.map(|_| WatchDirResponse::Start),
            raw.filesystem.map(WatchDirResponse::Filesystem),
            raw.keepalive.map(|_| WatchDirResponse::Keepalive),
        ];
        wire::oneof("filesystem.WatchDirResponse.event", members)?
            .ok_or_else(|| "watch response without a member".to_string())
    }
}

impl Serialize for WatchDirResponse {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(1))?;
        match self {
            WatchDirResponse::Start => map.serialize_entry("start", &Empty {})?,
            WatchDirResponse::Filesystem(e) => map.serialize_entry("filesystem", e)?,
            WatchDirResponse::Keepalive => map.serialize_entry("keepalive", &Empty {})?,
        }
        map.end()
    }
}

/// Requests and responses naming a polling watcher: `CreateWatcherResponse`,
/// `GetWatcherEventsRequest`, `RemoveWatcherRequest`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatcherId {
    #[serde(
        default,
        alias = "watcher_id",
        deserialize_with = "wire::nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub watcher_id: String,
}

pub type CreateWatcherResponse = WatcherId;
pub type GetWatcherEventsRequest = WatcherId;
pub type RemoveWatcherRequest = WatcherId;

/// `filesystem.GetWatcherEventsResponse`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct GetWatcherEventsResponse {
    #[serde(
        default,
        deserialize_with = "wire::nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub events: Vec<FilesystemEvent>,
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

    fn sample_entry() -> EntryInfo {
        EntryInfo {
            name: "hello.txt".into(),
            file_type: FileType::File,
            path: "/home/user/hello.txt".into(),
            size: 11,
            mode: 0o644,
            permissions: "-rw-r--r--".into(),
            owner: "user".into(),
            group: "user".into(),
            modified_time: Timestamp::new(1_796_040_000, 123_456_789),
            symlink_target: None,
            metadata: BTreeMap::from([("k".to_string(), "v".to_string())]),
            is_symlink: false,
        }
    }

    #[test]
    fn entry_info_wire_form() {
        let json = out(&sample_entry());
        assert_eq!(
            json,
            json!({
                "name": "hello.txt",
                "type": "FILE_TYPE_FILE",
                "path": "/home/user/hello.txt",
                "size": "11",
                "mode": 420,
                "permissions": "-rw-r--r--",
                "owner": "user",
                "group": "user",
                "modifiedTime": "2026-11-30T12:00:00.123456789Z",
                "metadata": {"k": "v"}
            })
        );
        assert_eq!(parse::<EntryInfo>(json).unwrap(), sample_entry());
        assert_eq!(out(&EntryInfo::default()), json!({}));
        let link = EntryInfo {
            file_type: FileType::Symlink,
            symlink_target: Some("/etc/hosts".into()),
            is_symlink: true,
            ..EntryInfo::default()
        };
        assert_eq!(
            out(&link),
            json!({"type":"FILE_TYPE_SYMLINK","symlinkTarget":"/etc/hosts","isSymlink":true})
        );
    }

    #[test]
    fn entry_info_accepts_snake_case_numbers_and_strings() {
        let e: EntryInfo = parse(json!({
            "name": "a", "type": 2, "size": 4096, "mode": "493",
            "modified_time": "2026-11-30T12:00:00Z", "symlink_target": "b",
            "is_symlink": true, "metadata": null, "unknownField": 1
        }))
        .unwrap();
        assert_eq!(e.file_type, FileType::Directory);
        assert_eq!(e.size, 4096);
        assert_eq!(e.mode, 0o755);
        assert_eq!(e.modified_time, Timestamp::new(1_796_040_000, 0));
        assert_eq!(e.symlink_target.as_deref(), Some("b"));
        assert!(e.is_symlink);
        let e: EntryInfo = parse(json!({"size": "9223372036854775807"})).unwrap();
        assert_eq!(e.size, i64::MAX);
        assert!(parse::<EntryInfo>(json!({"size": "9223372036854775808"})).is_err());
        assert!(parse::<EntryInfo>(json!({"type": "FILE_TYPE_PIPE"})).is_err());
        assert!(parse::<EntryInfo>(json!({"modifiedTime": "soon"})).is_err());
    }

    #[test]
    fn requests() {
        let r: ListDirRequest = parse(json!({"path":"/tmp","depth":"2"})).unwrap();
        assert_eq!(
            r,
            ListDirRequest {
                path: "/tmp".into(),
                depth: 2
            }
        );
        let r: MoveRequest = parse(json!({"source":"a","destination":"b"})).unwrap();
        assert_eq!((r.source.as_str(), r.destination.as_str()), ("a", "b"));
        let r: WatchDirRequest = parse(
            json!({"path":"/w","recursive":true,"include_entry":true,"allowNetworkMounts":true}),
        )
        .unwrap();
        assert!(r.recursive && r.include_entry && r.allow_network_mounts);
        assert_eq!(
            out(&r),
            json!({"path":"/w","recursive":true,"includeEntry":true,"allowNetworkMounts":true})
        );
        let w: WatcherId = parse(json!({"watcher_id":"w1"})).unwrap();
        assert_eq!(out(&w), json!({"watcherId":"w1"}));
        let p: StatRequest = parse(json!({"path": null})).unwrap();
        assert_eq!(p.path, "");
        assert!(parse::<RemoveRequest>(json!({"path": 1})).is_err());
        assert_eq!(
            out(&MakeDirRequest { path: "/d".into() }),
            json!({"path":"/d"})
        );
    }

    #[test]
    fn watch_responses() {
        assert_eq!(out(&WatchDirResponse::Start), json!({"start":{}}));
        assert_eq!(out(&WatchDirResponse::Keepalive), json!({"keepalive":{}}));
        let ev = WatchDirResponse::Filesystem(FilesystemEvent {
            name: "a/b.txt".into(),
            event_type: EventType::Write,
            entry: None,
        });
        assert_eq!(
            out(&ev),
            json!({"filesystem":{"name":"a/b.txt","type":"EVENT_TYPE_WRITE"}})
        );
        assert_eq!(parse::<WatchDirResponse>(out(&ev)).unwrap(), ev);
        assert!(parse::<WatchDirResponse>(json!({})).is_err());
        let events = GetWatcherEventsResponse {
            events: vec![FilesystemEvent {
                name: "x".into(),
                event_type: EventType::Create,
                entry: Some(EntryInfo {
                    name: "x".into(),
                    ..EntryInfo::default()
                }),
            }],
        };
        assert_eq!(
            out(&events),
            json!({"events":[{"name":"x","type":"EVENT_TYPE_CREATE","entry":{"name":"x"}}]})
        );
        assert_eq!(
            out(&EntryResponse::from(EntryInfo::default())),
            json!({"entry":{}})
        );
    }
}
