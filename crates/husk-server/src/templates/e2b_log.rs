//! The log of a build of E2B's template API: husk's build events (`husk_build::events`)
//! turned into E2B's log entries, each labelled with the E2B step it belongs to, bounded in
//! bytes; and the build's status and, once it failed, why.

use serde_json::{json, Value};
use time::OffsetDateTime;

use crate::rest::rfc3339;

/// Bytes of log messages kept per build; output past it is dropped (steps and the outcome
/// are always kept).
pub const MAX_LOG_BYTES: usize = 2 << 20;
/// Longest log entry; a longer output line is split.
const MAX_LINE: usize = 8 << 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Waiting,
    Building,
    Ready,
    Error,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Waiting => "waiting",
            Status::Building => "building",
            Status::Ready => "ready",
            Status::Error => "error",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        }
    }

    pub fn parse(s: &str) -> Option<Level> {
        Some(match s {
            "debug" => Level::Debug,
            "info" => Level::Info,
            "warn" => Level::Warn,
            "error" => Level::Error,
            _ => return None,
        })
    }
}

pub struct Entry {
    pub at: OffsetDateTime,
    pub level: Level,
    pub message: String,
    pub step: Option<String>,
}

/// A build's progress: its status, log and, once it failed, why.
pub struct Log {
    pub status: Status,
    /// Its steps were given (`POST /v2/templates/{id}/builds/{buildID}`).
    pub triggered: bool,
    pub entries: Vec<Entry>,
    pub bytes: usize,
    /// Output was dropped past [`MAX_LOG_BYTES`].
    pub truncated: bool,
    pub reason: Option<(String, Option<String>)>,
    /// The step whose output comes now (`base`, `1`, ..., `finalize`).
    pub step: Option<String>,
    /// Output not yet ended by a newline.
    pub partial: Vec<u8>,
}

impl Log {
    pub fn new() -> Log {
        Log {
            status: Status::Waiting,
            triggered: false,
            entries: Vec::new(),
            bytes: 0,
            truncated: false,
            reason: None,
            step: None,
            partial: Vec::new(),
        }
    }

    pub fn push(&mut self, level: Level, message: String, output: bool) {
        if output && self.bytes + message.len() > MAX_LOG_BYTES {
            if !self.truncated {
                self.truncated = true;
                self.entries.push(Entry {
                    at: OffsetDateTime::now_utc(),
                    level: Level::Warn,
                    message: format!(
                        "husk: build output past {} MiB is not kept",
                        MAX_LOG_BYTES >> 20
                    ),
                    step: self.step.clone(),
                });
            }
            return;
        }
        self.bytes += message.len();
        self.entries.push(Entry {
            at: OffsetDateTime::now_utc(),
            level,
            message,
            step: self.step.clone(),
        });
    }

    /// A step's output: whole lines become entries.
    pub fn output(&mut self, data: &str) {
        self.partial.extend_from_slice(data.as_bytes());
        while let Some(i) = self.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=i).collect();
            self.output_line(&line[..line.len() - 1]);
        }
        while self.partial.len() > MAX_LINE {
            let line: Vec<u8> = self.partial.drain(..MAX_LINE).collect();
            self.output_line(&line);
        }
    }

    fn output_line(&mut self, line: &[u8]) {
        let text = String::from_utf8_lossy(line);
        let text = text.trim_end_matches('\r');
        // Progress bars redraw with carriage returns: the last state is the line.
        let text = text.rsplit('\r').next().unwrap_or("").to_string();
        self.push(Level::Info, text, true);
    }

    pub fn flush(&mut self) {
        if !self.partial.is_empty() {
            let rest = std::mem::take(&mut self.partial);
            self.output_line(&rest);
        }
    }

    pub fn fail(&mut self, message: String) {
        self.flush();
        self.push(Level::Error, message.clone(), false);
        self.reason = Some((message, self.step.clone()));
        self.status = Status::Error;
    }
}

