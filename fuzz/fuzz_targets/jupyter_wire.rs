//! Jupyter messages as a kernel sends them (`husk_jupyter::wire`): the multipart frames of one
//! ZMTP message, signed with the connection key, decoded and then read as iopub events,
//! `execute_reply` and `kernel_info_reply`, as the agent's kernel client reads them.
//!
//! The input supplies the frames and the key; the target signs the four signed parts itself
//! (with the key, as a kernel would), so the JSON parsers behind the signature check are
//! reached. Checks: a decoded message encodes and decodes to the same message; a signature
//! that is off by one bit is refused before any JSON is read.
#![no_main]

use husk_fuzz::{byte, field, Unstructured};
use husk_jupyter::wire::{
    ExecuteReply, Iopub, KernelInfoReply, Message, Signer, WireError, DELIMITER,
};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// JSON equality, except that floats may differ in their last bits: serde_json's default
/// float parsing is not exact, which is not what this target is about.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
            let (x, y) = (
                x.as_f64().unwrap_or(f64::NAN),
                y.as_f64().unwrap_or(f64::NAN),
            );
            x == y || (x - y).abs() <= x.abs().max(y.abs()) * 1e-15
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|((k, x), (l, y))| k == l && same(x, y))
        }
        _ => a == b,
    }
}

fn same_message(a: &Message, b: &Message) -> bool {
    a.identities == b.identities
        && a.header == b.header
        && a.parent_header == b.parent_header
        && same(
            &Value::Object(a.metadata.clone()),
            &Value::Object(b.metadata.clone()),
        )
        && same(&a.content, &b.content)
        && a.buffers == b.buffers
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let key = field(&mut u, 40).to_vec();
    let signer = Signer::new(&key);
    let mode = byte(&mut u);
    // Routing identities, the delimiter, a signature, the four JSON parts, then buffers.
    let mut frames: Vec<Vec<u8>> = (0..byte(&mut u) % 3)
        .map(|_| field(&mut u, 16).to_vec())
        .collect();
    if mode & 1 == 0 {
        frames.push(DELIMITER.to_vec());
    }
    let signed: Vec<Vec<u8>> = (0..4).map(|_| field(&mut u, 255).to_vec()).collect();
    let signature = if mode & 2 == 0 {
        signer
            .sign(&[&signed[0], &signed[1], &signed[2], &signed[3]])
            .into_bytes()
    } else {
        field(&mut u, 70).to_vec()
    };
    frames.push(signature);
    frames.extend(signed.iter().cloned());
    frames.extend((0..byte(&mut u) % 3).map(|_| field(&mut u, 32).to_vec()));

    let Ok(msg) = Message::decode(frames.clone(), &signer) else {
        return;
    };
    if !key.is_empty() && mode & 1 == 0 {
        // One hex digit of the signature changed: refused, whatever the JSON.
        let at = frames
            .iter()
            .position(|f| f == DELIMITER)
            .expect("delimiter")
            + 1;
        let mut tampered = frames.clone();
        let pos = usize::from(byte(&mut u)) % tampered[at].len().max(1);
        let digit = tampered[at]
            .get(pos)
            .and_then(|&c| char::from(c).to_digit(16));
        if let Some(d) = digit {
            tampered[at][pos] = char::from_digit((d + 1) % 16, 16).expect("a hex digit") as u8;
            let refused = Message::decode(tampered, &signer);
            assert!(
                matches!(refused, Err(WireError::BadSignature)),
                "{refused:?}"
            );
        }
    }
    let again = Message::decode(msg.encode(&signer), &signer).expect("an encoded message decodes");
    assert!(
        same_message(&again, &msg),
        "round trip changed {msg:?} into {again:?}"
    );
    // What the kernel client makes of it.
    let _ = Iopub::parse(&msg);
    let _ = KernelInfoReply::parse(&msg);
    if let Ok(ExecuteReply::Ok { execution_count }) = ExecuteReply::parse(&msg) {
        assert_eq!(
            msg.content["execution_count"].as_u64(),
            Some(execution_count)
        );
    }
});
