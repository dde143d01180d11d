//! Jupyter messages on top of ZMTP multipart messages: layout, HMAC-SHA256 signing, headers, and
//! typed contents for what a code interpreter needs.
//!
//! A message on the wire is
//! `[identities..., "<IDS|MSG>", hmac_hex, header, parent_header, metadata, content, buffers...]`,
//! where the signature is HMAC-SHA256 over the four JSON parts, keyed with the connection file's
//! `key` (its UTF-8 bytes, not hex-decoded: that is what jupyter_client does).
//!
//! Spec: <https://jupyter-client.readthedocs.io/en/stable/messaging.html> (protocol 5.3).

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::Sha256;

/// Separates routing identities from the message proper.
pub const DELIMITER: &[u8] = b"<IDS|MSG>";
/// The messaging protocol version this client speaks.
pub const PROTOCOL_VERSION: &str = "5.3";

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("no <IDS|MSG> delimiter in the message")]
    NoDelimiter,
    #[error("message has {0} parts after the delimiter; at least 5 are needed")]
    MissingParts(usize),
    #[error("bad message signature")]
    BadSignature,
    #[error("invalid JSON in the {part}: {error}")]
    Json {
        part: &'static str,
        error: serde_json::Error,
    },
    #[error("{msg_type} content does not match the protocol: {error}")]
    Content {
        msg_type: String,
        error: serde_json::Error,
    },
    #[error("expected a {expected} message, got {got}")]
    UnexpectedType { expected: &'static str, got: String },
    #[error("cannot get random bytes for a session id: {0}")]
    Random(String),
}

/// Signs and verifies messages with the connection's key.
#[derive(Clone)]
pub struct Signer {
    /// `None` for an empty key: the protocol then means "not signed" (jupyter_client sends an
    /// empty signature and checks nothing). husk always generates a key.
    mac: Option<Hmac<Sha256>>,
}

impl std::fmt::Debug for Signer {
    // The key is a secret: never print it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("signed", &self.mac.is_some())
            .finish()
    }
}

impl Signer {
    pub fn new(key: &[u8]) -> Self {
        let mac = (!key.is_empty())
            .then(|| Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length"));
        Signer { mac }
    }

    fn mac(&self, parts: &[&[u8]; 4]) -> Option<Hmac<Sha256>> {
        let mut mac = self.mac.clone()?;
        for part in parts {
            mac.update(part);
        }
        Some(mac)
    }

    /// The hex signature of header, parent header, metadata and content (empty when unsigned).
    pub fn sign(&self, parts: &[&[u8]; 4]) -> String {
        self.mac(parts)
            .map(|mac| hex::encode(mac.finalize().into_bytes()))
            .unwrap_or_default()
    }

    /// Checks a received signature in constant time (as far as the key and the expected MAC are
    /// concerned; the hex decoding of the peer's own bytes leaks nothing secret).
    pub fn verify(&self, signature: &[u8], parts: &[&[u8]; 4]) -> Result<(), WireError> {
        let Some(mac) = self.mac(parts) else {
            return Ok(());
        };
        let mut tag = [0u8; 32];
        hex::decode_to_slice(signature, &mut tag).map_err(|_| WireError::BadSignature)?;
        mac.verify_slice(&tag).map_err(|_| WireError::BadSignature)
    }
}

/// A message header (also used, from the request, as a reply's parent header).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    pub msg_id: String,
    #[serde(default)]
    pub session: String,
    #[serde(default)]
    pub username: String,
    /// ISO 8601, UTC.
    #[serde(default)]
    pub date: String,
    pub msg_type: String,
    #[serde(default)]
    pub version: String,
}

/// One Jupyter message.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// ZeroMQ routing prefix: empty on shell/control replies to a DEALER; the topic on iopub
    /// (e.g. `kernel.<id>.status`).
    pub identities: Vec<Vec<u8>>,
    pub header: Header,
    /// `None` when the wire has `{}` (messages not caused by a request).
    pub parent_header: Option<Header>,
    pub metadata: Map<String, Value>,
    pub content: Value,
    pub buffers: Vec<Vec<u8>>,
}