/// One event of husk's build (`husk_build::events`) into E2B's log.
pub fn apply(log: &mut Log, ev: &Value, numbers: &[usize]) {
    let s = |k: &str| ev.get(k).and_then(Value::as_str).unwrap_or_default();
    let n = |k: &str| ev.get(k).and_then(Value::as_u64).unwrap_or_default() as usize;
    match s("type") {
        "step" => {
            log.flush();
            let (index, total) = (n("index"), n("total"));
            log.step = Some(if index <= 1 {
                "base".into()
            } else if index >= total {
                "finalize".into()
            } else {
                numbers
                    .get(index - 2)
                    .map_or_else(|| (index - 1).to_string(), |n| n.to_string())
            });
            log.push(
                Level::Info,
                format!("[{index}/{total}] {}", s("display")),
                false,
            );
        }
        "log" => log.output(s("data")),
        "step_done" => {
            log.flush();
            let index = n("index");
            let message = if ev.get("cached").and_then(Value::as_bool) == Some(true) {
                format!("CACHED [{index}]")
            } else {
                let secs = ev.get("seconds").and_then(Value::as_f64).unwrap_or(0.0);
                format!("done [{index}] in {secs:.1} s")
            };
            log.push(Level::Info, message, false);
        }
        "pull" => match s("event") {
            "resolved" => log.push(
                Level::Info,
                format!(
                    "pulling {} layers ({} bytes)",
                    n("layers"),
                    n("bytes_total")
                ),
                false,
            ),
            "layer_done" | "layer_cached" => {
                log.push(Level::Debug, format!("layer {} ready", n("index")), true)
            }
            _ => {}
        },
        "message" => log.push(Level::Info, s("text").to_string(), false),
        "done" => {
            log.flush();
            log.step = Some("finalize".into());
            let t = ev.get("template").cloned().unwrap_or_default();
            log.push(
                Level::Info,
                format!(
                    "template {} built: {} ({} bytes)",
                    t.get("name").and_then(Value::as_str).unwrap_or_default(),
                    t.get("digest").and_then(Value::as_str).unwrap_or_default(),
                    t.get("size").and_then(Value::as_u64).unwrap_or_default()
                ),
                false,
            );
            log.status = Status::Ready;
        }
        "error" => log.fail(s("message").to_string()),
        _ => {}
    }
}

pub fn entry_json(e: &Entry) -> Value {
    let mut v = json!({
        "timestamp": rfc3339(e.at),
        "level": e.level.as_str(),
        "message": e.message,
    });
    if let Some(step) = &e.step {
        v["step"] = json!(step);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log() -> Log {
        Log {
            status: Status::Building,
            triggered: true,
            ..Log::new()
        }
    }

    #[test]
    fn events_become_entries_labelled_with_e2b_steps() {
        let mut l = log();
        let numbers = [1, 3, 3];
        let evs = [
            json!({"type": "step", "index": 1, "total": 5, "display": "FROM base"}),
            json!({"type": "step_done", "index": 1, "cached": true, "seconds": 0.0}),
            json!({"type": "step", "index": 2, "total": 5, "display": "RUN echo hi"}),
            json!({"type": "log", "data": "hel"}),
            json!({"type": "log", "data": "lo\nwor"}),
            json!({"type": "log", "data": "ld\r\n10%\r50%\r100%\n"}),
            json!({"type": "step_done", "index": 2, "cached": false, "seconds": 1.25}),
            json!({"type": "step", "index": 4, "total": 5, "display": "COPY (mode)"}),
            json!({"type": "log", "data": "no newline"}),
            json!({"type": "error", "message": "step 3: chmod failed"}),
        ];
        for ev in &evs {
            apply(&mut l, ev, &numbers);
        }
        let got: Vec<(String, Option<String>)> = l
            .entries
            .iter()
            .map(|e| (e.message.clone(), e.step.clone()))
            .collect();
        let s = |m: &str, st: &str| (m.to_string(), Some(st.to_string()));
        assert_eq!(
            got,
            vec![
                s("[1/5] FROM base", "base"),
                s("CACHED [1]", "base"),
                s("[2/5] RUN echo hi", "1"),
                s("hello", "1"),
                s("world", "1"),
                s("100%", "1"),
                s("done [2] in 1.2 s", "1"),
                s("[4/5] COPY (mode)", "3"),
                s("no newline", "3"),
                s("step 3: chmod failed", "3"),
            ]
        );
        assert_eq!(l.status, Status::Error);
        assert_eq!(
            l.reason,
            Some(("step 3: chmod failed".into(), Some("3".into())))
        );
        assert_eq!(l.entries.last().unwrap().level, Level::Error);
    }

    #[test]
    fn output_is_bounded_but_steps_and_the_outcome_are_kept() {
        let mut l = log();
        let line = "x".repeat(1000) + "\n";
        for _ in 0..(MAX_LOG_BYTES / 1000 + 10) {
            apply(&mut l, &json!({"type": "log", "data": line}), &[]);
        }
        assert!(l.truncated);
        assert!(l.bytes <= MAX_LOG_BYTES);
        let warned = l.entries.iter().filter(|e| e.level == Level::Warn).count();
        assert_eq!(warned, 1);
        // A line without a newline is split, not held whole.
        apply(
            &mut l,
            &json!({"type": "done", "template": {"name": "t"}}),
            &[],
        );
        assert_eq!(l.status, Status::Ready);
        assert!(l
            .entries
            .last()
            .unwrap()
            .message
            .starts_with("template t built"));
        let mut l = log();
        apply(
            &mut l,
            &json!({"type": "log", "data": "y".repeat(3 * MAX_LINE)}),
            &[],
        );
        // Two entries now; the rest waits for its newline, or the step's end.
        assert_eq!(l.entries.len(), 2);
        l.flush();
        assert_eq!(l.entries.len(), 3);
        assert!(l.entries.iter().all(|e| e.message.len() == MAX_LINE));
    }
}
