//! Connect-JSON requests of the in-sandbox API as the handlers take them: headers checked
//! (`Content-Type`, protocol version, encodings, `Connect-Timeout-Ms`, Basic auth), the body
//! decoded as one of the `process.Process` or `filesystem.Filesystem` messages (unary or as
//! one envelope of a server-streaming call), then converted to the core's call (or process
//! spec) it becomes, and that to the agent request the core would send.
//!
//! Checks: a decoded message encodes to JSON that decodes to the same message; an accepted
//! call's agent request holds no NUL byte, no empty command, no bad environment name, no zero
//! terminal size and no signal but SIGTERM and SIGKILL, and crosses the agent protocol intact.
#![no_main]

use std::fmt::Debug;

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use husk_fuzz::{byte, field, Unstructured};
use husk_core::calls::{fuzzing, Call, Selector, User};
use husk_proto::{Request, ToAgent};
use husk_server::connect::request::{
    decode_message, parse_stream_request, parse_timeout_ms, parse_unary, STREAM_CONTENT_TYPE,
    UNARY_CONTENT_TYPE,
};
use husk_server::connect::{encode_envelope, ConnectError};
use husk_server::envd::auth::{access_token_ok, rpc_user};
use husk_server::envd::filesystem::{
    ListDirRequest, MakeDirRequest, MoveRequest, RemoveRequest, StatRequest, WatchDirRequest,
    WatcherId,
};
use husk_server::envd::process::{
    CloseStdinRequest, ConnectRequest, ListRequest, SendInputRequest, SendSignalRequest,
    StartRequest, StreamInputEvent, StreamInputRequest, UpdateRequest,
};
use husk_server::envd::ToCall;
use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use serde::Serialize;

fn header(h: &mut HeaderMap, name: &'static str, value: &[u8]) {
    if let Ok(v) = HeaderValue::from_bytes(value) {
        h.append(HeaderName::from_static(name), v);
    }
}

/// Parses `body` as `T` the way its handler does, checks the JSON round trip, and converts it.
fn parse<T>(
    headers: &HeaderMap,
    body: &[u8],
    stream: bool,
    convert: impl FnOnce(T) -> Result<Vec<Request>, ConnectError>,
) where
    T: DeserializeOwned + Serialize + PartialEq + Debug,
{
    let parsed = if stream {
        parse_stream_request::<T>(headers, body)
    } else {
        parse_unary::<T>(headers, body)
    };
    let Ok(msg) = parsed else { return };
    let json = serde_json::to_vec(&msg).expect("a decoded message encodes");
    let back: T = decode_message(&json).unwrap_or_else(|e| {
        panic!(
            "{msg:?} encodes as {} which does not decode: {e}",
            String::from_utf8_lossy(&json)
        )
    });
    assert_eq!(
        back,
        msg,
        "JSON round trip via {}",
        String::from_utf8_lossy(&json)
    );
    if let Ok(requests) = convert(msg) {
        for req in requests {
            check_request(req);
        }
    }
}

fn no_nul(what: &str, s: &str) {
    assert!(
        !s.contains('\0'),
        "{what} {s:?} with a NUL reached the agent request"
    );
}

/// What the conversions promise about an agent request built from a client's message.
fn check_request(req: Request) {
    match &req {
        Request::Start(p) => {
            assert!(!p.cmd.is_empty(), "empty command");
            no_nul("command", &p.cmd);
            p.args.iter().for_each(|a| no_nul("argument", a));
            for (k, v) in &p.envs {
                assert!(!k.is_empty() && !k.contains('='), "bad env name {k:?}");
                no_nul("env name", k);
                no_nul("env value", v);
            }
            if let Some(cwd) = &p.cwd {
                assert!(!cwd.is_empty(), "an empty cwd is unset");
                no_nul("cwd", cwd);
            }
            assert!(
                p.tag.as_ref().is_none_or(|t| !t.is_empty()),
                "an empty tag is unset"
            );
            if let Some((cols, rows)) = p.pty {
                assert!(cols >= 1 && rows >= 1, "zero terminal size");
            }
        }
        Request::Resize { cols, rows, .. } => assert!(*cols >= 1 && *rows >= 1),
        Request::Signal { signal, .. } => assert!(matches!(signal, 9 | 15), "signal {signal}"),
        Request::ListDir { path, depth, .. } => {
            no_nul("path", path);
            assert!(*depth >= 1);
        }
        Request::Stat { path, .. }
        | Request::MakeDir { path, .. }
        | Request::Remove { path, .. }
        | Request::WatchStart { path, .. } => no_nul("path", path),
        Request::Move { from, to, .. } => {
            no_nul("source", from);
            no_nul("destination", to);
        }
        _ => {}
    }
    let msg = ToAgent::Call { id: 1, req };
    // A request too large for one frame is refused by the client, not sent.
    if let Ok(frame) = husk_proto::encode(&msg) {
        let back: ToAgent = husk_proto::decode(&frame[4..]).expect("an encoded call decodes");
        assert_eq!(back, msg, "the agent request changed across a frame");
    }
}

