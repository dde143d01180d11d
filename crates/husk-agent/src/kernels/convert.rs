//! From what a kernel said ([`husk_jupyter::client`]) to the protocol's events, bounded the
//! way the server checks them: text in pieces of at most [`CHUNK`] bytes, result values in
//! [`ExecEvent::ResultPart`]s of at most [`CHUNK`] bytes, errors well below [`CHUNK`] in total,
//! dates and labels short. A kernel that says more than that gets cut, never the connection.

use husk_jupyter::client::ExecEvent as ClientExec;
use husk_jupyter::wire::{ExecuteReply, KernelInfoReply, MimeBundle};
use husk_proto::{ExecEvent, KernelEvent, CHUNK};

use super::spec::truncate;

/// Longest header date passed on (the server accepts 64 bytes; ISO 8601 needs 32).
const MAX_DATE: usize = 64;
/// Longest MIME type passed on (the server accepts 256 bytes); longer ones are dropped.
const MAX_MIME: usize = 256;
/// Longest `language` and `implementation` of [`KernelEvent::Ready`] (the server accepts 1024).
const MAX_READY_LABEL: usize = 1024;
/// Bounds of an error: its name, its value, one traceback line, the whole traceback, and the
/// number of traceback lines. Their sum (with markers) stays far below [`CHUNK`].
const MAX_ERROR_NAME: usize = 1 << 10;
const MAX_ERROR_VALUE: usize = 64 << 10;
const MAX_TRACEBACK_LINE: usize = 16 << 10;
const MAX_TRACEBACK: usize = 256 << 10;
const MAX_TRACEBACK_LINES: usize = 1000;
/// Appended to a cut string.
const CUT: &str = " …[truncated]";

/// `text` in pieces of at most `max` (≥ 4) bytes, each cut at a character boundary; an empty
/// text is no piece.
pub fn split_text(text: &str, max: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let mut end = rest.len().min(max);
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        out.push(rest[..end].to_owned());
        rest = &rest[end..];
    }
    out
}

/// The [`ExecEvent::ResultPart`]s of one MIME bundle: each value as JSON text, in pieces of at
/// most `max` bytes. MIME types longer than the server accepts are left out.
pub fn result_parts(data: MimeBundle, max: usize) -> Vec<ExecEvent> {
    let mut out = Vec::new();
    for (mime, value) in data {
        if mime.len() > MAX_MIME {
            continue;
        }
        // A `Value` always serializes (its keys are strings).
        let json = serde_json::to_vec(&value).unwrap_or_default();
        drop(value);
        for piece in json.chunks(max) {
            out.push(ExecEvent::ResultPart {
                mime: mime.clone(),
                json: piece.to_vec(),
            });
        }
    }
    out
}

/// `s` cut to at most `max` bytes plus a marker saying so.
fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut out = truncate(s, max);
    out.push_str(CUT);
    out
}

/// An error event bounded well below [`CHUNK`]: the traceback keeps its last lines (where the
/// error is), with a first line saying how many were left out.
pub fn bounded_error(name: &str, value: &str, traceback: &[String]) -> ExecEvent {
    let mut kept: Vec<String> = Vec::new();
    let mut total = 0;
    for line in traceback.iter().rev() {
        let line = cut(line, MAX_TRACEBACK_LINE);
        if kept.len() >= MAX_TRACEBACK_LINES || total + line.len() > MAX_TRACEBACK {
            break;
        }
        total += line.len();
        kept.push(line);
    }
    let omitted = traceback.len() - kept.len();
    if omitted > 0 {
        kept.push(format!("[… {omitted} earlier traceback lines omitted]"));
    }
    kept.reverse();
    ExecEvent::Error {
        name: cut(name, MAX_ERROR_NAME),
        value: cut(value, MAX_ERROR_VALUE),
        traceback: kept,
    }
}

fn date(d: &str) -> String {
    truncate(d, MAX_DATE)
}

/// The protocol's events for one event of an execution, in order.
pub fn exec_events(event: ClientExec) -> Vec<ExecEvent> {
    match event {
        ClientExec::ExecutionCount(n) => vec![ExecEvent::Count(n)],
        ClientExec::Stdout { text, date: d } => split_text(&text, CHUNK)
            .into_iter()
            .map(|text| ExecEvent::Stdout {
                text,
                date: date(&d),
            })
            .collect(),
        ClientExec::Stderr { text, date: d } => split_text(&text, CHUNK)
            .into_iter()
            .map(|text| ExecEvent::Stderr {
                text,
                date: date(&d),
            })
            .collect(),
        ClientExec::Result {
            is_main,
            data,
            date: d,
        } => {
            let mut out = result_parts(data, CHUNK);
            out.push(ExecEvent::Result {
                is_main,
                date: date(&d),
            });
            out
        }
        ClientExec::Error {
            name,
            value,
            traceback,
        } => vec![bounded_error(&name, &value, &traceback)],
        ClientExec::Done { reply } => {
            let status = match reply {
                ExecuteReply::Ok { .. } => "ok",
                ExecuteReply::Error { .. } => "error",
                ExecuteReply::Aborted => "aborted",
            };
            vec![ExecEvent::Done {
                status: status.into(),
            }]
        }
    }
}

