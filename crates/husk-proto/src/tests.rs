use super::*;

#[test]
fn a_call_round_trips_through_a_frame() {
    let msg = ToAgent::Call {
        id: 7,
        req: Request::Write {
            handle: 3,
            data: vec![1, 2, 3],
        },
    };
    let frame = encode(&msg).unwrap();
    let len = frame_len(frame[..4].try_into().unwrap()).unwrap();
    assert_eq!(len, frame.len() - 4);
    let back: ToAgent = decode(&frame[4..]).unwrap();
    assert_eq!(back, msg);
}

#[test]
fn byte_payloads_are_encoded_compactly() {
    // serde_bytes: a 1 MiB chunk costs a few bytes of framing, not one tag per byte.
    let frame = encode(&FromAgent::Proc {
        pid: 1,
        event: ProcEvent::Stdout(vec![0xff; CHUNK]),
    })
    .unwrap();
    assert!(frame.len() < CHUNK + 32, "{}", frame.len());
}

#[test]
fn oversize_frames_are_refused_before_allocation() {
    assert!(matches!(
        frame_len(((MAX_FRAME + 1) as u32).to_be_bytes()),
        Err(ProtoError::TooLarge(_))
    ));
    let mut r = io::Cursor::new(u32::MAX.to_be_bytes().to_vec());
    assert!(matches!(read_frame(&mut r), Err(ProtoError::TooLarge(_))));
}

#[test]
fn garbage_payloads_are_errors_not_panics() {
    // An empty payload, an unknown variant tag, a string length past the end.
    for payload in [&b""[..], b"\x09", b"\x01\x01\x00\x08\xff\xff\x03"] {
        assert!(decode::<FromAgent>(payload).is_err(), "{payload:?} decoded");
    }
    // Every prefix of a valid frame fails cleanly.
    let frame = encode(&FromAgent::Reply {
        id: 1,
        result: Ok(Reply::Env(vec![("A".into(), "B".into())])),
    })
    .unwrap();
    for cut in 4..frame.len() - 1 {
        assert!(
            decode::<FromAgent>(&frame[4..cut]).is_err(),
            "prefix {cut} decoded"
        );
    }
}

#[test]
fn read_frame_sees_a_clean_end() {
    let mut r = io::Cursor::new(Vec::new());
    assert!(read_frame(&mut r).unwrap().is_none());
    let mut buf = Vec::new();
    write_msg(&mut buf, &FromAgent::Hello { version: VERSION }).unwrap();
    let mut r = io::Cursor::new(buf);
    let payload = read_frame(&mut r).unwrap().unwrap();
    assert_eq!(
        decode::<FromAgent>(&payload).unwrap(),
        FromAgent::Hello { version: VERSION }
    );
}

#[test]
fn secret_envs_travel_but_never_show_in_debug() {
    let p = StartProc {
        cmd: "sleep".into(),
        args: vec!["30".into()],
        envs: vec![("K".into(), "husk-secret://TOKEN".into())],
        cwd: None,
        user: User::User,
        pty: None,
        tag: None,
        stdin: false,
        timeout_ms: None,
        secret_envs: vec![("K".into(), "s3cr3t-value".into())],
    };
    let msg = ToAgent::Call {
        id: 1,
        req: Request::Start(p.clone()),
    };
    let frame = encode(&msg).unwrap();
    assert_eq!(decode::<ToAgent>(&frame[4..]).unwrap(), msg);
    // A logged request names the secret variable, never its value.
    let shown = format!("{msg:?}");
    assert!(shown.contains("husk-secret://TOKEN"), "{shown}");
    assert!(shown.contains("secret_envs: [\"K\"]"), "{shown}");
    assert!(!shown.contains("s3cr3t-value"), "{shown}");
}