/// The agent request a call becomes.
fn one(r: Result<Call, ConnectError>) -> Result<Vec<Request>, ConnectError> {
    r.map(|c| vec![fuzzing::request(c)])
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let kind = byte(&mut u);
    let flags = byte(&mut u);
    let stream = flags & 1 != 0;
    let user = if flags & 2 != 0 {
        User::Root
    } else {
        User::User
    };

    let mut h = HeaderMap::new();
    let expected = if stream {
        STREAM_CONTENT_TYPE
    } else {
        UNARY_CONTENT_TYPE
    };
    match (flags >> 2) & 3 {
        0 => header(&mut h, "content-type", expected.as_bytes()),
        1 => {
            let mut v = expected.as_bytes().to_vec();
            v.extend_from_slice(field(&mut u, 40));
            header(&mut h, "content-type", &v);
        }
        2 => header(&mut h, "content-type", field(&mut u, 60)),
        _ => {}
    }
    if flags & 0x10 != 0 {
        header(&mut h, "connect-protocol-version", field(&mut u, 8));
    }
    if flags & 0x20 != 0 {
        let name = if stream {
            "connect-content-encoding"
        } else {
            "content-encoding"
        };
        header(&mut h, name, field(&mut u, 16));
    }
    if flags & 0x40 != 0 {
        header(&mut h, "connect-timeout-ms", field(&mut u, 16));
    }
    if flags & 0x80 != 0 {
        header(&mut h, "authorization", field(&mut u, 64));
        header(&mut h, "x-access-token", field(&mut u, 16));
    }

    // Headers every call reads before its body.
    let timeout = parse_timeout_ms(&h);
    if let Ok(Some(ms)) = timeout {
        assert!(ms <= 9_999_999_999, "more than 10 digits accepted");
    }
    let user = rpc_user(&h, user).unwrap_or(user);
    let _ = access_token_ok(&h, Some("token"));
    assert!(access_token_ok(&h, None));

    let raw = u.take_rest();
    // A server-streaming body is one envelope; the raw bytes go through as they are too.
    let enveloped;
    let body = if stream && kind & 0x80 == 0 {
        enveloped = encode_envelope(0, raw);
        &enveloped[..]
    } else {
        raw
    };
    let timeout = timeout.ok().flatten();
    match kind % 16 {
        0 => parse(&h, body, stream, |m: StartRequest| {
            m.into_spec(user, timeout)
                .map(|s| vec![Request::Start(fuzzing::start(s))])
        }),
        1 => parse(&h, body, stream, |m: ConnectRequest| {
            one(m.selector().map(Call::FindProcess))
        }),
        2 => parse(&h, body, stream, |m: ListRequest| one(m.into_call(user))),
        3 => parse(&h, body, stream, |m: UpdateRequest| {
            one(m.into_call(user))
        }),
        4 => parse(&h, body, stream, |m: SendInputRequest| {
            one(m.into_call(user))
        }),
        5 => parse(&h, body, stream, |m: SendSignalRequest| {
            one(m.into_call(user))
        }),
        6 => parse(&h, body, stream, |m: CloseStdinRequest| {
            one(m.into_call(user))
        }),
        7 => parse(&h, body, stream, |m: StatRequest| one(m.into_call(user))),
        8 => parse(&h, body, stream, |m: MakeDirRequest| {
            one(m.into_call(user))
        }),
        9 => parse(&h, body, stream, |m: RemoveRequest| {
            one(m.into_call(user))
        }),
        10 => parse(&h, body, stream, |m: MoveRequest| one(m.into_call(user))),
        11 => parse(&h, body, stream, |m: ListDirRequest| {
            one(m.into_call(user))
        }),
        12 => parse(&h, body, stream, |m: WatchDirRequest| {
            m.watched().map(|(path, recursive)| {
                vec![Request::WatchStart {
                    path: path.as_str().to_owned(),
                    recursive,
                    user,
                }]
            })
        }),
        13 => parse(&h, body, stream, |_: WatcherId| Ok(Vec::new())),
        // One message of `Process/StreamInput`'s client stream.
        _ => parse(&h, body, stream, |m: StreamInputRequest| match m.event {
            Some(StreamInputEvent::Start(s)) => one(s.selector().map(Call::FindProcess)),
            Some(StreamInputEvent::Data(d)) => one(d.into_call(Selector::Pid(1))),
            Some(StreamInputEvent::Keepalive) | None => Ok(Vec::new()),
        }),
    }
});
