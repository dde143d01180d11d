use super::*;

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn setup() -> (Dir, Arc<Store>, Secrets) {
    let mut r = [0u8; 8];
    getrandom::fill(&mut r).unwrap();
    let dir = std::env::temp_dir().join(format!("husk-secrets-{}", hex::encode(r)));
    fs::create_dir_all(&dir).unwrap();
    let store = Arc::new(Store::open(&dir).unwrap());
    let keys = MasterKeys::load(&dir.join(MASTER_KEY_FILE)).unwrap();
    let secrets = Secrets::new(store.clone(), keys);
    (Dir(dir), store, secrets)
}

const VALUE: &[u8] = b"sk-live-0123456789abcdef-plaintext-marker";

#[test]
fn values_round_trip_and_never_reach_the_database_in_clear() {
    let (dir, store, secrets) = setup();
    secrets.set("acme", "OPENAI_API_KEY", VALUE).unwrap();
    assert_eq!(
        secrets.get("acme", "OPENAI_API_KEY").unwrap().as_slice(),
        VALUE
    );
    let listed = secrets.list("acme").unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, "OPENAI_API_KEY");
    drop(secrets);
    drop(store);
    // Neither the database nor its WAL holds the plaintext.
    for entry in fs::read_dir(&dir.0).unwrap() {
        let p = entry.unwrap().path();
        if p.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("husk.db")
        {
            let bytes = fs::read(&p).unwrap();
            assert!(
                !bytes.windows(VALUE.len()).any(|w| w == VALUE),
                "{} holds the plaintext",
                p.display()
            );
        }
    }
    // The key file is the owner's alone.
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(dir.0.join(MASTER_KEY_FILE))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn a_ciphertext_moved_to_another_team_or_name_does_not_open() {
    let (_dir, store, secrets) = setup();
    secrets.set("acme", "TOKEN", VALUE).unwrap();
    let row = store.secret("acme", "TOKEN").unwrap().unwrap();
    for (team, name) in [("other", "TOKEN"), ("acme", "STOLEN")] {
        let mut moved = row.clone();
        moved.team = team.into();
        moved.name = name.into();
        store.put_secret(&moved).unwrap();
        let err = secrets.get(team, name).unwrap_err();
        assert!(matches!(err, SecretError::Undecryptable(_)), "{err}");
        // The error names the secret, never the value.
        assert!(!err.to_string().contains("sk-live"), "{err}");
    }
    // Another team neither lists nor reads acme's secret.
    assert!(secrets.list("nobody").unwrap().is_empty());
    assert!(matches!(
        secrets.get("nobody", "TOKEN"),
        Err(SecretError::NotFound(_))
    ));
}

#[test]
fn rotation_keeps_every_secret_and_the_old_key_no_longer_opens_them() {
    let (dir, store, secrets) = setup();
    secrets.set("acme", "A", b"alpha").unwrap();
    secrets.set("beta", "B", b"bravo").unwrap();
    let old_key = fs::read_to_string(dir.0.join(MASTER_KEY_FILE)).unwrap();
    assert_eq!(secrets.rotate().unwrap(), 2);
    let new_key = fs::read_to_string(dir.0.join(MASTER_KEY_FILE)).unwrap();
    assert_ne!(old_key, new_key);
    assert!(!dir.0.join("master.key.new").exists());
    assert_eq!(secrets.get("acme", "A").unwrap().as_slice(), b"alpha");
    // A fresh load (a restarted server) opens them with the new key file.
    let reloaded = Secrets::new(
        store.clone(),
        MasterKeys::load(&dir.0.join(MASTER_KEY_FILE)).unwrap(),
    );
    assert_eq!(reloaded.get("beta", "B").unwrap().as_slice(), b"bravo");
    // With the old key only, nothing opens.
    let old = dir.0.join("old.key");
    fs::write(&old, old_key).unwrap();
    let stale = Secrets::new(store, MasterKeys::load(&old).unwrap());
    assert!(matches!(
        stale.get("acme", "A"),
        Err(SecretError::Undecryptable(_))
    ));
}

