//! A build's progress as NDJSON lines for the response body (the event shapes are listed in
//! `husk-server`'s `templates/build.rs`).

use std::collections::VecDeque;
use std::sync::Mutex;

use bytes::Bytes;

use crate::oci::PullProgress;
use crate::{Progress, StepOutcome};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

/// Progress lines buffered for a slow client before build output is dropped.
const EVENT_BUFFER: usize = 1024;

/// The build's progress as NDJSON lines on a bounded channel to the response body.
///
/// `Progress` is called synchronously from inside the build, so it never waits for the client:
/// build output (`log`, `pull`) is dropped when the client falls [`EVENT_BUFFER`] lines behind
/// (a note says how much), while the few structural events (steps, messages) queue behind the
/// channel and are never lost. Once the client is gone everything is dropped.
pub struct Events {
    tx: mpsc::Sender<Bytes>,
    rx: Mutex<Option<mpsc::Receiver<Bytes>>>,
    backlog: Mutex<Backlog>,
}

#[derive(Default)]
struct Backlog {
    /// Structural events waiting for room, in order.
    queued: VecDeque<Bytes>,
    /// Bytes of output dropped since the last note.
    dropped: u64,
    /// The end of a UTF-8 sequence split between two `log` calls.
    partial: Vec<u8>,
}

fn line(v: &Value) -> Bytes {
    let mut b = serde_json::to_vec(v).unwrap_or_default();
    b.push(b'\n');
    Bytes::from(b)
}

fn dropped_note(n: u64) -> Bytes {
    line(&json!({
        "type": "log",
        "data": format!("\n[husk: {n} bytes of build output dropped: the client reads too slowly]\n"),
    }))
}

impl Default for Events {
    fn default() -> Self {
        Events::new()
    }
}

impl Events {
    pub fn new() -> Events {
        let (tx, rx) = mpsc::channel(EVENT_BUFFER);
        Events {
            tx,
            rx: Mutex::new(Some(rx)),
            backlog: Mutex::default(),
        }
    }

    pub fn take_receiver(&self) -> mpsc::Receiver<Bytes> {
        self.rx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .expect("the receiver is taken once")
    }

    fn backlog(&self) -> std::sync::MutexGuard<'_, Backlog> {
        self.backlog.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends what fits of the backlog; false if some of it still waits.
    fn flush(&self, b: &mut Backlog) -> bool {
        while let Some(front) = b.queued.pop_front() {
            match self.tx.try_send(front) {
                Ok(()) => {}
                Err(TrySendError::Full(front)) => {
                    b.queued.push_front(front);
                    return false;
                }
                Err(TrySendError::Closed(_)) => {
                    b.queued.clear();
                    return true;
                }
            }
        }
        if b.dropped > 0 {
            match self.tx.try_send(dropped_note(b.dropped)) {
                Ok(()) | Err(TrySendError::Closed(_)) => b.dropped = 0,
                Err(TrySendError::Full(_)) => return false,
            }
        }
        true
    }

    /// A structural event: never dropped while the client reads.
    fn must(&self, v: Value) {
        let mut b = self.backlog();
        if b.dropped > 0 {
            let note = dropped_note(std::mem::take(&mut b.dropped));
            b.queued.push_back(note);
        }
        b.queued.push_back(line(&v));
        self.flush(&mut b);
    }

    /// Build output: dropped (and counted) when the client is behind.
    fn may(&self, v: Value, size: u64) {
        let mut b = self.backlog();
        if !self.flush(&mut b) {
            b.dropped += size;
            return;
        }
        if let Err(TrySendError::Full(_)) = self.tx.try_send(line(&v)) {
            b.dropped += size;
        }
    }

    /// The last event, after everything still queued, waiting for the client to take it.
    pub async fn finish(&self, v: Value) {
        let mut pending: Vec<Bytes> = {
            let mut b = self.backlog();
            let mut p: Vec<Bytes> = b.queued.drain(..).collect();
            if !b.partial.is_empty() {
                let rest = std::mem::take(&mut b.partial);
                p.push(line(
                    &json!({"type": "log", "data": String::from_utf8_lossy(&rest)}),
                ));
            }
            if b.dropped > 0 {
                p.push(dropped_note(std::mem::take(&mut b.dropped)));
            }
            p
        };
        pending.push(line(&v));
        for l in pending {
            if self.tx.send(l).await.is_err() {
                return;
            }
        }
    }
}

