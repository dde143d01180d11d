//! One execution in a context, as a task of its own.
//!
//! It takes the context's exec lock (executions run one at a time), sets per-call environment
//! variables with silent set-up code, runs the code, forwards what the kernel reports, and
//! restores the variables. When its client goes away (the receiver is dropped) it interrupts
//! the kernel, again every second until the execution ends, and keeps draining until the
//! kernel is done, so the lock is released only once the kernel is idle again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use husk_proto::{ExecEvent, Execute, Request};
use tokio::sync::mpsc;
use zeroize::Zeroizing;

use crate::secrets::redact::Redactor;

use super::envcode::EnvCode;
use super::kernel::{Kernel, KernelOut, State};
use super::{Context, ContextError};

/// Bytes of result values (all MIME types of one result) assembled before the rest of that
/// result is dropped: a kernel's display data is hostile.
pub const MAX_RESULT_BYTES: usize = 64 << 20;

static NEXT_EXEC: AtomicU64 = AtomicU64::new(1);

/// One value of a result: its MIME type and its JSON value.
#[derive(Debug, Clone, PartialEq)]
pub struct MimeValue {
    pub mime: String,
    pub value: serde_json::Value,
}

/// What an execution reports to its client, in order; always ends with [`ExecOut::End`].
#[derive(Debug, Clone, PartialEq)]
pub enum ExecOut {
    Count(u64),
    Stdout {
        text: String,
        date: String,
    },
    Stderr {
        text: String,
        date: String,
    },
    Result {
        is_main: bool,
        data: Vec<MimeValue>,
    },
    Error {
        name: String,
        value: String,
        traceback: Vec<String>,
    },
    /// The kernel died during the execution (or was dead already); the context needs a
    /// restart.
    KernelDied(String),
    /// The sandbox went away (killed, timed out) during the execution: nothing follows, not
    /// even [`ExecOut::End`]. E2B's clients learn this from a connection that breaks off.
    SandboxGone,
    End,
}

/// Starts the execution task; its events come on the returned channel, with the secrets of
/// the kernel's environment masked in them.
pub fn start(
    ctx: Arc<Context>,
    code: String,
    env: Option<EnvCode>,
    restart: Restart,
) -> mpsc::Receiver<ExecOut> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let _one = ctx.exec_lock.clone().lock_owned().await;
        let mut kernel = ctx.kernel();
        if kernel.was_unresponsive() {
            // Killed by an earlier execution that its client left and that an interrupt did
            // not end (Deno's kernel, waiting on a timer, ignores one): a fresh kernel, and
            // the caller is told that the context's state is gone.
            match restart().await {
                Ok(fresh) => {
                    *ctx.kernel.lock().unwrap_or_else(|p| p.into_inner()) = fresh.clone();
                    kernel = fresh;
                    let _ = tx
                        .send(ExecOut::Stderr {
                            text: RESTARTED_NOTICE.to_string(),
                            date: time::OffsetDateTime::now_utc()
                                .format(&time::format_description::well_known::Rfc3339)
                                .unwrap_or_default(),
                        })
                        .await;
                }
                Err(e) => {
                    let _ = tx
                        .send(ExecOut::Error {
                            name: "KernelDied".into(),
                            value: format!(
                                "the context's kernel did not stop when interrupted and could \
                                 not be started again: {e}; restart the context"
                            ),
                            traceback: Vec::new(),
                        })
                        .await;
                    let _ = tx.send(ExecOut::End).await;
                    return;
                }
            }
        }
        let mut mask = Mask::new(ctx.env.redact.clone());
        if run(&kernel, &code, env.as_ref(), &tx, &mut mask).await {
            let _ = tx.send(ExecOut::End).await;
        }
    });
    rx
}

/// Runs the execution (with its environment set before and restored after); false when the
/// sandbox went away meanwhile (the last event sent was [`ExecOut::SandboxGone`]).
async fn run(
    kernel: &Kernel,
    code: &str,
    env: Option<&EnvCode>,
    tx: &mpsc::Sender<ExecOut>,
    mask: &mut Mask,
) -> bool {
    // Sends a failure's event; whether the execution can still end normally.
    async fn failed(tx: &mpsc::Sender<ExecOut>, out: ExecOut) -> bool {
        let gone = matches!(out, ExecOut::SandboxGone);
        let _ = tx.send(out).await;
        !gone
    }
    if let Some(env) = env {
        if let Err(out) = silent(kernel, &env.set).await {
            return failed(tx, mask.whole(out)).await;
        }
    }
    let ran = one(kernel, code, false, Some(tx), mask).await;
    // What was held back (it could have begun a secret's value) goes out now, masked.
    for out in mask.finish() {
        let _ = tx.send(out).await;
    }
    if let Err(e) = ran {
        return failed(tx, mask.whole(e.into_out())).await;
    }
    if let Some(env) = env {
        // A failed restore is reported: the variables would otherwise leak into later calls.
        if let Err(out) = silent(kernel, &env.restore).await {
            return failed(tx, mask.whole(out)).await;
        }
    }
    true
}

