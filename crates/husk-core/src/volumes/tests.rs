use std::fs;
use std::path::PathBuf;

use super::*;
use crate::secrets::{MasterKeys, MASTER_KEY_FILE};

/// A state directory, removed on drop.
struct State(PathBuf);

impl Drop for State {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn setup(tag: &str) -> (State, Volumes) {
    let mut r = [0u8; 8];
    getrandom::fill(&mut r).unwrap();
    let dir = std::env::temp_dir().join(format!("husk-volumes-{tag}-{}", hex::encode(r)));
    fs::create_dir_all(&dir).unwrap();
    let store = Arc::new(Store::open(&dir).unwrap());
    let keys = MasterKeys::load(&dir.join(MASTER_KEY_FILE)).unwrap();
    let secrets = Arc::new(Secrets::new(store.clone(), keys));
    let workspaces = Arc::new(Workspaces::open(&dir).unwrap());
    (State(dir), Volumes::new(store, secrets, workspaces))
}

#[test]
fn a_volume_is_a_workspace_with_an_id_and_a_token() {
    let (_state, v) = setup("basic");
    let vol = v.create("acme", "data").unwrap();
    assert!(vol.record.id.starts_with(ID_PREFIX), "{}", vol.record.id);
    assert_eq!(vol.record.id.len(), ID_PREFIX.len() + 20);
    assert!(vol.token.starts_with(crate::secrets::VOLUME_TOKEN_PREFIX));
    // The workspace is there, and the token is stable.
    assert_eq!(v.workspaces().list("acme").unwrap()[0].name, "data");
    assert_eq!(v.get("acme", &vol.record.id).unwrap(), vol);
    assert_eq!(v.authorize(&vol.record.id, &vol.token).unwrap(), vol.record);
    // The name is taken.
    let e = v.create("acme", "data").unwrap_err();
    assert!(
        matches!(e, VolumeError::Workspace(WorkspaceError::AlreadyExists(_))),
        "{e:?}"
    );
    // Another team: the same answer as a missing volume, and its own namespace.
    let e = v.get("other", &vol.record.id).unwrap_err();
    assert!(matches!(e, VolumeError::NotFound(_)), "{e:?}");
    assert!(v.list("other").unwrap().is_empty());
    let theirs = v.create("other", "data").unwrap();
    assert_ne!(theirs.record.id, vol.record.id);
    assert_ne!(theirs.token, vol.token);
    let e = v.destroy("other", &vol.record.id).unwrap_err();
    assert!(matches!(e, VolumeError::NotFound(_)), "{e:?}");
    assert_eq!(v.list("acme").unwrap(), vec![vol.record.clone()]);
}

#[test]
fn tokens_open_their_own_volume_only() {
    let (_state, v) = setup("tokens");
    let a = v.create("acme", "a").unwrap();
    let b = v.create("acme", "b").unwrap();
    for (id, token) in [
        (&a.record.id, b.token.as_str()),
        (&b.record.id, a.token.as_str()),
        (&a.record.id, ""),
        (&a.record.id, &a.token[..a.token.len() - 1]),
        (&"vol_doesnotexist0000000".to_string(), a.token.as_str()),
        // Too long to be an id: refused without asking the state helper.
        (&"v".repeat(MAX_ID_LEN + 1), a.token.as_str()),
    ] {
        let e = v.authorize(id, token).unwrap_err();
        assert!(matches!(e, VolumeError::BadToken), "{id} {token}: {e:?}");
    }
    assert_eq!(v.authorize(&b.record.id, &b.token).unwrap().name, "b");
}

#[test]
fn identity_follows_the_workspace() {
    let (_state, v) = setup("identity");
    let first = v.create("acme", "data").unwrap();
    v.destroy("acme", &first.record.id).unwrap();
    assert!(v.workspaces().list("acme").unwrap().is_empty());
    let e = v.get("acme", &first.record.id).unwrap_err();
    assert!(matches!(e, VolumeError::NotFound(_)), "{e:?}");
    // The old token still matches its id (it is derived), but opens nothing.
    let e = v.authorize(&first.record.id, &first.token).unwrap_err();
    assert!(matches!(e, VolumeError::NotFound(_)), "{e:?}");
    // The same name again: a new id, a new token.
    let second = v.create("acme", "data").unwrap();
    assert_ne!(second.record.id, first.record.id);
    assert_ne!(second.token, first.token);

    // A workspace deleted behind the volume API's back (husk's own API, the CLI): the
    // record is stale, and dropped when next used.
    v.workspaces().delete("acme", "data").unwrap();
    let e = v.authorize(&second.record.id, &second.token).unwrap_err();
    assert!(matches!(e, VolumeError::NotFound(_)), "{e:?}");
    assert!(v.list("acme").unwrap().is_empty());

    // A workspace made by husk's own API gets an id when the volume API first lists it,
    // and keeps it.
    v.workspaces().create("acme", "made-by-husk").unwrap();
    let listed = v.list("acme").unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, "made-by-husk");
    assert_eq!(v.list("acme").unwrap(), listed);
    let got = v.get("acme", &listed[0].id).unwrap();
    assert_eq!(
        v.authorize(&listed[0].id, &got.token).unwrap().name,
        "made-by-husk"
    );
    // Forgotten (husk's API deleted and made it again): a new id next time.
    v.forget("acme", "made-by-husk").unwrap();
    let relisted = v.list("acme").unwrap();
    assert_ne!(relisted[0].id, listed[0].id);
}
