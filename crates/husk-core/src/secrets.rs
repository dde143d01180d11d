//! Secrets: values a team stores once and names in runs, commands and sandboxes, never
//! returned by any API.
//!
//! **At rest** every value is sealed with XChaCha20-Poly1305 under a 256-bit master key that
//! lives outside the database: a 0600 file (`STATE_DIR/master.key` unless configured
//! otherwise) created on first use. A fresh random 192-bit nonce per seal; the team and the
//! name are the associated data, so a ciphertext copied to another team's or name's row does
//! not open. Each row names the key it is sealed with (`key_id`, a hash of the key), which is
//! what makes rotation safe.
//!
//! **Rotation** ([`Secrets::rotate`]) writes the new key beside the old one
//! (`master.key.new`), reseals every row in one transaction, then renames the new key into
//! place. A crash at any point leaves every row openable: [`MasterKeys::load`] reads both
//! files, and each row says which key it needs.
//!
//! Plaintext is held in `Zeroizing` buffers and never logged; errors name the secret, never
//! its value.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use zeroize::Zeroizing;

use crate::store::{PutMode, SealedRow, Store, StoreError};

/// The master key file's name in the state directory.
pub const MASTER_KEY_FILE: &str = "master.key";

/// Longest secret value (they travel in environment variables).
pub const MAX_SECRET_BYTES: usize = 64 << 10;

/// Longest secret name.
pub const MAX_NAME_LEN: usize = 128;