/// [`KernelEvent::Ready`] from the kernel's `kernel_info_reply`.
pub fn ready(info: &KernelInfoReply) -> KernelEvent {
    let implementation = format!("{} {}", info.implementation, info.implementation_version);
    KernelEvent::Ready {
        language: truncate(&info.language_info.name, MAX_READY_LABEL),
        implementation: truncate(implementation.trim(), MAX_READY_LABEL),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn text_is_split_at_char_boundaries() {
        assert!(split_text("", 4).is_empty());
        assert_eq!(split_text("abcdefghij", 4), ["abcd", "efgh", "ij"]);
        // "é" is 2 bytes, "€" 3: no piece may end inside one.
        let s = "aé€€b€";
        let pieces = split_text(s, 4);
        assert_eq!(pieces, ["aé", "€", "€b", "€"]);
        assert!(pieces.iter().all(|p| p.len() <= 4));
        assert_eq!(pieces.concat(), s);
        let big = "ü".repeat(CHUNK);
        let pieces = split_text(&big, CHUNK);
        assert_eq!(pieces.len(), 2);
        assert!(pieces.iter().all(|p| p.len() <= CHUNK));
        assert_eq!(pieces.concat(), big);
    }

    /// Joins consecutive parts of the same MIME type, as the server does.
    fn reassemble(events: &[ExecEvent]) -> Vec<(String, serde_json::Value)> {
        let mut out: Vec<(String, Vec<u8>)> = Vec::new();
        for e in events {
            let ExecEvent::ResultPart { mime, json } = e else {
                panic!("{e:?}");
            };
            match out.last_mut() {
                Some((m, j)) if m == mime => j.extend_from_slice(json),
                _ => out.push((mime.clone(), json.clone())),
            }
        }
        out.into_iter()
            .map(|(m, j)| (m, serde_json::from_slice(&j).unwrap()))
            .collect()
    }

    #[test]
    fn result_values_are_json_in_bounded_parts() {
        let png = "iVBORw0KGgo".repeat(100);
        let mut data = MimeBundle::new();
        data.insert("text/plain".into(), json!("'a \"quoted\" text'"));
        data.insert("image/png".into(), json!(png));
        data.insert("application/json".into(), json!({"a": [1, 2, {"b": null}]}));
        data.insert("x/".to_owned() + &"y".repeat(300), json!("dropped"));
        let parts = result_parts(data.clone(), 64);
        assert!(parts.iter().all(|p| matches!(p,
            ExecEvent::ResultPart { json, mime } if json.len() <= 64 && mime.len() <= 256)));
        let values = reassemble(&parts);
        assert_eq!(values.len(), 3);
        for (mime, value) in values {
            assert_eq!(Some(&value), data.get(&mime), "{mime}");
        }
        // A small value is one part.
        let mut one = MimeBundle::new();
        one.insert("text/plain".into(), json!("42"));
        assert_eq!(
            result_parts(one, CHUNK),
            [ExecEvent::ResultPart {
                mime: "text/plain".into(),
                json: b"\"42\"".to_vec()
            }]
        );
    }

    #[test]
    fn a_result_event_closes_its_parts() {
        let mut data = MimeBundle::new();
        data.insert("text/plain".into(), json!("x".repeat(CHUNK + 10)));
        let events = exec_events(ClientExec::Result {
            is_main: true,
            data,
            date: "d".repeat(100),
        });
        assert_eq!(events.len(), 3);
        assert!(matches!(&events[2],
            ExecEvent::Result { is_main: true, date } if date.len() == MAX_DATE));
        assert_eq!(
            reassemble(&events[..2])[0].1.as_str().unwrap().len(),
            CHUNK + 10
        );
    }

    fn error_size(e: &ExecEvent) -> usize {
        let ExecEvent::Error {
            name,
            value,
            traceback,
        } = e
        else {
            panic!("{e:?}");
        };
        name.len() + value.len() + traceback.iter().map(String::len).sum::<usize>()
    }

    #[test]
    fn errors_stay_well_below_a_chunk() {
        // Small ones pass unchanged.
        let tb = vec!["Traceback".to_owned(), "ZeroDivisionError: x".to_owned()];
        assert_eq!(
            bounded_error("ZeroDivisionError", "division by zero", &tb),
            ExecEvent::Error {
                name: "ZeroDivisionError".into(),
                value: "division by zero".into(),
                traceback: tb.clone(),
            }
        );
        // Huge ones are cut, keeping the traceback's end.
        let mut tb: Vec<String> = (0..100_000).map(|i| format!("frame {i}")).collect();
        tb.push("é".repeat(CHUNK));
        tb.push("LastError: here".into());
        let e = bounded_error(&"N".repeat(CHUNK), &"v".repeat(4 * CHUNK), &tb);
        assert!(error_size(&e) <= CHUNK / 2, "{}", error_size(&e));
        let ExecEvent::Error {
            name,
            value,
            traceback,
        } = &e
        else {
            unreachable!()
        };
        assert!(name.ends_with(CUT) && value.ends_with(CUT));
        assert_eq!(traceback.last().unwrap(), "LastError: here");
        assert!(traceback[traceback.len() - 2].ends_with(CUT));
        assert!(traceback[0].contains("earlier traceback lines omitted"));
        assert!(traceback.len() <= MAX_TRACEBACK_LINES + 1);
        // Many short lines: the count bound.
        let tb: Vec<String> = (0..5000).map(|i| format!("{i}")).collect();
        let ExecEvent::Error { traceback, .. } = bounded_error("E", "v", &tb) else {
            unreachable!()
        };
        assert_eq!(traceback.len(), MAX_TRACEBACK_LINES + 1);
        assert_eq!(traceback[0], "[… 4000 earlier traceback lines omitted]");
        assert_eq!(traceback.last().unwrap(), "4999");
    }

    #[test]
    fn done_carries_the_reply_status() {
        let done = |reply| exec_events(ClientExec::Done { reply });
        assert_eq!(
            done(ExecuteReply::Ok { execution_count: 1 }),
            [ExecEvent::Done {
                status: "ok".into()
            }]
        );
        assert_eq!(
            done(ExecuteReply::Aborted),
            [ExecEvent::Done {
                status: "aborted".into()
            }]
        );
    }
}
