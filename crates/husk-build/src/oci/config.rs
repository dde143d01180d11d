//! The part of an OCI image config a template keeps (`config.Env`, `User`, ...), read from a
//! pulled image and written into an exported one.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// What the image says its processes should run with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageConfig {
    /// `Env`, each entry split at its first `=` (an entry without one gets an empty value).
    pub env: Vec<(String, String)>,
    pub user: Option<String>,
    pub workdir: Option<String>,
    pub cmd: Vec<String>,
    pub entrypoint: Vec<String>,
    pub labels: BTreeMap<String, String>,
}

/// The OCI / Docker spelling; every field may be missing or `null`.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    env: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    working_dir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cmd: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    entrypoint: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    labels: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize)]
struct RawImage {
    #[serde(default)]
    config: Option<RawConfig>,
}

impl ImageConfig {
    /// Reads the `config` section of an image config blob.
    pub(crate) fn from_json(json: &[u8]) -> Result<ImageConfig, serde_json::Error> {
        let raw: RawImage = serde_json::from_slice(json)?;
        let raw = raw.config.unwrap_or_default();
        let nonempty = |s: Option<String>| s.filter(|s| !s.is_empty());
        Ok(ImageConfig {
            env: raw
                .env
                .unwrap_or_default()
                .into_iter()
                .map(|e| match e.split_once('=') {
                    Some((k, v)) => (k.to_string(), v.to_string()),
                    None => (e, String::new()),
                })
                .collect(),
            user: nonempty(raw.user),
            workdir: nonempty(raw.working_dir),
            cmd: raw.cmd.unwrap_or_default(),
            entrypoint: raw.entrypoint.unwrap_or_default(),
            labels: raw.labels.unwrap_or_default(),
        })
    }

    /// The image config blob of a one-layer linux/amd64 image whose layer has `diff_id`.
    pub(crate) fn to_json(&self, diff_id: &str) -> Vec<u8> {
        let some_vec = |v: &Vec<String>| (!v.is_empty()).then(|| v.clone());
        let config = RawConfig {
            env: (!self.env.is_empty())
                .then(|| self.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            user: self.user.clone(),
            working_dir: self.workdir.clone(),
            cmd: some_vec(&self.cmd),
            entrypoint: some_vec(&self.entrypoint),
            labels: (!self.labels.is_empty()).then(|| self.labels.clone()),
        };
        let json = serde_json::json!({
            "created": rfc3339(created_secs()),
            "architecture": "amd64",
            "os": "linux",
            "config": config,
            "rootfs": { "type": "layers", "diff_ids": [diff_id] },
            "history": [{ "created_by": "husk template build" }],
        });
        serde_json::to_vec(&json).expect("a JSON value always serializes")
    }
}

/// `SOURCE_DATE_EPOCH` when set (reproducible builds), otherwise now.
fn created_secs() -> u64 {
    std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0)
        })
}

/// `secs` since the epoch as an RFC 3339 UTC timestamp.
fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil-from-days (Howard Hinnant's algorithm): the proleptic Gregorian date of `days`.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn parses_docker_config_with_nulls() {
        let json =
            br#"{"architecture":"amd64","config":{"Env":["PATH=/bin:/usr/bin","A=b=c","BARE"],
            "User":"","WorkingDir":"/app","Cmd":null,"Entrypoint":["/init"],"Labels":{"x":"y"}}}"#;
        let c = ImageConfig::from_json(json).unwrap();
        assert_eq!(
            c.env,
            [("PATH", "/bin:/usr/bin"), ("A", "b=c"), ("BARE", "")]
                .map(|(k, v)| (k.to_string(), v.to_string()))
        );
        assert_eq!(c.user, None);
        assert_eq!(c.workdir.as_deref(), Some("/app"));
        assert!(c.cmd.is_empty());
        assert_eq!(c.entrypoint, ["/init"]);
        assert_eq!(c.labels["x"], "y");
        assert_eq!(
            ImageConfig::from_json(b"{}").unwrap(),
            ImageConfig::default()
        );
    }

    #[test]
    fn round_trips() {
        let c = ImageConfig {
            env: vec![("K".into(), "V=1".into())],
            user: Some("1000:1000".into()),
            workdir: Some("/w".into()),
            cmd: vec!["sh".into()],
            entrypoint: vec![],
            labels: BTreeMap::from([("a".into(), "b".into())]),
        };
        let json = c.to_json("sha256:00");
        assert_eq!(ImageConfig::from_json(&json).unwrap(), c);
        let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(v["rootfs"]["diff_ids"][0], "sha256:00");
        assert_eq!(v["os"], "linux");
    }
}
