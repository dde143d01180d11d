//! The protocol between `husk serve` and the agent (PID 1 of every server sandbox).
//!
//! One stream socket per sandbox carries length-prefixed frames: a 4-byte big-endian payload
//! length, then the payload, a [postcard] encoding of [`ToAgent`] or [`FromAgent`]. The server
//! opens with [`ToAgent::Hello`], the agent answers [`FromAgent::Hello`]; both carry
//! [`VERSION`], and a peer that sees a version it does not speak closes the connection.
//!
//! Calls are multiplexed: the server sends [`ToAgent::Call`] with an id of its choosing and the
//! agent answers each with exactly one [`FromAgent::Reply`] carrying the same id, in any order.
//! Process output and exits ([`FromAgent::Proc`]) and file-system watch events
//! ([`FromAgent::Watch`]) are unsolicited.
//!
//! Everything the agent sends comes from inside a sandbox and is hostile to the server: frames
//! are bounded by [`MAX_FRAME`] ([`read_frame`] refuses larger ones before allocating), every
//! decode is fallible, and the server validates what it decodes.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

pub mod kernel;
pub mod sudo;
pub mod types;

pub use kernel::{ExecEvent, Execute, KernelEvent, KernelSpec, KernelStart};
pub use types::*;

/// The protocol version both ends must speak.
pub const VERSION: u16 = 1;

/// Largest payload of one frame. Data-carrying messages stay below it by using [`CHUNK`].
pub const MAX_FRAME: usize = (1 << 20) + 4096;

/// Largest data chunk in one message (process output, file data).
pub const CHUNK: usize = 1 << 20;

/// Errors of encoding and decoding frames.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    /// The frame is larger than [`MAX_FRAME`].
    #[error("frame of {0} bytes exceeds the limit of {MAX_FRAME}")]
    TooLarge(usize),
    /// The payload is not a valid message.
    #[error("malformed frame: {0}")]
    Malformed(#[from] postcard::Error),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Server → agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToAgent {
    /// The first frame: the protocol version and how the sandbox is set up.
    Hello(Hello),
    /// A request; answered by one [`FromAgent::Reply`] with the same id.
    Call { id: u64, req: Request },
}

/// Agent → server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum FromAgent {
    /// The answer to [`ToAgent::Hello`].
    Hello { version: u16 },
    /// The result of the call with this id.
    Reply {
        id: u64,
        result: Result<Reply, AgentError>,
    },
    /// Output or exit of a process the agent started.
    Proc { pid: u32, event: ProcEvent },
    /// Events of a watch started with [`Request::WatchStart`].
    Watch { watch: u32, events: Vec<FsEvent> },
    /// Events of a kernel started with [`Request::KernelStart`].
    Kernel { kernel: u32, event: KernelEvent },
}

/// Encodes `msg` as one frame (length prefix included).
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, ProtoError> {
    let mut buf = postcard::to_extend(msg, vec![0u8; 4])?;
    let len = buf.len() - 4;
    if len > MAX_FRAME {
        return Err(ProtoError::TooLarge(len));
    }
    buf[..4].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(buf)
}

/// Decodes one frame's payload (without its length prefix).
pub fn decode<'a, T: Deserialize<'a>>(payload: &'a [u8]) -> Result<T, ProtoError> {
    Ok(postcard::from_bytes(payload)?)
}

/// Reads the length prefix in `header`; refuses frames over [`MAX_FRAME`].
pub fn frame_len(header: [u8; 4]) -> Result<usize, ProtoError> {
    let len = u32::from_be_bytes(header) as usize;
    if len > MAX_FRAME {
        return Err(ProtoError::TooLarge(len));
    }
    Ok(len)
}

/// Reads one frame from a blocking reader. `Ok(None)` at a clean end of stream.
pub fn read_frame(r: &mut impl Read) -> Result<Option<Vec<u8>>, ProtoError> {
    let mut header = [0u8; 4];
    match r.read_exact(&mut header) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = frame_len(header)?;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)?;
    Ok(Some(payload))
}

/// Writes one message as a frame to a blocking writer.
pub fn write_msg<T: Serialize>(w: &mut impl Write, msg: &T) -> Result<(), ProtoError> {
    w.write_all(&encode(msg)?)?;
    Ok(())
}

#[cfg(test)]
mod tests;
