//! The connection file a kernel is started with (`python -m ipykernel_launcher -f FILE`): where its
//! five sockets listen and the key its messages are signed with.

use serde::{Deserialize, Serialize};
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The only signature scheme jupyter_client uses and this crate implements.
pub const SIGNATURE_SCHEME: &str = "hmac-sha256";

#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error("connection file I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("connection file JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("unsupported transport {0:?}; only tcp is supported")]
    Transport(String),
    #[error("unsupported signature scheme {0:?}; only hmac-sha256 is supported")]
    SignatureScheme(String),
    #[error("invalid ip {0:?}")]
    Ip(String),
    #[error("cannot get random bytes for a key: {0}")]
    Random(String),
}

/// A kernel's connection file, field for field.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectionInfo {
    pub transport: String,
    pub ip: String,
    pub shell_port: u16,
    pub iopub_port: u16,
    pub stdin_port: u16,
    pub control_port: u16,
    pub hb_port: u16,
    /// The HMAC key, used as its UTF-8 bytes.
    pub key: String,
    pub signature_scheme: String,
    #[serde(default)]
    pub kernel_name: String,
}

impl std::fmt::Debug for ConnectionInfo {
    // The key is a secret: never print it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionInfo")
            .field("transport", &self.transport)
            .field("ip", &self.ip)
            .field("shell_port", &self.shell_port)
            .field("iopub_port", &self.iopub_port)
            .field("stdin_port", &self.stdin_port)
            .field("control_port", &self.control_port)
            .field("hb_port", &self.hb_port)
            .field("signature_scheme", &self.signature_scheme)
            .field("kernel_name", &self.kernel_name)
            .finish_non_exhaustive()
    }
}

/// The kernel's sockets, by channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    Shell,
    Iopub,
    Stdin,
    Control,
    Heartbeat,
}

impl ConnectionInfo {
    /// A connection on 127.0.0.1 with five free ports and a fresh random key.
    ///
    /// The ports are free when picked, not reserved: all five listeners are held until the last
    /// is bound (so they differ), then closed for the kernel to bind. Another process could take
    /// one in between; the kernel then fails to start and the caller should retry with new ports.
    /// Inside a sandbox's own network namespace nothing else competes.
    pub fn localhost(kernel_name: &str) -> Result<Self, ConnectionError> {
        let ports = free_ports::<5>(Ipv4Addr::LOCALHOST)?;
        Ok(ConnectionInfo {
            transport: "tcp".into(),
            ip: Ipv4Addr::LOCALHOST.to_string(),
            shell_port: ports[0],
            iopub_port: ports[1],
            stdin_port: ports[2],
            control_port: ports[3],
            hb_port: ports[4],
            key: random_key()?,
            signature_scheme: SIGNATURE_SCHEME.into(),
            kernel_name: kernel_name.into(),
        })
    }

    /// Parses and validates a connection file's contents.
    pub fn from_json(json: &[u8]) -> Result<Self, ConnectionError> {
        let info: ConnectionInfo = serde_json::from_slice(json)?;
        info.validate()?;
        Ok(info)
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("ConnectionInfo serializes")
    }

    /// Writes the file readable by its owner only (it holds the key), failing if it exists
    /// rather than following or overwriting whatever is there.
    pub fn write_new(&self, path: &Path) -> Result<(), ConnectionError> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        file.write_all(&self.to_json())?;
        Ok(())
    }

    /// The checks a client needs before connecting anywhere.
    pub fn validate(&self) -> Result<(), ConnectionError> {
        if self.transport != "tcp" {
            return Err(ConnectionError::Transport(self.transport.clone()));
        }
        if self.signature_scheme != SIGNATURE_SCHEME {
            return Err(ConnectionError::SignatureScheme(
                self.signature_scheme.clone(),
            ));
        }
        self.ip
            .parse::<std::net::IpAddr>()
            .map_err(|_| ConnectionError::Ip(self.ip.clone()))?;
        Ok(())
    }

    pub fn port(&self, channel: Channel) -> u16 {
        match channel {
            Channel::Shell => self.shell_port,
            Channel::Iopub => self.iopub_port,
            Channel::Stdin => self.stdin_port,
            Channel::Control => self.control_port,
            Channel::Heartbeat => self.hb_port,
        }
    }

    /// Where to connect for `channel` (the ip is checked by [`Self::validate`]; an invalid one
    /// yields an error here too).
    pub fn addr(&self, channel: Channel) -> Result<SocketAddr, ConnectionError> {
        let ip = self
            .ip
            .parse()
            .map_err(|_| ConnectionError::Ip(self.ip.clone()))?;
        Ok(SocketAddr::new(ip, self.port(channel)))
    }
}

