//! E2B's `network.rules` in a create or network update (`husk_server::net_rules::parse`), then
//! the placeholders filled (`husk_core::net_rules::NetRules::resolve_with`) as the server does
//! before handing them to the network helper.
//!
//! Checks: what is accepted shows back (`to_json`) as something that reads the same; once
//! filled with any secret values the parser allows, the rules pass the network helper's own
//! check (`HeaderRules::validate`), unless a value brings a byte no header may hold; every
//! host of the filled rules is one the client named.
#![no_main]

use husk_core::net_rules::NetRulesError;
use husk_fuzz::{byte, Unstructured};
use husk_server::net_rules::{parse, to_json};
use libfuzzer_sys::fuzz_target;
use zeroize::Zeroizing;

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    // The value every secret holds: printable, or with a byte a header may not carry.
    let value: &[u8] = match byte(&mut u) % 3 {
        0 => b"Bearer k",
        1 => b"",
        _ => b"a\r\nb",
    };
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(u.take_rest()) else {
        return;
    };
    let Ok(Some(rules)) = parse(Some(&json)) else {
        return;
    };
    let shown = to_json(&rules);
    assert_eq!(
        parse(Some(&shown)).expect("shown rules read back"),
        Some(rules.clone()),
        "rules changed when shown"
    );
    match rules.resolve_with(|_| Ok(Zeroizing::new(value.to_vec()))) {
        Ok(filled) => {
            filled.validate().expect("filled rules pass the helper's check");
            for (h, w) in filled.hosts.iter().zip(&rules.hosts) {
                assert_eq!(h.host, w.host);
            }
        }
        Err(NetRulesError::Rule(_)) => assert!(
            value.contains(&b'\n') && !rules.secret_names().is_empty(),
            "rules the parser took were refused when filled with {value:?}"
        ),
        Err(e) => panic!("filling with a lookup that always answers: {e}"),
    }
});