/// Errors of the secrets service.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("secret '{0}' not found")]
    NotFound(String),
    #[error("invalid secret name {0:?}: use 1-128 characters of A-Z, a-z, 0-9, '_', '-' and '.', starting with a letter or '_'")]
    InvalidName(String),
    #[error("secret '{0}' already exists")]
    Exists(String),
    /// The customer's metadata of E2B's secret API, out of its bounds.
    #[error("secret '{name}': {reason}")]
    BadMetadata { name: String, reason: String },
    #[error("secret '{name}' is too large ({size} bytes; at most {MAX_SECRET_BYTES})")]
    TooLarge { name: String, size: usize },
    #[error("secret '{0}' contains a NUL byte (values become environment variables)")]
    Nul(String),
    /// The row does not open: another master key, or a row moved or tampered with.
    #[error("secret '{0}' cannot be decrypted: wrong master key, or the stored value was moved or altered")]
    Undecryptable(String),
    #[error("secret '{0}' is not valid UTF-8, so it cannot be an environment variable")]
    NotUtf8(String),
    #[error("master key {path}: {message}")]
    MasterKey { path: PathBuf, message: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A secret as listed: never its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretInfo {
    pub name: String,
    /// `sec_` and 24 hex digits, derived from the team and the name ([`secret_id`]).
    pub id: String,
    /// 1 when made, one more with each new value.
    pub version: u64,
    pub metadata: Metadata,
    pub created_at: OffsetDateTime,
    pub updated_at: OffsetDateTime,
}

/// The customer's metadata of a secret (E2B's secret API): strings by strings.
pub type Metadata = std::collections::BTreeMap<String, String>;

/// Bounds of a secret's metadata, as E2B's: entries, key bytes, value bytes, bytes in all.
pub const METADATA_ENTRIES: usize = 32;
pub const METADATA_KEY_BYTES: usize = 128;
pub const METADATA_VALUE_BYTES: usize = 1024;
pub const METADATA_BYTES: usize = 8192;

/// How secret ids start (E2B reserves the prefix: no name starts with it).
pub const ID_PREFIX: &str = "sec_";

/// The id of `team`'s secret `name`: stable for the name, and saying nothing of the value.
pub fn secret_id(team: &str, name: &str) -> String {
    let digest =
        Sha256::digest([b"husk-secret-id\0", team.as_bytes(), b"\0", name.as_bytes()].concat());
    format!("{ID_PREFIX}{}", hex::encode(&digest[..12]))
}

/// Checks a secret's metadata against [`METADATA_ENTRIES`] and the byte bounds.
pub fn check_metadata(name: &str, m: &Metadata) -> Result<(), SecretError> {
    let bad = |reason: String| {
        Err(SecretError::BadMetadata {
            name: name.to_string(),
            reason,
        })
    };
    if m.len() > METADATA_ENTRIES {
        return bad(format!(
            "metadata has {} entries (at most {METADATA_ENTRIES})",
            m.len()
        ));
    }
    let mut total = 0;
    for (k, v) in m {
        if k.is_empty() || k.len() > METADATA_KEY_BYTES {
            return bad(format!(
                "metadata keys have 1 to {METADATA_KEY_BYTES} bytes"
            ));
        }
        if v.len() > METADATA_VALUE_BYTES {
            return bad(format!(
                "metadata value of {k:?} is longer than {METADATA_VALUE_BYTES} bytes"
            ));
        }
        total += k.len() + v.len();
    }
    if total > METADATA_BYTES {
        return bad(format!(
            "metadata holds {total} bytes (at most {METADATA_BYTES})"
        ));
    }
    Ok(())
}

fn info_of(r: SealedRow) -> SecretInfo {
    SecretInfo {
        id: secret_id(&r.team, &r.name),
        version: r.version,
        metadata: r.metadata.unwrap_or_default(),
        name: r.name,
        created_at: r.created_at,
        updated_at: r.updated_at,
    }
}

/// One master key and its id.
struct MasterKey {
    id: String,
    key: Zeroizing<[u8; 32]>,
}

impl MasterKey {
    fn from_bytes(key: [u8; 32]) -> MasterKey {
        let digest = Sha256::digest([b"husk-master-key-id\0".as_slice(), &key].concat());
        MasterKey {
            id: hex::encode(&digest[..8]),
            key: Zeroizing::new(key),
        }
    }

    fn cipher(&self) -> XChaCha20Poly1305 {
        XChaCha20Poly1305::new(self.key.as_ref().into())
    }

    /// HMAC-SHA256 of volume `id` under a key of its own derived from this one (so that the
    /// token never says anything about the key that seals secrets), base64url.
    fn volume_token(&self, id: &str) -> String {
        use base64::Engine;
        use hmac::Mac;
        let mut input = Zeroizing::new(b"husk-volume-token-key\0".to_vec());
        input.extend_from_slice(self.key.as_ref());
        let derived: Zeroizing<[u8; 32]> = Zeroizing::new(Sha256::digest(&*input).into());
        let mut mac = <hmac::Hmac<Sha256> as Mac>::new_from_slice(derived.as_ref())
            .expect("HMAC takes a key of any length");
        mac.update(b"husk-volume-v1\0");
        mac.update(id.as_bytes());
        let tag = mac.finalize().into_bytes();
        format!(
            "{VOLUME_TOKEN_PREFIX}{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(tag)
        )
    }
}

/// How volume content tokens start (telling them apart from API keys in logs and configs).
pub const VOLUME_TOKEN_PREFIX: &str = "husk_vt_";

/// The master keys: the current one (sealing), and a pending one from an interrupted rotation.
pub struct MasterKeys {
    path: PathBuf,
    current: MasterKey,
    pending: Option<MasterKey>,
}

fn read_key(path: &Path) -> Result<Option<MasterKey>, SecretError> {
    let err = |message: String| SecretError::MasterKey {
        path: path.to_path_buf(),
        message,
    };
    let text = match fs::read_to_string(path) {
        Ok(t) => Zeroizing::new(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(err(e.to_string())),
    };
    let bytes = Zeroizing::new(
        hex::decode(text.trim()).map_err(|_| err("not 64 hexadecimal digits".into()))?,
    );
    let key: [u8; 32] = bytes
        .as_slice()
        .try_into()
        .map_err(|_| err("not 64 hexadecimal digits".into()))?;
    Ok(Some(MasterKey::from_bytes(key)))
}

/// Writes a new random key to `path` (mode 0600, created exclusively).
fn create_key(path: &Path) -> Result<MasterKey, SecretError> {
    let err = |message: String| SecretError::MasterKey {
        path: path.to_path_buf(),
        message,
    };
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).map_err(|e| err(format!("random: {e}")))?;
    let text = Zeroizing::new(format!("{}\n", hex::encode(key)));
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| err(e.to_string()))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| err(e.to_string()))?;
    Ok(MasterKey::from_bytes(key))
}

