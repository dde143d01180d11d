//! Reading and writing a sandbox's files through its agent: the one door for file transfers
//! (E2B's `/files`, and whatever else moves whole files).
//!
//! Data moves in chunks of up to `husk_proto::CHUNK`. A read runs ahead of its consumer by
//! at most [`READ_AHEAD`] chunks, with two reads under way at a time (the agent reads the next
//! chunk while the previous one travels); a write sends each chunk as it comes and awaits the
//! previous one's reply only then. The agent's handle is closed when the transfer ends, also
//! when its consumer goes away mid-transfer.

use std::collections::VecDeque;

use husk_proto::{Entry, Reply, Request, User, CHUNK};
use tokio::sync::mpsc;

use crate::agent::{AgentClient, CallError, PendingReply};
use crate::calls::SandboxPath;
use crate::manager::LiveSandbox;

/// Chunks a read holds ready ahead of its consumer.
pub const READ_AHEAD: usize = 2;

/// Closes an agent handle when dropped (a consumer that goes away mid-transfer included).
struct Handle {
    agent: AgentClient,
    handle: Option<u32>,
}

impl Handle {
    async fn close(mut self) -> Result<Reply, CallError> {
        match self.handle.take() {
            Some(handle) => self.agent.call(Request::Close { handle }).await,
            None => Ok(Reply::Done),
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            let agent = self.agent.clone();
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = agent.call(Request::Close { handle }).await;
                });
            }
        }
    }
}

/// A file opened for reading: what it is, and its bytes on demand.
pub struct FileRead {
    pub entry: Entry,
    handle: Handle,
}

impl FileRead {
    /// Its bytes in `[start, end)`, read ahead of the consumer by a task of its own. A file
    /// that shrank while being read ends early, never with a gap; an error ends the stream.
    pub fn bytes(self, start: u64, end: u64) -> mpsc::Receiver<Result<Vec<u8>, CallError>> {
        let (tx, rx) = mpsc::channel(READ_AHEAD);
        let FileRead { handle: guard, .. } = self;
        tokio::spawn(async move {
            let agent = guard.agent.clone();
            let mut requested = start;
            let mut pending = VecDeque::new();
            while let Some(handle) = guard.handle {
                while pending.len() < 2 && requested < end {
                    let len = (end - requested).min(CHUNK as u64) as u32;
                    let read = Request::Read {
                        handle,
                        offset: requested,
                        len,
                    };
                    match agent.submit(read).await {
                        Ok(reply) => pending.push_back((len, reply)),
                        Err(e) => {
                            let _ = tx.send(Err(e)).await;
                            break;
                        }
                    }
                    requested += u64::from(len);
                }
                let Some((len, reply)) = pending.pop_front() else {
                    break;
                };
                let (chunk, last) = match reply.await {
                    Ok(Reply::Data(d)) if !d.is_empty() => {
                        let short = d.len() < len as usize;
                        (Ok(d), short)
                    }
                    Ok(_) => break,
                    Err(e) => (Err(e), true),
                };
                if tx.send(chunk).await.is_err() || last {
                    break;
                }
            }
            let _ = guard.close().await;
        });
        rx
    }
}

/// A file being written: chunks go to the agent as they come.
pub struct FileWrite {
    handle: Handle,
    /// The reply to the last write, not yet awaited.
    in_flight: Option<PendingReply>,
}

impl FileWrite {
    /// Sends `data` (at most `husk_proto::CHUNK` bytes); the previous write's reply is
    /// awaited only now, so the agent writes one chunk while the next arrives.
    ///
    /// A failed write closes the file before it returns: what was written stops holding disk
    /// space the moment the caller learns of the failure (a client that removes the file next
    /// gets the space back at once, not whenever a background close runs).
    pub async fn write(&mut self, data: Vec<u8>) -> Result<(), CallError> {
        let Some(handle) = self.handle.handle else {
            return Err(CallError::Gone);
        };
        let sent = self
            .handle
            .agent
            .submit(Request::Write { handle, data })
            .await;
        let result = match sent {
            Ok(next) => {
                let settled = self.settle().await;
                self.in_flight = Some(next);
                settled
            }
            Err(e) => Err(e),
        };
        if result.is_err() {
            self.close_now().await;
        }
        result
    }

    /// Gives up the file: waits for the write under way and closes the handle, before
    /// returning (dropping a `FileWrite` closes it too, but in the background).
    pub async fn abort(mut self) {
        self.close_now().await;
    }

    async fn close_now(&mut self) {
        let _ = self.settle().await;
        if let Some(handle) = self.handle.handle.take() {
            let _ = self.handle.agent.call(Request::Close { handle }).await;
        }
    }

    async fn settle(&mut self) -> Result<(), CallError> {
        match self.in_flight.take() {
            Some(reply) => reply.await.map(|_| ()),
            None => Ok(()),
        }
    }

    /// Waits for the last write and closes the file: what it is now.
    pub async fn finish(mut self) -> Result<Entry, CallError> {
        self.settle().await?;
        let handle = self.handle;
        match handle.close().await? {
            Reply::Entry(entry) => Ok(entry),
            _ => Err(crate::calls::unexpected_reply()),
        }
    }
}

impl LiveSandbox {
    /// Opens `path` for reading as `user` (the agent resolves it inside the sandbox).
    pub async fn read_file(&self, path: &SandboxPath, user: User) -> Result<FileRead, CallError> {
        let req = Request::OpenRead {
            path: path.as_str().to_owned(),
            user,
        };
        match self.agent.call(req).await? {
            Reply::Opened { handle, entry } => Ok(FileRead {
                entry,
                handle: Handle {
                    agent: self.agent.clone(),
                    handle: Some(handle),
                },
            }),
            _ => Err(crate::calls::unexpected_reply()),
        }
    }

    /// Creates or truncates `path` for writing as `user`, with E2B's file `metadata`.
    pub async fn write_file(
        &self,
        path: &SandboxPath,
        user: User,
        metadata: Vec<(String, String)>,
    ) -> Result<FileWrite, CallError> {
        let req = Request::OpenWrite {
            path: path.as_str().to_owned(),
            user,
            metadata,
        };
        match self.agent.call(req).await? {
            Reply::Opened { handle, .. } => Ok(FileWrite {
                handle: Handle {
                    agent: self.agent.clone(),
                    handle: Some(handle),
                },
                in_flight: None,
            }),
            _ => Err(crate::calls::unexpected_reply()),
        }
    }
}

#[cfg(test)]
mod tests;