impl Progress for Events {
    fn step_start(&self, index: usize, total: usize, display: &str) {
        self.must(json!({"type": "step", "index": index, "total": total, "display": display}));
    }

    fn log(&self, bytes: &[u8]) {
        // Whole UTF-8 characters only: a multi-byte character split between two reads is
        // sent with the next one instead of as two replacement characters.
        let text = {
            let mut b = self.backlog();
            let mut all = std::mem::take(&mut b.partial);
            all.extend_from_slice(bytes);
            let keep = match std::str::from_utf8(&all) {
                Err(e) if e.error_len().is_none() => all.len() - e.valid_up_to(),
                _ => 0,
            };
            b.partial = all.split_off(all.len() - keep);
            String::from_utf8_lossy(&all).into_owned()
        };
        if !text.is_empty() {
            let size = text.len() as u64;
            self.may(json!({"type": "log", "data": text}), size);
        }
    }

    fn step_done(&self, index: usize, outcome: StepOutcome) {
        let (cached, seconds) = match outcome {
            StepOutcome::Cached => (true, 0.0),
            StepOutcome::Built(d) => (false, d.as_secs_f64()),
        };
        self.must(
            json!({"type": "step_done", "index": index, "cached": cached, "seconds": seconds}),
        );
    }

    fn pull(&self, p: &PullProgress) {
        let v = match p {
            PullProgress::Resolved {
                layers,
                bytes_total,
            } => {
                json!({"type": "pull", "event": "resolved", "layers": layers, "bytes_total": bytes_total})
            }
            PullProgress::Layer {
                index,
                digest,
                bytes_done,
                bytes_total,
            } => json!({
                "type": "pull", "event": "layer", "index": index, "digest": digest,
                "bytes_done": bytes_done, "bytes_total": bytes_total,
            }),
            PullProgress::LayerCached { index, digest } => {
                json!({"type": "pull", "event": "layer_cached", "index": index, "digest": digest})
            }
            PullProgress::LayerDone { index } => {
                json!({"type": "pull", "event": "layer_done", "index": index})
            }
        };
        self.may(v, 0);
    }

    fn message(&self, text: &str) {
        self.must(json!({"type": "message", "text": text}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(rx: &mut mpsc::Receiver<Bytes>) -> Vec<Value> {
        let mut out = Vec::new();
        while let Ok(l) = rx.try_recv() {
            out.push(serde_json::from_slice(&l).unwrap());
        }
        out
    }

    #[test]
    fn output_is_dropped_for_a_slow_client_but_steps_are_not() {
        let ev = Events::new();
        let mut rx = ev.take_receiver();
        ev.step_start(1, 2, "RUN x");
        for _ in 0..EVENT_BUFFER + 10 {
            ev.log(b"0123456789");
        }
        ev.step_done(1, StepOutcome::Cached);
        let first = drain(&mut rx);
        assert_eq!(first.len(), EVENT_BUFFER);
        assert_eq!(first[0]["type"], "step");
        // Room again: the queued step_done comes after a note of what was dropped.
        ev.message("hello");
        let next = drain(&mut rx);
        assert_eq!(next[0]["type"], "log");
        assert!(next[0]["data"].as_str().unwrap().contains("110 bytes"));
        assert_eq!(next[1]["type"], "step_done");
        assert_eq!(next[2]["text"], "hello");
    }

    #[test]
    fn utf8_split_between_reads_is_kept_whole() {
        let ev = Events::new();
        let mut rx = ev.take_receiver();
        let s = "h\u{e9}llo".as_bytes();
        ev.log(&s[..2]);
        ev.log(&s[2..]);
        let got: String = drain(&mut rx)
            .iter()
            .map(|v| v["data"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(got, "h\u{e9}llo");
    }
}