/// Masks the values of the kernel's secrets in what an execution reports: output streams as
/// they come (a value split across messages too: the end of a message that could begin one
/// is held back until the next, or the end), results' and errors' strings whole.
pub(crate) struct Mask {
    values: Arc<Vec<Zeroizing<Vec<u8>>>>,
    /// For strings masked whole.
    whole: Redactor,
    out: Option<(Redactor, String)>,
    err: Option<(Redactor, String)>,
}

impl Mask {
    pub(crate) fn new(values: Arc<Vec<Zeroizing<Vec<u8>>>>) -> Mask {
        Mask {
            whole: Redactor::new(&values),
            values,
            out: None,
            err: None,
        }
    }

    fn active(&self) -> bool {
        self.whole.is_active()
    }

    /// `s` with every value masked.
    fn text(&self, s: String) -> String {
        if !self.active() {
            return s;
        }
        String::from_utf8_lossy(&self.whole.mask(s.as_bytes())).into_owned()
    }

    fn json(&self, v: &mut serde_json::Value) {
        match v {
            serde_json::Value::String(s) => *s = self.text(std::mem::take(s)),
            serde_json::Value::Array(a) => a.iter_mut().for_each(|v| self.json(v)),
            serde_json::Value::Object(o) => o.values_mut().for_each(|v| self.json(v)),
            _ => {}
        }
    }

    /// One event of the stream, masked; `None` while all of a stream's text is held back.
    pub(crate) fn stream(&mut self, out: ExecOut) -> Option<ExecOut> {
        if !self.active() {
            return Some(out);
        }
        let (slot, text, date, is_out) = match out {
            ExecOut::Stdout { text, date } => (&mut self.out, text, date, true),
            ExecOut::Stderr { text, date } => (&mut self.err, text, date, false),
            other => return Some(self.whole(other)),
        };
        let (r, last) = slot.get_or_insert_with(|| (Redactor::new(&self.values), String::new()));
        *last = date.clone();
        // Held back only where a value could begin, which is a character boundary (the values
        // are UTF-8): what is sent is whole text.
        let text = String::from_utf8_lossy(&r.push(text.as_bytes())).into_owned();
        if text.is_empty() {
            return None;
        }
        Some(if is_out {
            ExecOut::Stdout { text, date }
        } else {
            ExecOut::Stderr { text, date }
        })
    }

    /// A result, an error or a death, with every string in it masked.
    pub(crate) fn whole(&self, out: ExecOut) -> ExecOut {
        if !self.active() {
            return out;
        }
        match out {
            ExecOut::Result { is_main, mut data } => {
                for d in &mut data {
                    self.json(&mut d.value);
                }
                ExecOut::Result { is_main, data }
            }
            ExecOut::Error {
                name,
                value,
                traceback,
            } => ExecOut::Error {
                name: self.text(name),
                value: self.text(value),
                traceback: traceback.into_iter().map(|t| self.text(t)).collect(),
            },
            ExecOut::KernelDied(why) => ExecOut::KernelDied(self.text(why)),
            ExecOut::Stdout { text, date } => ExecOut::Stdout {
                text: self.text(text),
                date,
            },
            ExecOut::Stderr { text, date } => ExecOut::Stderr {
                text: self.text(text),
                date,
            },
            other => other,
        }
    }

    /// What the streams held back, masked (at the end of an execution).
    pub(crate) fn finish(&mut self) -> Vec<ExecOut> {
        let mut outs = Vec::new();
        for (slot, is_out) in [(&mut self.out, true), (&mut self.err, false)] {
            if let Some((mut r, date)) = slot.take() {
                let rest = r.finish();
                if rest.is_empty() {
                    continue;
                }
                let text = String::from_utf8_lossy(&rest).into_owned();
                outs.push(if is_out {
                    ExecOut::Stdout { text, date }
                } else {
                    ExecOut::Stderr { text, date }
                });
            }
        }
        outs
    }
}