#[test]
fn an_interrupted_rotation_loses_nothing() {
    let (dir, store, secrets) = setup();
    secrets.set("acme", "A", b"alpha").unwrap();
    // A rotation that died after writing the new key and resealing, before the rename.
    let path = dir.0.join(MASTER_KEY_FILE);
    let pending = create_key(&pending_path(&path)).unwrap();
    let row = store.secret("acme", "A").unwrap().unwrap();
    let plain = open(&MasterKeys::load(&path).unwrap(), &row).unwrap();
    let (nonce, ciphertext) = seal(&pending, "acme", "A", &plain).unwrap();
    store
        .reseal_secrets(&[SealedRow {
            key_id: pending.id.clone(),
            nonce,
            ciphertext,
            ..row
        }])
        .unwrap();
    let after_crash = Secrets::new(store.clone(), MasterKeys::load(&path).unwrap());
    assert_eq!(after_crash.get("acme", "A").unwrap().as_slice(), b"alpha");
    // Rotating again finishes with the pending key.
    after_crash.rotate().unwrap();
    assert_eq!(after_crash.get("acme", "A").unwrap().as_slice(), b"alpha");
    assert!(!pending_path(&path).exists());
}

#[test]
fn bad_names_and_values_are_refused_clearly() {
    let (_dir, _store, secrets) = setup();
    let long = "X".repeat(129);
    for name in [
        "",
        "1ABC",
        "has/slash",
        "{brace}",
        "white space",
        long.as_str(),
    ] {
        assert!(
            matches!(
                secrets.set("acme", name, b"v"),
                Err(SecretError::InvalidName(_))
            ),
            "{name:?}"
        );
    }
    assert!(matches!(
        secrets.set("acme", "BIG", &vec![b'x'; MAX_SECRET_BYTES + 1]),
        Err(SecretError::TooLarge { .. })
    ));
    assert!(matches!(
        secrets.set("acme", "NUL", b"a\0b"),
        Err(SecretError::Nul(_))
    ));
    assert!(matches!(
        secrets.remove("acme", "NONE"),
        Err(SecretError::NotFound(_))
    ));
    assert!(secrets.set("Bad Team", "A", b"v").is_err());
}

#[test]
fn a_server_running_during_a_cli_rotation_picks_up_the_new_key() {
    let (dir, store, server) = setup();
    server.set("acme", "A", b"alpha").unwrap();
    // The CLI, another process with its own view of the same files, rotates.
    let cli = Secrets::new(
        store.clone(),
        MasterKeys::load(&dir.0.join(MASTER_KEY_FILE)).unwrap(),
    );
    cli.rotate().unwrap();
    cli.set("acme", "B", b"bravo").unwrap();
    // The server still holds the old key; the rows name the new one: it reloads.
    assert_eq!(server.get("acme", "A").unwrap().as_slice(), b"alpha");
    assert_eq!(server.get("acme", "B").unwrap().as_slice(), b"bravo");
}

#[test]
fn references_are_resolved_apart_from_the_request_environment() {
    let (_dir, _store, secrets) = setup();
    secrets.set("acme", "TOKEN", b"t0ken-value").unwrap();
    secrets.set("acme", "OTHER", b"other-value").unwrap();
    let sandbox_env = vec![
        (
            "FROM_SANDBOX".to_string(),
            "husk-secret://OTHER".to_string(),
        ),
        ("PLAIN".to_string(), "x".to_string()),
    ];
    let mut req = vec![("API".to_string(), "husk-secret://TOKEN".to_string())];
    let inj = secrets.inject("acme", &sandbox_env, &mut req).unwrap();
    // The request keeps the reference (a process list shows it); the values are apart.
    assert_eq!(
        req,
        vec![("API".to_string(), "husk-secret://TOKEN".to_string())]
    );
    let mut env = inj.env.clone();
    env.sort();
    assert_eq!(
        env,
        vec![
            ("API".to_string(), "t0ken-value".to_string()),
            ("FROM_SANDBOX".to_string(), "other-value".to_string()),
        ]
    );
    assert_eq!(inj.names, vec!["OTHER".to_string(), "TOKEN".to_string()]);
    assert_eq!(inj.redact.len(), 2);
    // A request value overrides the sandbox's reference; HUSK_REDACT=0 turns masking off and
    // is not passed on.
    let mut req = vec![
        ("FROM_SANDBOX".to_string(), "mine".to_string()),
        (REDACT_ENV.to_string(), "0".to_string()),
        ("API".to_string(), "husk-secret://TOKEN".to_string()),
    ];
    let inj = secrets.inject("acme", &sandbox_env, &mut req).unwrap();
    assert!(inj.redact.is_empty());
    assert!(req.contains(&("FROM_SANDBOX".to_string(), "mine".to_string())));
    assert!(!req.iter().any(|(k, _)| k == REDACT_ENV));
    assert_eq!(
        inj.env,
        vec![("API".to_string(), "t0ken-value".to_string())]
    );
    assert!(!req.iter().any(|(_, v)| v.contains("t0ken")));
    // Unknown secrets and other teams' secrets are not found.
    let mut req = vec![("X".to_string(), "husk-secret://NOPE".to_string())];
    assert!(matches!(
        secrets.inject("acme", &[], &mut req),
        Err(SecretError::NotFound(_))
    ));
    let mut req = vec![("X".to_string(), "husk-secret://TOKEN".to_string())];
    assert!(matches!(
        secrets.inject("other", &[], &mut req),
        Err(SecretError::NotFound(_))
    ));
    assert!(secrets.check_refs("acme", &sandbox_env).is_ok());
    assert!(secrets.check_refs("other", &sandbox_env).is_err());
}