impl Message {
    pub fn msg_type(&self) -> &str {
        &self.header.msg_type
    }

    /// The msg_id of the request this message answers, if any.
    pub fn parent_msg_id(&self) -> Option<&str> {
        self.parent_header.as_ref().map(|h| h.msg_id.as_str())
    }

    /// The multipart form, signed.
    pub fn encode(&self, signer: &Signer) -> Vec<Vec<u8>> {
        let header = json_bytes(&self.header);
        let parent = match &self.parent_header {
            Some(h) => json_bytes(h),
            None => b"{}".to_vec(),
        };
        let metadata = json_bytes(&self.metadata);
        let content = json_bytes(&self.content);
        let signature = signer.sign(&[&header, &parent, &metadata, &content]);
        let mut frames = Vec::with_capacity(self.identities.len() + 6 + self.buffers.len());
        frames.extend(self.identities.iter().cloned());
        frames.push(DELIMITER.to_vec());
        frames.push(signature.into_bytes());
        frames.extend([header, parent, metadata, content]);
        frames.extend(self.buffers.iter().cloned());
        frames
    }

    /// Parses and verifies a received multipart message. The signature is checked before any
    /// JSON is parsed, so unauthenticated input never reaches the JSON parser.
    pub fn decode(mut frames: Vec<Vec<u8>>, signer: &Signer) -> Result<Self, WireError> {
        let at = frames
            .iter()
            .position(|f| f == DELIMITER)
            .ok_or(WireError::NoDelimiter)?;
        let after = frames.len() - at - 1;
        if after < 5 {
            return Err(WireError::MissingParts(after));
        }
        let buffers = frames.split_off(at + 6);
        let mut rest = frames.split_off(at);
        let identities = frames;
        let content = rest.pop().expect("length checked");
        let metadata = rest.pop().expect("length checked");
        let parent = rest.pop().expect("length checked");
        let header = rest.pop().expect("length checked");
        let signature = rest.pop().expect("length checked");
        signer.verify(&signature, &[&header, &parent, &metadata, &content])?;

        let json = |part: &'static str, bytes: &[u8]| {
            serde_json::from_slice::<Value>(bytes).map_err(|error| WireError::Json { part, error })
        };
        let header: Header = serde_json::from_slice(&header).map_err(|error| WireError::Json {
            part: "header",
            error,
        })?;
        let parent_header = match json("parent header", &parent)? {
            Value::Object(m) if m.is_empty() => None,
            v => Some(Header::deserialize(v).map_err(|error| WireError::Json {
                part: "parent header",
                error,
            })?),
        };
        let metadata = match json("metadata", &metadata)? {
            Value::Object(m) => m,
            _ => {
                return Err(WireError::Json {
                    part: "metadata",
                    error: serde::de::Error::custom("not an object"),
                })
            }
        };
        let content = json("content", &content)?;
        Ok(Message {
            identities,
            header,
            parent_header,
            metadata,
            content,
            buffers,
        })
    }

    /// The content as `T`, for message types this module has no enum for.
    pub fn content_as<'a, T: Deserialize<'a>>(&'a self) -> Result<T, WireError> {
        T::deserialize(&self.content).map_err(|error| WireError::Content {
            msg_type: self.header.msg_type.clone(),
            error,
        })
    }
}

fn json_bytes<T: Serialize>(value: &T) -> Vec<u8> {
    // Plain structs, maps and Values with string keys cannot fail to serialize.
    serde_json::to_vec(value).expect("JSON serialization of a message part")
}

/// A client session: the id and username in every header, message ids, and the key.
#[derive(Debug, Clone)]
pub struct Session {
    id: String,
    username: String,
    signer: Signer,
    counter: u64,
}

impl Session {
    /// A session with a fresh random id.
    pub fn new(key: &[u8], username: &str) -> Result<Self, WireError> {
        Ok(Self::with_id(key, username, &random_id()?))
    }

