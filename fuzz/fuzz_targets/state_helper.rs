//! The state helper's requests (`husk_core::store::remote::fuzzing`): what the server sends the
//! privileged helper that holds the database and the master key, hostile once the server runs
//! unprivileged. Each frame's payload is decoded and handled against a database in memory and
//! a master key of the target's own (in a scratch directory), as the helper does.
//!
//! Checks: a decoded request encodes again to the same bytes; the reply always fits one frame;
//! a secret is only ever opened for the team and name it was sealed for (a value sealed as
//! team `t`, name `N` is never returned for another pair).
#![no_main]

use std::sync::{Arc, OnceLock};

use husk_core::secrets::{MasterKeys, Secrets};
use husk_core::store::remote::{fuzzing, StateReply};
use husk_core::store::Store;
use libfuzzer_sys::fuzz_target;

struct World {
    store: Arc<Store>,
    secrets: Secrets,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("husk-fuzz-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        let store = Arc::new(Store::open_in_memory().expect("a database in memory"));
        let keys = MasterKeys::load(&dir.join("master.key")).expect("a master key");
        let secrets = Secrets::new(store.clone(), keys);
        // One secret the fuzzer may try to reach under other names.
        secrets.set("t", "N", b"the-value").expect("a secret");
        World { store, secrets }
    })
}

fuzz_target!(|data: &[u8]| {
    let w = world();
    let Some((encoded, reply)) = fuzzing::request(data, &w.store, &w.secrets) else {
        return;
    };
    let (again, _) = fuzzing::request(&encoded, &w.store, &w.secrets).expect("decodes again");
    assert_eq!(again, encoded, "a request changed when encoded again");
    let size = postcard::to_stdvec(&reply).expect("a reply encodes").len();
    assert!(size <= husk_runtime::helper::MAX_MESSAGE, "a reply of {size} bytes");
    if let StateReply::Opened(v) = &reply {
        if v.as_slice() == b"the-value" {
            let req: husk_core::store::remote::StateRequest =
                postcard::from_bytes(&encoded).expect("decodes");
            assert!(
                matches!(&req, husk_core::store::remote::StateRequest::OpenSecret { team, name }
                    if team == "t" && name == "N"),
                "the secret was opened for {req:?}"
            );
        }
    }
});