#[test]
fn e2b_writes_count_versions_keep_metadata_and_find_by_id_or_name() {
    let (_dir, _store, secrets) = setup();
    let meta: Metadata = [("owner".to_string(), "ci".to_string())].into();
    secrets
        .write(
            "acme",
            "openai-api-key",
            b"v1",
            PutMode::Create,
            Some(&meta),
        )
        .unwrap();
    let info = secrets.info("acme", "openai-api-key").unwrap();
    assert_eq!((info.version, &info.metadata), (1, &meta));
    assert!(info.id.starts_with(ID_PREFIX) && info.id.len() == ID_PREFIX.len() + 24);
    // Made twice: refused, the value untouched.
    let err = secrets
        .write("acme", "openai-api-key", b"v2", PutMode::Create, None)
        .unwrap_err();
    assert!(matches!(err, SecretError::Exists(_)), "{err}");
    assert_eq!(
        secrets.get("acme", "openai-api-key").unwrap().as_slice(),
        b"v1"
    );
    // A new value: a new version; metadata kept unless given.
    secrets
        .write("acme", "openai-api-key", b"v2", PutMode::Update, None)
        .unwrap();
    let info = secrets.info("acme", "openai-api-key").unwrap();
    assert_eq!((info.version, &info.metadata), (2, &meta));
    secrets
        .write(
            "acme",
            "openai-api-key",
            b"v3",
            PutMode::Update,
            Some(&Metadata::new()),
        )
        .unwrap();
    let info = secrets.info("acme", "openai-api-key").unwrap();
    assert_eq!((info.version, info.metadata.len()), (3, 0));
    assert_eq!(
        secrets.get("acme", "openai-api-key").unwrap().as_slice(),
        b"v3"
    );
    secrets.set("acme", "openai-api-key", b"v4").unwrap();
    assert_eq!(secrets.info("acme", "openai-api-key").unwrap().version, 4);
    // An update of a missing one makes nothing.
    let err = secrets
        .write("acme", "missing", b"x", PutMode::Update, None)
        .unwrap_err();
    assert!(matches!(err, SecretError::NotFound(_)), "{err}");
    assert!(secrets.info("acme", "missing").is_err());
    // Found by id, by name, by a name in other case; never another team's.
    let id = info.id.clone();
    assert_eq!(secrets.find("acme", &id).unwrap().name, "openai-api-key");
    assert_eq!(
        secrets.find("acme", "OPENAI-API-KEY").unwrap().name,
        "openai-api-key"
    );
    assert!(matches!(
        secrets.find("other", &id),
        Err(SecretError::NotFound(_))
    ));
    assert_ne!(secret_id("other", "openai-api-key"), id);
    // Metadata bounds.
    let too_many: Metadata = (0..33)
        .map(|i| (format!("k{i}"), "v".to_string()))
        .collect();
    let long_value: Metadata = [("k".to_string(), "v".repeat(1025))].into();
    let empty_key: Metadata = [(String::new(), "v".to_string())].into();
    let total: Metadata = (0..9)
        .map(|i| (format!("k{i}"), "v".repeat(1000)))
        .collect();
    for bad in [too_many, long_value, empty_key, total] {
        let err = secrets
            .write("acme", "meta", b"x", PutMode::Create, Some(&bad))
            .unwrap_err();
        assert!(matches!(err, SecretError::BadMetadata { .. }), "{err}");
    }
}

#[test]
fn names_and_env_names() {
    for good in ["OPENAI_API_KEY", "openai-api-key", "a.b", "_x", "x1"] {
        validate_name(good).unwrap();
    }
    for bad in [
        "",
        "1x",
        "-x",
        "a b",
        "a{b}",
        "sec_0123",
        "a/b",
        &"x".repeat(129),
    ] {
        assert!(validate_name(bad).is_err(), "{bad:?}");
    }
    validate_env_name("OPENAI_API_KEY").unwrap();
    for bad in ["openai-api-key", "a.b"] {
        let err = validate_env_name(bad).unwrap_err();
        assert!(err.to_string().contains("variable"), "{err}");
    }
}