    /// A session with a given id (tests, or resuming one).
    pub fn with_id(key: &[u8], username: &str, id: &str) -> Self {
        Session {
            id: id.to_owned(),
            username: username.to_owned(),
            signer: Signer::new(key),
            counter: 0,
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn signer(&self) -> &Signer {
        &self.signer
    }

    /// A new message of this session. Message ids are the session id plus a counter, as
    /// jupyter_client makes them: unique without a random draw per message.
    pub fn message(&mut self, msg_type: &str, content: Value) -> Message {
        self.counter += 1;
        Message {
            identities: Vec::new(),
            header: Header {
                msg_id: format!("{}_{}", self.id, self.counter),
                session: self.id.clone(),
                username: self.username.clone(),
                date: iso8601_now(),
                msg_type: msg_type.to_owned(),
                version: PROTOCOL_VERSION.to_owned(),
            },
            parent_header: None,
            metadata: Map::new(),
            content,
            buffers: Vec::new(),
        }
    }

    /// `execute_request` on the shell channel, with the defaults a code interpreter wants.
    pub fn execute_request(&mut self, code: &str) -> Message {
        self.execute(&ExecuteRequest::new(code))
    }

    pub fn execute(&mut self, request: &ExecuteRequest) -> Message {
        let content = serde_json::to_value(request).expect("ExecuteRequest serializes");
        self.message("execute_request", content)
    }

    /// `kernel_info_request` on the shell channel (also the usual "is it up yet" probe).
    pub fn kernel_info_request(&mut self) -> Message {
        self.message("kernel_info_request", Value::Object(Map::new()))
    }

    /// `interrupt_request`: for the control channel.
    pub fn interrupt_request(&mut self) -> Message {
        self.message("interrupt_request", Value::Object(Map::new()))
    }

    /// `shutdown_request`: for the control channel.
    pub fn shutdown_request(&mut self, restart: bool) -> Message {
        self.message(
            "shutdown_request",
            serde_json::json!({ "restart": restart }),
        )
    }

    /// The signed multipart form of `message`.
    pub fn encode(&self, message: &Message) -> Vec<Vec<u8>> {
        message.encode(&self.signer)
    }

    /// Verifies and parses a received multipart message.
    pub fn decode(&self, frames: Vec<Vec<u8>>) -> Result<Message, WireError> {
        Message::decode(frames, &self.signer)
    }
}

/// A random id in the UUID v4 text form.
pub fn random_id() -> Result<String, WireError> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|e| WireError::Random(e.to_string()))?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    ))
}

/// Now, as `YYYY-MM-DDTHH:MM:SS.ffffffZ`.
pub fn iso8601_now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    iso8601(now.as_secs(), now.subsec_micros())
}

/// Formats seconds since the epoch (UTC) plus microseconds.
pub fn iso8601(secs: u64, micros: u32) -> String {
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{micros:06}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day): Howard Hinnant's algorithm, so no date crate
/// is needed for one timestamp per message.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// The content of an `execute_request`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecuteRequest {
    pub code: String,
    pub silent: bool,
    pub store_history: bool,
    pub user_expressions: Map<String, Value>,
    /// Off: the agent does not serve the stdin channel, and a kernel waiting for input would
    /// hang the execution.
    pub allow_stdin: bool,
    pub stop_on_error: bool,
}

impl ExecuteRequest {
    pub fn new(code: &str) -> Self {
        ExecuteRequest {
            code: code.to_owned(),
            silent: false,
            store_history: true,
            user_expressions: Map::new(),
            allow_stdin: false,
            stop_on_error: true,
        }
    }
}

/// `execution_state` of a `status` message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecutionState {
    Busy,
    Idle,
    Starting,
    /// Sent by some kernels (and jupyter_server) but not in the spec's list; kept rather than
    /// rejected so an unusual kernel does not break the stream.
    #[serde(other)]
    Other,
}

/// A MIME bundle: MIME type to data (a string, or JSON for `application/json` and the like).
pub type MimeBundle = Map<String, Value>;

/// The content of an `error` message and of an error `execute_reply`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorContent {
    pub ename: String,
    pub evalue: String,
    #[serde(default)]
    pub traceback: Vec<String>,
}