impl MasterKeys {
    /// Loads the key at `path`, creating it on first use.
    pub fn load(path: &Path) -> Result<MasterKeys, SecretError> {
        let current = match read_key(path)? {
            Some(k) => k,
            None => match create_key(path) {
                Ok(k) => k,
                // Another process created it first.
                Err(_) if path.exists() => {
                    read_key(path)?.ok_or_else(|| SecretError::MasterKey {
                        path: path.to_path_buf(),
                        message: "vanished".into(),
                    })?
                }
                Err(e) => return Err(e),
            },
        };
        let pending = read_key(&pending_path(path))?;
        Ok(MasterKeys {
            path: path.to_path_buf(),
            current,
            pending,
        })
    }

    fn for_id(&self, id: &str) -> Option<&MasterKey> {
        std::iter::once(&self.current)
            .chain(self.pending.as_ref())
            .find(|k| k.id == id)
    }
}

fn pending_path(path: &Path) -> PathBuf {
    path.with_extension("key.new")
}

/// The associated data binding a sealed value to its team and name.
fn aad(team: &str, name: &str) -> Vec<u8> {
    [b"husk-secret-v1\0", team.as_bytes(), b"\0", name.as_bytes()].concat()
}

fn seal(
    key: &MasterKey,
    team: &str,
    name: &str,
    value: &[u8],
) -> Result<(Vec<u8>, Vec<u8>), SecretError> {
    let mut nonce = [0u8; 24];
    getrandom::fill(&mut nonce).map_err(|e| SecretError::MasterKey {
        path: PathBuf::new(),
        message: format!("random: {e}"),
    })?;
    let aad = aad(team, name);
    let ct = key
        .cipher()
        .encrypt(
            XNonce::from_slice(&nonce),
            Payload {
                msg: value,
                aad: &aad,
            },
        )
        .map_err(|_| SecretError::Undecryptable(name.to_string()))?;
    Ok((nonce.to_vec(), ct))
}

fn open(keys: &MasterKeys, row: &SealedRow) -> Result<Zeroizing<Vec<u8>>, SecretError> {
    let bad = || SecretError::Undecryptable(row.name.clone());
    let key = keys.for_id(&row.key_id).ok_or_else(bad)?;
    if row.nonce.len() != 24 {
        return Err(bad());
    }
    let aad = aad(&row.team, &row.name);
    key.cipher()
        .decrypt(
            XNonce::from_slice(&row.nonce),
            Payload {
                msg: &row.ciphertext,
                aad: &aad,
            },
        )
        .map(Zeroizing::new)
        .map_err(|_| bad())
}

/// Checks a secret's name: 1-128 of `[A-Za-z0-9_.-]`, starting with a letter or `_` (so
/// never E2B's `sec_` ids, which start with a letter too but are refused by prefix).
pub fn validate_name(name: &str) -> Result<(), SecretError> {
    let ok = (1..=MAX_NAME_LEN).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && !name.starts_with(ID_PREFIX)
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(SecretError::InvalidName(name.to_string()))
    }
}

/// Checks that a secret's name can also be an environment variable's (runs put a secret in
/// the variable of its own name): an identifier of `[A-Za-z0-9_]`, not starting with a digit.
pub fn validate_env_name(name: &str) -> Result<(), SecretError> {
    validate_name(name)?;
    if name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        Ok(())
    } else {
        Err(SecretError::InvalidName(format!(
            "{name} (a secret a run names becomes the variable of that name: use A-Z, a-z, 0-9 and '_')"
        )))
    }
}

/// The secrets of every team.
pub struct Secrets {
    store: Arc<Store>,
    /// Reloaded from its files when a row names a key it does not hold (the CLI rotated the
    /// key while a server was running). `None` in the server, whose store is the state
    /// helper's: sealing and opening happen there, where the key is.
    keys: Option<std::sync::RwLock<MasterKeys>>,
}