/// Runs set-up code; its error (or the kernel's death) is what the client hears instead.
pub(super) async fn silent(kernel: &Kernel, code: &str) -> Result<(), ExecOut> {
    let (etx, mut erx) = mpsc::channel(8);
    // Read while it runs: set-up code's own output must not fill the channel and stall it.
    let collect = async move {
        let mut error = None;
        while let Some(out) = erx.recv().await {
            if let ExecOut::Error { name, value, .. } = out {
                error.get_or_insert(ExecOut::Error {
                    name: "EnvironmentError".into(),
                    value: format!("setting the call's env_vars failed: {name}: {value}"),
                    traceback: Vec::new(),
                });
            }
        }
        error
    };
    // Set-up code's output is never reported; its error is replaced by a message of husk's.
    let mut unmasked = Mask::new(Arc::new(Vec::new()));
    let run = async move { one(kernel, code, true, Some(&etx), &mut unmasked).await };
    let (res, error) = tokio::join!(run, collect);
    if let Err(e) = res {
        return Err(e.into_out());
    }
    match error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Why one execute request did not run to its end.
enum Failed {
    /// The kernel died (or was dead).
    Died(String),
    /// The sandbox went away.
    Gone,
    /// The agent refused the request (the kernel lives on).
    Refused(String),
}

impl Failed {
    fn into_out(self) -> ExecOut {
        match self {
            Failed::Died(why) => ExecOut::KernelDied(why),
            Failed::Gone => ExecOut::SandboxGone,
            Failed::Refused(why) => ExecOut::Error {
                name: "ExecutionError".into(),
                value: why,
                traceback: Vec::new(),
            },
        }
    }
}

/// A dead kernel's failure: the sandbox's going, when that is what killed it.
fn died(kernel: &Kernel, why: String) -> Failed {
    if kernel.agent().is_closed() {
        Failed::Gone
    } else {
        Failed::Died(why)
    }
}

/// Starts a fresh kernel for a context whose kernel was killed as unresponsive.
pub type Restart = Box<
    dyn FnOnce() -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<Arc<Kernel>, ContextError>> + Send>,
        > + Send,
>;

/// What the execution after such a restart first says on stderr.
pub const RESTARTED_NOTICE: &str = "husk: this context's kernel did not stop when an earlier \
    execution was interrupted, so it was restarted: the context's variables are gone\n";

/// How long an interrupted execution may take to end before its kernel is killed (and the
/// context gets a fresh one at its next execution): a kernel that ignores interrupts must not
/// hold its context busy forever.
pub const INTERRUPT_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// How often a kernel whose client went away is interrupted again until its execution ends.
/// A kernel ignores an interrupt that arrives outside the running code (ipykernel sets SIGINT
/// to `SIG_IGN` while idle and installs its handler only around a request's handler), so one
/// interrupt sent just as the execution starts can be lost, and the context would stay busy
/// until the code ended by itself. A repeated one is harmless: at worst it is ignored too.
const REINTERRUPT: std::time::Duration = std::time::Duration::from_secs(1);

/// Runs one execute request to its end. Events go to `tx` while it listens; once it is gone
/// the kernel is interrupted (again every [`REINTERRUPT`] until it is done) and the rest
/// drained.
async fn one(
    kernel: &Kernel,
    code: &str,
    silent: bool,
    tx: Option<&mpsc::Sender<ExecOut>>,
    mask: &mut Mask,
) -> Result<(), Failed> {
    let exec = NEXT_EXEC.fetch_add(1, Ordering::Relaxed);
    let mut rx = kernel.route(exec);
    // After routing: a death from now on reaches `rx`; one before shows in the state.
    if let State::Dead(why) = kernel.state() {
        kernel.unroute(exec);
        return Err(died(kernel, why));
    }
    let req = Request::Execute(Execute {
        kernel: kernel.id,
        exec,
        code: code.to_owned(),
        silent,
    });
    if let Err(e) = kernel.agent().call(req).await {
        kernel.unroute(exec);
        return Err(match (kernel.state(), e) {
            (State::Dead(why), _) => died(kernel, why),
            (_, crate::agent::CallError::Gone) => Failed::Gone,
            (_, crate::agent::CallError::Agent(a)) => Failed::Refused(a.message),
        });
    }
    let mut listening = tx.is_some();
    // When the kernel is interrupted (next), once the client has gone.
    let mut interrupt_at: Option<tokio::time::Instant> = None;
    let mut first_interrupt: Option<tokio::time::Instant> = None;
    let mut killed = false;
    let mut result = Assembler::default();
    let outcome = loop {
        let msg = if listening {
            let client = tx.expect("listening implies a sender");
            tokio::select! {
                m = rx.recv() => m,
                _ = client.closed() => {
                    listening = false;
                    continue;
                }
            }
        } else {
            let now = tokio::time::Instant::now();
            let due = *interrupt_at.get_or_insert(now);
            let since = *first_interrupt.get_or_insert(now);
            let next = if now.duration_since(since) >= INTERRUPT_GRACE && !killed {
                // Interrupts did not end it: the kernel goes (its death ends this loop).
                killed = true;
                kernel.kill_unresponsive().await;
                now + REINTERRUPT
            } else if due <= now && !killed {
                kernel.interrupt().await;
                now + REINTERRUPT
            } else {
                due.max(now + REINTERRUPT)
            };
            interrupt_at = Some(next);
            match tokio::time::timeout_at(next, rx.recv()).await {
                Ok(m) => m,
                // Not done yet: interrupt again.
                Err(_) => continue,
            }
        };
        let Some(msg) = msg else {
            break Err(Failed::Gone);
        };
        let out = match msg {
            KernelOut::Dead(why) => break Err(died(kernel, why)),
            KernelOut::Event(ExecEvent::Done { .. }) => break Ok(()),
            KernelOut::Event(ev) => result.push(ev).and_then(|out| mask.stream(out)),
        };
        if let (Some(out), true) = (out, listening) {
            let client = tx.expect("listening implies a sender");
            if client.send(out).await.is_err() {
                listening = false;
            }
        }
    };
    kernel.unroute(exec);
    outcome
}

/// Turns the agent's events into client events, assembling result values from their parts.
#[derive(Default)]
struct Assembler {
    parts: Vec<(String, Vec<u8>)>,
    bytes: usize,
    overflowed: bool,
}

impl Assembler {
    fn push(&mut self, ev: ExecEvent) -> Option<ExecOut> {
        match ev {
            ExecEvent::Count(n) => Some(ExecOut::Count(n)),
            ExecEvent::Stdout { text, date } => Some(ExecOut::Stdout { text, date }),
            ExecEvent::Stderr { text, date } => Some(ExecOut::Stderr { text, date }),
            ExecEvent::Error {
                name,
                value,
                traceback,
            } => Some(ExecOut::Error {
                name,
                value,
                traceback,
            }),
            ExecEvent::ResultPart { mime, json } => {
                self.bytes += json.len();
                if self.bytes > MAX_RESULT_BYTES {
                    self.overflowed = true;
                    return None;
                }
                match self.parts.last_mut() {
                    Some((m, buf)) if *m == mime => buf.extend_from_slice(&json),
                    _ => self.parts.push((mime, json)),
                }
                None
            }
            ExecEvent::Result { is_main, .. } => {
                let parts = std::mem::take(&mut self.parts);
                let overflowed = std::mem::take(&mut self.overflowed);
                self.bytes = 0;
                let mut data: Vec<MimeValue> = Vec::with_capacity(parts.len());
                for (mime, json) in parts {
                    // A value that is not JSON is the kernel's fault; it is dropped, not
                    // guessed at.
                    if let Ok(value) = serde_json::from_slice(&json) {
                        data.retain(|d| d.mime != mime);
                        data.push(MimeValue { mime, value });
                    }
                }
                if overflowed {
                    data.push(MimeValue {
                        mime: "text/plain".into(),
                        value: serde_json::Value::String(format!(
                            "[result dropped: larger than {} MiB]",
                            MAX_RESULT_BYTES >> 20
                        )),
                    });
                    data.retain(|d| d.mime == "text/plain");
                    data.truncate(1);
                }
                Some(ExecOut::Result { is_main, data })
            }
            ExecEvent::Done { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_parts_are_joined_per_mime_and_parsed() {
        let mut a = Assembler::default();
        for (mime, json) in [
            ("text/plain", &b"\"4"[..]),
            ("text/plain", b"2\""),
            ("application/json", b"{\"a\": [1, 2]}"),
            ("image/png", b"not json"),
        ] {
            assert_eq!(
                a.push(ExecEvent::ResultPart {
                    mime: mime.into(),
                    json: json.to_vec()
                }),
                None
            );
        }
        let out = a.push(ExecEvent::Result {
            is_main: true,
            date: String::new(),
        });
        assert_eq!(
            out,
            Some(ExecOut::Result {
                is_main: true,
                data: vec![
                    MimeValue {
                        mime: "text/plain".into(),
                        value: serde_json::json!("42")
                    },
                    MimeValue {
                        mime: "application/json".into(),
                        value: serde_json::json!({"a": [1, 2]})
                    },
                ]
            })
        );
        // The next result starts empty.
        let out = a.push(ExecEvent::Result {
            is_main: false,
            date: String::new(),
        });
        assert_eq!(
            out,
            Some(ExecOut::Result {
                is_main: false,
                data: vec![]
            })
        );
    }

    #[test]
    fn an_oversized_result_is_replaced_by_a_note() {
        let mut a = Assembler::default();
        let big = vec![b'a'; 1 << 20];
        for _ in 0..(MAX_RESULT_BYTES >> 20) + 1 {
            a.push(ExecEvent::ResultPart {
                mime: "image/png".into(),
                json: big.clone(),
            });
        }
        let Some(ExecOut::Result { data, .. }) = a.push(ExecEvent::Result {
            is_main: true,
            date: String::new(),
        }) else {
            panic!("no result");
        };
        assert_eq!(data.len(), 1);
        assert_eq!(data[0].mime, "text/plain");
        assert!(data[0].value.as_str().unwrap().contains("result dropped"));
        assert_eq!(a.bytes, 0);
    }

    fn secret_mask() -> Mask {
        Mask::new(Arc::new(vec![Zeroizing::new(b"sk-SECRET-42".to_vec())]))
    }

    fn stdout(text: &str) -> ExecOut {
        ExecOut::Stdout {
            text: text.into(),
            date: "d".into(),
        }
    }

    #[test]
    fn a_secret_split_across_output_messages_is_masked() {
        let mut m = secret_mask();
        let mut got = String::new();
        for chunk in ["value: sk-SEC", "RET-42 and more\n", "tail sk-S"] {
            if let Some(ExecOut::Stdout { text, .. }) = m.stream(stdout(chunk)) {
                got.push_str(&text);
            }
        }
        for out in m.finish() {
            if let ExecOut::Stdout { text, .. } = out {
                got.push_str(&text);
            }
        }
        assert_eq!(got, "value: **** and more\ntail sk-S");
        // Streams are masked apart: stderr's text never completes stdout's.
        let mut m = secret_mask();
        assert!(m.stream(stdout("x sk-SEC")).is_some());
        let err = m.stream(ExecOut::Stderr {
            text: "RET-42".into(),
            date: "d".into(),
        });
        assert_eq!(
            err,
            Some(ExecOut::Stderr {
                text: "RET-42".into(),
                date: "d".into()
            })
        );
    }

    #[test]
    fn results_and_errors_are_masked_whole() {
        let mut m = secret_mask();
        let result = ExecOut::Result {
            is_main: true,
            data: vec![
                MimeValue {
                    mime: "text/plain".into(),
                    value: serde_json::json!("'sk-SECRET-42'"),
                },
                MimeValue {
                    mime: "application/json".into(),
                    value: serde_json::json!({"k": ["a", "sk-SECRET-42!"], "n": 1}),
                },
            ],
        };
        let ExecOut::Result { data, .. } = m.stream(result).unwrap() else {
            panic!("a result")
        };
        assert_eq!(data[0].value, serde_json::json!("'****'"));
        assert_eq!(
            data[1].value,
            serde_json::json!({"k": ["a", "****!"], "n": 1})
        );
        let err = m.whole(ExecOut::Error {
            name: "KeyError".into(),
            value: "sk-SECRET-42".into(),
            traceback: vec!["line 1: print('sk-SECRET-42')".into()],
        });
        assert_eq!(
            err,
            ExecOut::Error {
                name: "KeyError".into(),
                value: "****".into(),
                traceback: vec!["line 1: print('****')".into()],
            }
        );
        // Without secrets (or with redaction off), nothing is touched or held back.
        let mut off = Mask::new(Arc::new(Vec::new()));
        assert_eq!(off.stream(stdout("sk-SEC")), Some(stdout("sk-SEC")));
        assert!(off.finish().is_empty());
    }
}