/// What arrives on the iopub channel, typed.
#[derive(Debug, Clone, PartialEq)]
pub enum Iopub {
    Status(ExecutionState),
    ExecuteInput {
        code: String,
        execution_count: u64,
    },
    Stream {
        /// `stdout` or `stderr`.
        name: String,
        text: String,
    },
    ExecuteResult {
        execution_count: u64,
        data: MimeBundle,
        metadata: Map<String, Value>,
    },
    DisplayData {
        data: MimeBundle,
        metadata: Map<String, Value>,
        transient: Map<String, Value>,
    },
    UpdateDisplayData {
        data: MimeBundle,
        metadata: Map<String, Value>,
        transient: Map<String, Value>,
    },
    Error(ErrorContent),
    ClearOutput {
        wait: bool,
    },
    /// Any other type (comm messages, `iopub_welcome`, debug events...): see the message.
    Other,
}

impl Iopub {
    pub fn parse(msg: &Message) -> Result<Self, WireError> {
        #[derive(Deserialize)]
        struct Status {
            execution_state: ExecutionState,
        }
        #[derive(Deserialize)]
        struct Input {
            code: String,
            execution_count: u64,
        }
        #[derive(Deserialize)]
        struct Stream {
            name: String,
            text: String,
        }
        #[derive(Deserialize)]
        struct Result {
            execution_count: u64,
            data: MimeBundle,
            #[serde(default)]
            metadata: Map<String, Value>,
        }
        #[derive(Deserialize)]
        struct Display {
            data: MimeBundle,
            #[serde(default)]
            metadata: Map<String, Value>,
            #[serde(default)]
            transient: Map<String, Value>,
        }
        #[derive(Deserialize)]
        struct Clear {
            #[serde(default)]
            wait: bool,
        }
        Ok(match msg.msg_type() {
            "status" => Iopub::Status(msg.content_as::<Status>()?.execution_state),
            "execute_input" => {
                let c: Input = msg.content_as()?;
                Iopub::ExecuteInput {
                    code: c.code,
                    execution_count: c.execution_count,
                }
            }
            "stream" => {
                let c: Stream = msg.content_as()?;
                Iopub::Stream {
                    name: c.name,
                    text: c.text,
                }
            }
            "execute_result" => {
                let c: Result = msg.content_as()?;
                Iopub::ExecuteResult {
                    execution_count: c.execution_count,
                    data: c.data,
                    metadata: c.metadata,
                }
            }
            t @ ("display_data" | "update_display_data") => {
                let c: Display = msg.content_as()?;
                let (data, metadata, transient) = (c.data, c.metadata, c.transient);
                if t == "display_data" {
                    Iopub::DisplayData {
                        data,
                        metadata,
                        transient,
                    }
                } else {
                    Iopub::UpdateDisplayData {
                        data,
                        metadata,
                        transient,
                    }
                }
            }
            "error" => Iopub::Error(msg.content_as()?),
            "clear_output" => Iopub::ClearOutput {
                wait: msg.content_as::<Clear>()?.wait,
            },
            _ => Iopub::Other,
        })
    }
}

/// The content of an `execute_reply`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecuteReply {
    Ok {
        execution_count: u64,
    },
    Error {
        /// Absent in some kernels' error replies.
        execution_count: Option<u64>,
        error: ErrorContent,
    },
    /// Not run because an earlier request failed with `stop_on_error`.
    Aborted,
}

impl ExecuteReply {
    pub fn parse(msg: &Message) -> Result<Self, WireError> {
        if msg.msg_type() != "execute_reply" {
            return Err(WireError::UnexpectedType {
                expected: "execute_reply",
                got: msg.msg_type().to_owned(),
            });
        }
        #[derive(Deserialize)]
        struct Reply {
            status: String,
            execution_count: Option<u64>,
        }
        let reply: Reply = msg.content_as()?;
        Ok(match reply.status.as_str() {
            "ok" => ExecuteReply::Ok {
                execution_count: reply.execution_count.ok_or_else(|| WireError::Content {
                    msg_type: "execute_reply".into(),
                    error: serde::de::Error::missing_field("execution_count"),
                })?,
            },
            "aborted" => ExecuteReply::Aborted,
            // "error", and the long-deprecated "abort", treated as an error.
            _ => ExecuteReply::Error {
                execution_count: reply.execution_count,
                error: msg.content_as()?,
            },
        })
    }
}