impl Secrets {
    pub fn new(store: Arc<Store>, keys: MasterKeys) -> Secrets {
        Secrets {
            store,
            keys: Some(std::sync::RwLock::new(keys)),
        }
    }

    /// The secrets of the state helper's store (see [`crate::store::remote`]): this process
    /// never holds the master key.
    pub fn remote(store: Arc<Store>) -> Secrets {
        Secrets { store, keys: None }
    }

    /// The master keys, or, without them, the state helper that holds them.
    fn holder(&self) -> Result<Holder<'_>, SecretError> {
        match (&self.keys, self.store.as_remote()) {
            (Some(k), _) => Ok(Holder::Keys(k)),
            (None, Some(r)) => Ok(Holder::Helper(r)),
            (None, None) => Err(SecretError::MasterKey {
                path: Default::default(),
                message: "no master key is loaded".into(),
            }),
        }
    }

    fn keys(&self) -> Result<std::sync::RwLockReadGuard<'_, MasterKeys>, SecretError> {
        match self.holder()? {
            Holder::Keys(k) => Ok(k.read().unwrap_or_else(|p| p.into_inner())),
            Holder::Helper(_) => Err(SecretError::MasterKey {
                path: Default::default(),
                message: "the master key is the state helper's; rotate it with `husk secret rotate` on the host".into(),
            }),
        }
    }

    /// Opens `row`, reloading the key files once if it was sealed with a key not loaded.
    fn open_row(&self, row: &SealedRow) -> Result<Zeroizing<Vec<u8>>, SecretError> {
        if self.keys()?.for_id(&row.key_id).is_none() {
            let path = self.keys()?.path.clone();
            let fresh = MasterKeys::load(&path)?;
            if let Some(k) = &self.keys {
                *k.write().unwrap_or_else(|p| p.into_inner()) = fresh;
            }
        }
        open(&*self.keys()?, row)
    }

    /// Stores (or replaces) `team`'s secret `name`.
    pub fn set(&self, team: &str, name: &str, value: &[u8]) -> Result<(), SecretError> {
        self.write(team, name, value, PutMode::Upsert, None)
    }

    /// Stores `team`'s secret `name` as `mode` says ([`SecretError::Exists`] for a `Create`
    /// of a name taken, [`SecretError::NotFound`] for an `Update` of a missing one), replacing
    /// its metadata when `metadata` is given. A new value is a new version.
    pub fn write(
        &self,
        team: &str,
        name: &str,
        value: &[u8],
        mode: PutMode,
        metadata: Option<&Metadata>,
    ) -> Result<(), SecretError> {
        if let Holder::Helper(r) = self.holder()? {
            return r.seal_secret(team, name, value, mode, metadata);
        }
        validate_name(name)?;
        crate::store::validate_team(team)?;
        if value.len() > MAX_SECRET_BYTES {
            return Err(SecretError::TooLarge {
                name: name.to_string(),
                size: value.len(),
            });
        }
        if value.contains(&0) {
            return Err(SecretError::Nul(name.to_string()));
        }
        if let Some(m) = metadata {
            check_metadata(name, m)?;
        }
        let keys = self.keys()?;
        let (nonce, ciphertext) = seal(&keys.current, team, name, value)?;
        let now = OffsetDateTime::now_utc();
        let written = self.store.write_secret(
            &SealedRow {
                team: team.to_string(),
                name: name.to_string(),
                key_id: keys.current.id.clone(),
                nonce,
                ciphertext,
                created_at: now,
                updated_at: now,
                version: 1,
                metadata: metadata.cloned(),
            },
            mode,
        )?;
        match (written, mode) {
            (true, _) | (false, PutMode::Upsert) => Ok(()),
            (false, PutMode::Create) => Err(SecretError::Exists(name.to_string())),
            (false, PutMode::Update) => Err(SecretError::NotFound(name.to_string())),
        }
    }

    /// `team`'s secret `name`: its id, version, metadata and dates, never its value.
    pub fn info(&self, team: &str, name: &str) -> Result<SecretInfo, SecretError> {
        self.store
            .secret(team, name)?
            .map(info_of)
            .ok_or_else(|| SecretError::NotFound(name.to_string()))
    }

    /// `team`'s secret named by its id (`sec_...`) or its name (as given, else lower-cased:
    /// E2B lower-cases names).
    pub fn find(&self, team: &str, id_or_name: &str) -> Result<SecretInfo, SecretError> {
        if id_or_name.starts_with(ID_PREFIX) {
            return self
                .list(team)?
                .into_iter()
                .find(|s| s.id == id_or_name)
                .ok_or_else(|| SecretError::NotFound(id_or_name.to_string()));
        }
        match self.info(team, id_or_name) {
            Err(SecretError::NotFound(_)) if id_or_name.bytes().any(|b| b.is_ascii_uppercase()) => {
                self.info(team, &id_or_name.to_ascii_lowercase())
            }
            other => other,
        }
    }

    /// `team`'s secret `name`, opened (only for injecting it into a process).
    pub fn get(&self, team: &str, name: &str) -> Result<Zeroizing<Vec<u8>>, SecretError> {
        if let Holder::Helper(r) = self.holder()? {
            return r.open_secret(team, name);
        }
        let row = self
            .store
            .secret(team, name)?
            .ok_or_else(|| SecretError::NotFound(name.to_string()))?;
        self.open_row(&row)
    }

    /// `team`'s secrets: names and dates, never values.
    pub fn list(&self, team: &str) -> Result<Vec<SecretInfo>, SecretError> {
        Ok(self
            .store
            .secrets(Some(team))?
            .into_iter()
            .map(info_of)
            .collect())
    }

    /// Deletes `team`'s secret `name`.
    pub fn remove(&self, team: &str, name: &str) -> Result<(), SecretError> {
        if self.store.delete_secret(team, name)? {
            Ok(())
        } else {
            Err(SecretError::NotFound(name.to_string()))
        }
    }

    /// The content token of volume `id` (E2B's volume API: `Authorization: Bearer <token>`
    /// on `/volumecontent/{id}/...`). Derived from the id under the current master key, so it
    /// is never stored; rotating the master key gives every volume a new token.
    pub fn volume_token(&self, id: &str) -> Result<String, SecretError> {
        if let Holder::Helper(r) = self.holder()? {
            return r.volume_token(id);
        }
        Ok(self.keys()?.current.volume_token(id))
    }

    /// Replaces the master key: a new key, every secret resealed under it in one transaction,
    /// then the new key file renamed over the old one. Returns how many were resealed.
    pub fn rotate(&self) -> Result<usize, SecretError> {
        let path = self.keys()?.path.clone();
        let pending = pending_path(&path);
        let new = match read_key(&pending)? {
            // An interrupted rotation: finish it with its key.
            Some(k) => k,
            None => create_key(&pending)?,
        };
        let mut rows = self.store.secrets(None)?;
        for row in &mut rows {
            let plain = self.open_row(row)?;
            let (nonce, ct) = seal(&new, &row.team, &row.name, &plain)?;
            row.key_id = new.id.clone();
            row.nonce = nonce;
            row.ciphertext = ct;
        }
        self.store.reseal_secrets(&rows)?;
        fs::rename(&pending, &path).map_err(|e| SecretError::MasterKey {
            path: path.clone(),
            message: e.to_string(),
        })?;
        if let Some(k) = &self.keys {
            *k.write().unwrap_or_else(|p| p.into_inner()) = MasterKeys {
                path,
                current: new,
                pending: None,
            };
        }
        Ok(rows.len())
    }
}

