//! The build helper's requests (`husk_build::helper::fuzzing`): what the server sends the
//! privileged helper that builds templates, hostile once the server runs unprivileged. Each
//! frame's payload is decoded as the helper does, and a build's query is checked with the
//! helper's own check (the context archive it streams is the `build_context` target's).
//!
//! An E2B build's template (`husk_build::e2b`) is checked as the helper checks it, and
//! planned when it copies nothing; a stored-files request's hash is checked.
//!
//! Checks: a decoded request encodes again to the same bytes; a query the check accepts
//! names a valid template (never `host`) and a spec path of plain relative components; a
//! template's plan has one E2B step number per step, the same the server labels logs with; a
//! hash the helper takes is 64 lower-case hex digits (never a path).
#![no_main]

use husk_build::helper::fuzzing;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some(read) = fuzzing::request(data) else {
        return;
    };
    let again = fuzzing::request(&read.encoded).expect("decodes again");
    assert_eq!(again.encoded, read.encoded, "a request changed when encoded again");
    if let Some(Ok(q)) = &read.query {
        assert!(husk_build::spec::valid_template_name(&q.name), "{:?}", q.name);
        assert_ne!(q.name, "host");
        if let Some(f) = &q.file {
            assert!(
                f.components()
                    .all(|c| matches!(c, std::path::Component::Normal(_))),
                "{f:?}"
            );
        }
    }
    if let Some(e2b) = &read.e2b {
        if let Some((plan, labels)) = &e2b.numbers {
            assert!(e2b.checked.is_ok());
            assert_eq!(plan, labels, "the plan's step numbers differ from the server's");
        }
    }
    if let Some((hash, taken)) = &read.hash {
        if *taken {
            assert_eq!(hash.len(), 64);
            assert!(hash.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        }
    }
});