/// The content of a `kernel_info_reply` (the fields the agent reports).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct KernelInfoReply {
    #[serde(default)]
    pub status: String,
    pub protocol_version: String,
    #[serde(default)]
    pub implementation: String,
    #[serde(default)]
    pub implementation_version: String,
    pub language_info: LanguageInfo,
    #[serde(default)]
    pub banner: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct LanguageInfo {
    pub name: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub mimetype: String,
    #[serde(default)]
    pub file_extension: String,
}

impl KernelInfoReply {
    pub fn parse(msg: &Message) -> Result<Self, WireError> {
        if msg.msg_type() != "kernel_info_reply" {
            return Err(WireError::UnexpectedType {
                expected: "kernel_info_reply",
                got: msg.msg_type().to_owned(),
            });
        }
        msg.content_as()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const KEY: &[u8] = b"a0436f6c-1916-498b-8eb9-e81ab9368e84";

    /// A message as the kernel would send it: a reply to `parent`, with an iopub topic.
    fn kernel_message(parent: &Message, msg_type: &str, content: Value) -> Message {
        let mut kernel = Session::with_id(KEY, "kernel", "kernel-session");
        let mut msg = kernel.message(msg_type, content);
        msg.identities = vec![format!("kernel.x.{msg_type}").into_bytes()];
        msg.parent_header = Some(parent.header.clone());
        msg
    }

    #[test]
    fn round_trip_with_identities_and_buffers() {
        let mut session = Session::new(KEY, "husk").unwrap();
        let mut msg = session.execute_request("1+1");
        msg.identities = vec![b"a".to_vec(), b"b".to_vec()];
        msg.buffers = vec![vec![0, 1, 2], Vec::new()];
        msg.metadata.insert("k".into(), json!(1));
        let frames = session.encode(&msg);
        assert_eq!(frames.len(), 2 + 6 + 2);
        assert_eq!(frames[2], DELIMITER);
        assert_eq!(frames[3].len(), 64);
        assert_eq!(session.decode(frames).unwrap(), msg);
    }

    #[test]
    fn execute_request_has_the_interpreter_defaults() {
        let mut session = Session::with_id(KEY, "husk", "s");
        let msg = session.execute_request("x = 1");
        assert_eq!(
            msg.content,
            json!({
                "code": "x = 1", "silent": false, "store_history": true,
                "user_expressions": {}, "allow_stdin": false, "stop_on_error": true,
            })
        );
        assert_eq!(msg.header.msg_type, "execute_request");
        assert_eq!(msg.header.version, "5.3");
        assert_eq!(msg.header.session, "s");
        assert_eq!(msg.header.msg_id, "s_1");
        assert_eq!(session.kernel_info_request().header.msg_id, "s_2");
        assert_eq!(
            session.shutdown_request(true).content,
            json!({"restart": true})
        );
        assert_eq!(
            session.interrupt_request().header.msg_type,
            "interrupt_request"
        );
        // The wire form of an empty parent header is {}.
        assert_eq!(session.encode(&msg)[4], b"{}");
    }

    #[test]
    fn signature_matches_jupyter_client() {
        // Computed with Python: hmac.new(b"key", b"{}{}{}{}", hashlib.sha256).hexdigest()
        let signer = Signer::new(b"key");
        assert_eq!(
            signer.sign(&[b"{}", b"{}", b"{}", b"{}"]),
            "ca767b02c5bc061ed184a9a029e7f93a7f2f7ed4e8fe74120fc1212f0b008fa3"
        );
    }

    #[test]
    fn bad_signatures_are_rejected() {
        let mut session = Session::new(KEY, "husk").unwrap();
        let request = session.kernel_info_request();
        let frames = session.encode(&request);
        let at = 1; // signature frame (no identities)

        let mut flipped = frames.clone();
        flipped[at][0] = if flipped[at][0] == b'0' { b'1' } else { b'0' };
        assert!(matches!(
            session.decode(flipped),
            Err(WireError::BadSignature)
        ));

        let mut upper = frames.clone();
        upper[at] = upper[at].to_ascii_uppercase();
        // Hex decoding accepts either case; only the bytes count. Either way not a forgery.
        let _ = session.decode(upper);

        for bad in [&b""[..], b"zz", &frames[at][..63], &[b'0'; 66]] {
            let mut f = frames.clone();
            f[at] = bad.to_vec();
            assert!(
                matches!(session.decode(f), Err(WireError::BadSignature)),
                "{bad:?}"
            );
        }
        // Any change to a signed part breaks it.
        for part in 2..6 {
            let mut f = frames.clone();
            f[part].push(b' ');
            assert!(
                matches!(session.decode(f), Err(WireError::BadSignature)),
                "part {part}"
            );
        }
        // Another key.
        let other = Session::new(b"other", "husk").unwrap();
        assert!(matches!(
            other.decode(frames.clone()),
            Err(WireError::BadSignature)
        ));
        // Buffers and identities are not signed (as in the protocol).
        let mut f = frames;
        f.insert(0, b"topic".to_vec());
        f.push(b"buffer".to_vec());
        assert!(session.decode(f).is_ok());
    }

    #[test]
    fn malformed_layouts_are_rejected() {
        let mut session = Session::new(KEY, "husk").unwrap();
        let request = session.kernel_info_request();
        let frames = session.encode(&request);
        assert!(matches!(
            session.decode(vec![]),
            Err(WireError::NoDelimiter)
        ));
        assert!(matches!(
            session.decode(frames[1..].to_vec()),
            Err(WireError::NoDelimiter)
        ));
        for n in 0..frames.len() {
            assert!(
                matches!(
                    session.decode(frames[..n].to_vec()),
                    Err(WireError::NoDelimiter | WireError::MissingParts(_))
                ),
                "truncated to {n}"
            );
        }
        // Validly signed but not JSON, or the wrong JSON shapes.
        let signer = session.signer().clone();
        let signed = |header: &[u8], parent: &[u8], metadata: &[u8], content: &[u8]| {
            let sig = signer.sign(&[header, parent, metadata, content]);
            vec![
                DELIMITER.to_vec(),
                sig.into_bytes(),
                header.to_vec(),
                parent.to_vec(),
                metadata.to_vec(),
                content.to_vec(),
            ]
        };
        let header = br#"{"msg_id":"1","msg_type":"status"}"#;
        assert!(session.decode(signed(header, b"{}", b"{}", b"{}")).is_ok());
        for (frames, part) in [
            (signed(b"{", b"{}", b"{}", b"{}"), "header"),
            (signed(b"{}", b"{}", b"{}", b"{}"), "header"),
            (signed(header, b"[]", b"{}", b"{}"), "parent header"),
            (signed(header, b"{}", b"[]", b"{}"), "metadata"),
            (signed(header, b"{}", b"{}", b"\xff"), "content"),
        ] {
            match session.decode(frames) {
                Err(WireError::Json { part: p, .. }) => assert_eq!(p, part),
                other => panic!("{part}: {other:?}"),
            }
        }
    }

    #[test]
    fn iopub_contents_parse() {
        let mut session = Session::new(KEY, "husk").unwrap();
        let req = session.execute_request("print('hi')");
        let cases = [
            (
                "status",
                json!({"execution_state": "busy"}),
                Iopub::Status(ExecutionState::Busy),
            ),
            (
                "status",
                json!({"execution_state": "weird"}),
                Iopub::Status(ExecutionState::Other),
            ),
            (
                "execute_input",
                json!({"code": "c", "execution_count": 3}),
                Iopub::ExecuteInput {
                    code: "c".into(),
                    execution_count: 3,
                },
            ),
            (
                "stream",
                json!({"name": "stdout", "text": "hi\n"}),
                Iopub::Stream {
                    name: "stdout".into(),
                    text: "hi\n".into(),
                },
            ),
            (
                "execute_result",
                json!({"execution_count": 3, "data": {"text/plain": "2"}, "metadata": {}}),
                Iopub::ExecuteResult {
                    execution_count: 3,
                    data: json!({"text/plain": "2"}).as_object().unwrap().clone(),
                    metadata: Map::new(),
                },
            ),
            (
                "display_data",
                json!({"data": {"image/png": "iVBO"}, "metadata": {"image/png": {"width": 1}},
                       "transient": {"display_id": "d"}}),
                Iopub::DisplayData {
                    data: json!({"image/png": "iVBO"}).as_object().unwrap().clone(),
                    metadata: json!({"image/png": {"width": 1}})
                        .as_object()
                        .unwrap()
                        .clone(),
                    transient: json!({"display_id": "d"}).as_object().unwrap().clone(),
                },
            ),
            (
                "error",
                json!({"ename": "E", "evalue": "v", "traceback": ["t"]}),
                Iopub::Error(ErrorContent {
                    ename: "E".into(),
                    evalue: "v".into(),
                    traceback: vec!["t".into()],
                }),
            ),
            (
                "clear_output",
                json!({"wait": true}),
                Iopub::ClearOutput { wait: true },
            ),
            ("comm_msg", json!({"anything": 1}), Iopub::Other),
        ];
        for (msg_type, content, expected) in cases {
            let msg = kernel_message(&req, msg_type, content);
            let frames = Session::with_id(KEY, "kernel", "k").encode(&msg);
            let got = session.decode(frames).unwrap();
            assert_eq!(got.parent_msg_id(), Some(req.header.msg_id.as_str()));
            assert_eq!(Iopub::parse(&got).unwrap(), expected, "{msg_type}");
        }
        let bad = kernel_message(&req, "stream", json!({"name": "stdout"}));
        assert!(matches!(Iopub::parse(&bad), Err(WireError::Content { .. })));
        let bad = kernel_message(
            &req,
            "execute_input",
            json!({"code": "c", "execution_count": -1}),
        );
        assert!(matches!(Iopub::parse(&bad), Err(WireError::Content { .. })));
    }

    #[test]
    fn execute_replies_parse() {
        let mut session = Session::new(KEY, "husk").unwrap();
        let req = session.execute_request("1/0");
        let reply = |content| ExecuteReply::parse(&kernel_message(&req, "execute_reply", content));
        assert_eq!(
            reply(json!({"status": "ok", "execution_count": 1, "user_expressions": {}})).unwrap(),
            ExecuteReply::Ok { execution_count: 1 }
        );
        assert_eq!(
            reply(
                json!({"status": "error", "execution_count": 2, "ename": "ZeroDivisionError",
                         "evalue": "division by zero", "traceback": ["a", "b"]})
            )
            .unwrap(),
            ExecuteReply::Error {
                execution_count: Some(2),
                error: ErrorContent {
                    ename: "ZeroDivisionError".into(),
                    evalue: "division by zero".into(),
                    traceback: vec!["a".into(), "b".into()],
                },
            }
        );
        assert_eq!(
            reply(json!({"status": "aborted"})).unwrap(),
            ExecuteReply::Aborted
        );
        assert!(reply(json!({"status": "ok"})).is_err());
        assert!(reply(json!({"status": "error"})).is_err());
        let status = kernel_message(&req, "status", json!({"execution_state": "idle"}));
        assert!(matches!(
            ExecuteReply::parse(&status),
            Err(WireError::UnexpectedType { .. })
        ));
    }

    #[test]
    fn dates_are_iso8601_utc() {
        assert_eq!(iso8601(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(iso8601(951_782_400, 5), "2000-02-29T00:00:00.000005Z");
        assert_eq!(
            iso8601(1_735_689_599, 999_999),
            "2024-12-31T23:59:59.999999Z"
        );
        let now = iso8601_now();
        assert_eq!(now.len(), 27, "{now}");
    }

    #[test]
    fn random_ids_are_uuid_shaped_and_differ() {
        let a = random_id().unwrap();
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert_ne!(a, random_id().unwrap());
    }

    #[test]
    fn signer_debug_hides_the_key() {
        assert!(!format!("{:?}", Signer::new(b"secret")).contains("secret"));
    }
}
