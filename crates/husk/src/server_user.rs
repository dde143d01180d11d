//! The unprivileged user `husk serve` becomes once its helpers run (`--server-user`): a name
//! from `/etc/passwd` (read directly: a static binary has no NSS), or `UID[:GID]`.

use std::path::Path;

/// The user `husk serve` becomes by default: on every distribution, and owning nothing.
pub const DEFAULT: &str = "nobody";

/// A user to become.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

/// Resolves `spec` against the password file at `passwd`. Root (uid or gid 0) is refused: the
/// point is to give it up.
pub fn resolve(spec: &str, passwd: &Path) -> Result<ServerUser, String> {
    let user = if let Some((uid, gid)) = numeric(spec)? {
        ServerUser {
            name: spec.to_owned(),
            uid,
            gid,
        }
    } else {
        let text = std::fs::read_to_string(passwd)
            .map_err(|e| format!("reading {}: {e}", passwd.display()))?;
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.len() >= 4 && f[0] == spec).then(|| {
                    Some(ServerUser {
                        name: spec.to_owned(),
                        uid: f[2].parse().ok()?,
                        gid: f[3].parse().ok()?,
                    })
                })
            })
            .flatten()
            .ok_or_else(|| {
                format!(
                    "no user {spec:?} in {}: name another with --server-user (a name, or UID[:GID])",
                    passwd.display()
                )
            })?
    };
    if user.uid == 0 || user.gid == 0 {
        return Err(format!(
            "--server-user {spec}: the server does not keep root's ids; name an unprivileged user"
        ));
    }
    Ok(user)
}

/// `UID` or `UID:GID` (the gid is the uid's when not given); `None` for a name.
fn numeric(spec: &str) -> Result<Option<(u32, u32)>, String> {
    let (u, g) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    if !u.bytes().all(|b| b.is_ascii_digit()) || u.is_empty() {
        return Ok(None);
    }
    let bad = || format!("--server-user {spec:?}: expected a name, UID or UID:GID");
    let uid: u32 = u.parse().map_err(|_| bad())?;
    let gid: u32 = match g {
        Some(g) => g.parse().map_err(|_| bad())?,
        None => uid,
    };
    Ok(Some((uid, gid)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers_resolve_and_root_is_refused() {
        let dir = std::env::temp_dir().join(format!("husk-server-user-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let passwd = dir.join("passwd");
        std::fs::write(
            &passwd,
            "root:x:0:0:root:/root:/bin/bash\n# a comment\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\nsvc:x:998:997::/:/bin/false\nbroken:x:abc:1\n",
        )
        .unwrap();
        let r = |s: &str| resolve(s, &passwd);
        assert_eq!(r("nobody").unwrap().uid, 65534);
        assert_eq!((r("svc").unwrap().uid, r("svc").unwrap().gid), (998, 997));
        assert_eq!(
            (r("1234").unwrap().uid, r("1234").unwrap().gid),
            (1234, 1234)
        );
        assert_eq!(r("1234:55").unwrap().gid, 55);
        for bad in ["root", "0", "1000:0", "ghost", "broken", "12:x", ":5"] {
            assert!(r(bad).is_err(), "{bad}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