/// Who seals and opens: this process, with the keys, or the state helper.
enum Holder<'a> {
    Keys(&'a std::sync::RwLock<MasterKeys>),
    Helper(&'a Arc<crate::store::remote::RemoteStore>),
}

/// An environment value of this form names a secret of the caller's team; it is replaced by
/// the secret's value when the process is started (`husk-secret://OPENAI_API_KEY`).
pub const SECRET_PREFIX: &str = "husk-secret://";

/// A request environment variable that turns output redaction off for that process
/// (`HUSK_REDACT=0`); it is not passed on to the process.
pub const REDACT_ENV: &str = "HUSK_REDACT";

/// The secrets a process start injects, resolved.
pub struct Injection {
    /// Names of the secrets used (for the audit record).
    pub names: Vec<String>,
    /// Their values, for redacting the process's output (empty: redaction is off).
    pub redact: Vec<Zeroizing<Vec<u8>>>,
    /// The resolved variables (name, secret value), for that one process's environment only:
    /// they go into [`husk_proto::StartProc::secret_envs`], never into the request's `envs`
    /// (which the process list reports).
    pub env: Vec<(String, String)>,
}

impl Secrets {
    /// Resolves the secrets a process start names: every variable of the effective
    /// environment (`sandbox_env` with `request_env` over it) whose value is
    /// `husk-secret://NAME` gets `team`'s secret NAME, returned in [`Injection::env`] (so the
    /// value reaches that one process, not the sandbox's environment). `request_env` keeps the
    /// `husk-secret://NAME` references, never a value: it is what a process list shows.
    /// `HUSK_REDACT=0` in `request_env` turns output redaction off (and is removed from it).
    pub fn inject(
        &self,
        team: &str,
        sandbox_env: &[(String, String)],
        request_env: &mut Vec<(String, String)>,
    ) -> Result<Injection, SecretError> {
        let mut redact_on = true;
        request_env.retain(|(k, v)| {
            if k == REDACT_ENV {
                redact_on = !matches!(v.as_str(), "0" | "false" | "off" | "no");
                false
            } else {
                true
            }
        });
        let mut wanted: Vec<(String, String)> = Vec::new();
        for (k, v) in sandbox_env {
            if !request_env.iter().any(|(rk, _)| rk == k) {
                if let Some(name) = v.strip_prefix(SECRET_PREFIX) {
                    wanted.push((k.clone(), name.to_string()));
                }
            }
        }
        for (k, v) in request_env.iter() {
            if let Some(name) = v.strip_prefix(SECRET_PREFIX) {
                wanted.push((k.clone(), name.to_string()));
            }
        }
        let mut inj = Injection {
            names: Vec::new(),
            redact: Vec::new(),
            env: Vec::new(),
        };
        for (var, name) in wanted {
            let value = self.get(team, &name)?;
            // Checked in place: a failed conversion leaves no unwiped copy behind.
            let text =
                std::str::from_utf8(&value).map_err(|_| SecretError::NotUtf8(name.clone()))?;
            inj.env.retain(|(k, _)| *k != var);
            inj.env.push((var, text.to_owned()));
            if !inj.names.contains(&name) {
                inj.names.push(name);
            }
            if redact_on {
                inj.redact.push(value);
            }
        }
        Ok(inj)
    }

    /// Checks that every `husk-secret://NAME` value in `env` names an existing secret of
    /// `team` (a sandbox's create request fails early instead of each command later).
    pub fn check_refs(&self, team: &str, env: &[(String, String)]) -> Result<(), SecretError> {
        for (_, v) in env {
            if let Some(name) = v.strip_prefix(SECRET_PREFIX) {
                if self.store.secret(team, name)?.is_none() {
                    return Err(SecretError::NotFound(name.to_string()));
                }
            }
        }
        Ok(())
    }

    /// Records that `names` went into a process (`command`) of `sandbox`.
    pub fn record_use(&self, team: &str, sandbox: &str, command: &str, names: &[String]) {
        let at = OffsetDateTime::now_utc();
        for name in names {
            let _ = self.store.record_secret_use(&crate::store::SecretUse {
                at,
                team: team.to_string(),
                secret: name.clone(),
                sandbox: sandbox.to_string(),
                command: command.to_string(),
            });
        }
    }

    /// `team`'s recent uses of secrets (newest first).
    pub fn uses(
        &self,
        team: &str,
        limit: u32,
    ) -> Result<Vec<crate::store::SecretUse>, SecretError> {
        Ok(self.store.secret_uses(team, limit)?)
    }
}

pub mod redact;

#[cfg(test)]
mod tests;