/// `N` distinct free TCP ports on `ip`.
pub fn free_ports<const N: usize>(ip: Ipv4Addr) -> Result<[u16; N], ConnectionError> {
    let listeners = (0..N)
        .map(|_| TcpListener::bind((ip, 0)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut ports = [0u16; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}

/// A random key: 32 bytes as 64 hex characters (jupyter_client uses a UUID; longer costs nothing).
pub fn random_key() -> Result<String, ConnectionError> {
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).map_err(|e| ConnectionError::Random(e.to_string()))?;
    Ok(hex::encode(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn localhost_picks_distinct_ports_and_a_key() {
        let info = ConnectionInfo::localhost("python3").unwrap();
        let mut ports = [
            info.shell_port,
            info.iopub_port,
            info.stdin_port,
            info.control_port,
            info.hb_port,
        ];
        ports.sort_unstable();
        assert!(ports.windows(2).all(|w| w[0] != w[1]), "{ports:?}");
        assert!(ports[0] > 0);
        assert_eq!(info.key.len(), 64);
        assert_ne!(info.key, ConnectionInfo::localhost("python3").unwrap().key);
        info.validate().unwrap();
        assert_eq!(
            info.addr(Channel::Control).unwrap(),
            SocketAddr::from(([127, 0, 0, 1], info.control_port))
        );
    }

    #[test]
    fn json_round_trip_and_jupyter_field_names() {
        let info = ConnectionInfo::localhost("python3").unwrap();
        let json: serde_json::Value = serde_json::from_slice(&info.to_json()).unwrap();
        for field in [
            "transport",
            "ip",
            "shell_port",
            "iopub_port",
            "stdin_port",
            "control_port",
            "hb_port",
            "key",
            "signature_scheme",
            "kernel_name",
        ] {
            assert!(json.get(field).is_some(), "{field}");
        }
        assert_eq!(ConnectionInfo::from_json(&info.to_json()).unwrap(), info);
    }

    #[test]
    fn unsupported_files_are_refused() {
        let mut info = ConnectionInfo::localhost("python3").unwrap();
        info.transport = "ipc".into();
        assert!(matches!(
            ConnectionInfo::from_json(&info.to_json()),
            Err(ConnectionError::Transport(_))
        ));
        info.transport = "tcp".into();
        info.signature_scheme = "hmac-md5".into();
        assert!(matches!(
            ConnectionInfo::from_json(&info.to_json()),
            Err(ConnectionError::SignatureScheme(_))
        ));
        info.signature_scheme = SIGNATURE_SCHEME.into();
        info.ip = "localhost".into();
        assert!(matches!(
            ConnectionInfo::from_json(&info.to_json()),
            Err(ConnectionError::Ip(_))
        ));
        assert!(matches!(
            ConnectionInfo::from_json(b"{\"transport\":\"tcp\"}"),
            Err(ConnectionError::Json(_))
        ));
    }

    #[test]
    fn debug_hides_the_key() {
        let info = ConnectionInfo::localhost("python3").unwrap();
        assert!(!format!("{info:?}").contains(&info.key));
    }

    #[test]
    fn write_new_is_private_and_never_overwrites() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("husk-jupyter-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("kernel.json");
        let _ = std::fs::remove_file(&path);
        let info = ConnectionInfo::localhost("python3").unwrap();
        info.write_new(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            ConnectionInfo::from_json(&std::fs::read(&path).unwrap()).unwrap(),
            info
        );
        assert!(info.write_new(&path).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
