//! The answer to a successful upload: one entry per written file,
//! `[{"path":..,"name":..,"type":"file","metadata"?:{..}}]` (envd's `EntryInfo` of its HTTP
//! API, which is not the Connect `EntryInfo`).

use std::collections::BTreeMap;

use husk_core::calls::Entry;
use serde::Serialize;

/// One written file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UploadedEntry {
    pub path: String,
    pub name: String,
    /// Always `"file"`: uploads only write regular files.
    #[serde(rename = "type")]
    pub entry_type: &'static str,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

impl From<Entry> for UploadedEntry {
    fn from(entry: Entry) -> Self {
        UploadedEntry {
            path: entry.path,
            name: entry.name,
            entry_type: "file",
            metadata: entry.metadata.into_iter().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use husk_core::calls::FileType;
    use serde_json::json;

    #[test]
    fn wire_form() {
        let mut entry = Entry {
            name: "a.txt".into(),
            path: "/home/user/a.txt".into(),
            file_type: FileType::File,
            size: 3,
            mode: 0o644,
            permissions: "-rw-r--r--".into(),
            owner: "user".into(),
            group: "user".into(),
            mtime_secs: 0,
            mtime_nanos: 0,
            symlink_target: None,
            metadata: vec![],
        };
        assert_eq!(
            serde_json::to_value(vec![UploadedEntry::from(entry.clone())]).unwrap(),
            json!([{"path":"/home/user/a.txt","name":"a.txt","type":"file"}])
        );
        entry.metadata = vec![("k".into(), "v".into())];
        assert_eq!(
            serde_json::to_value(UploadedEntry::from(entry)).unwrap()["metadata"],
            json!({"k":"v"})
        );
    }
}
