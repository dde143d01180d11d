//! Who a build step runs as and who owns what it copies: names resolved in the image's own
//! `/etc/passwd` and `/etc/group` (as the layers below the step show them), numeric ids as
//! given. Build sandboxes run commands as root or as uid 1000, like every sandbox.

use std::path::{Path, PathBuf};

use husk_proto::User;

/// An OCI image's `User` as a husk default (`root` or `user`).
pub fn image_user(u: &str) -> Option<String> {
    let name = u.split(':').next().unwrap_or("");
    match name {
        "" => None,
        "root" | "0" => Some("root".into()),
        _ => Some("user".into()),
    }
}

/// The uid/gid of an account name in the stack's `/etc/passwd`.
fn lookup(name: &str, lower: &[PathBuf], file: &str) -> Option<(u32, u32)> {
    let p = crate::layers::merged_file(lower, Path::new(file))?;
    let text = std::fs::read_to_string(p).ok()?;
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.first() == Some(&name)).then(|| {
            let id = f.get(2).and_then(|s| s.parse().ok())?;
            let gid = f.get(3).and_then(|s| s.parse().ok()).unwrap_or(id);
            Some((id, gid))
        })?
    })
}

/// A step's user: build sandboxes run commands as sandbox root or as `user` (uid 1000).
pub fn step_user(user: &str, lower: &[PathBuf]) -> Result<User, String> {
    let uid = match user.split(':').next().unwrap_or("") {
        "" | "root" | "0" => 0,
        "user" | "1000" => 1000,
        name => match name.parse::<u32>() {
            Ok(n) => n,
            Err(_) => lookup(name, lower, "etc/passwd").map_or(u32::MAX, |(u, _)| u),
        },
    };
    match uid {
        0 => Ok(User::Root),
        1000 => Ok(User::User),
        u32::MAX => Err(format!("user {user:?} does not exist in the image")),
        other => Err(format!(
            "user {user:?} (uid {other}): build steps run as root or as uid 1000"
        )),
    }
}

/// `COPY --chown` owners: a name from the image or `uid[:gid]`.
pub fn owner_ids(owner: &str, lower: &[PathBuf]) -> Result<(u32, u32), String> {
    let (u, g) = match owner.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (owner, None),
    };
    let uid = match u.parse::<u32>() {
        Ok(n) => (n, n),
        Err(_) => match u {
            "root" => (0, 0),
            _ => lookup(u, lower, "etc/passwd")
                .or_else(|| (u == "user").then_some((1000, 1000)))
                .ok_or_else(|| format!("user {u:?} does not exist in the image"))?,
        },
    };
    let gid = match g {
        None => uid.1,
        Some(g) => match g.parse::<u32>() {
            Ok(n) => n,
            Err(_) => lookup(g, lower, "etc/group")
                .map(|(id, _)| id)
                .or_else(|| (g == "root").then_some(0))
                .ok_or_else(|| format!("group {g:?} does not exist in the image"))?,
        },
    };
    if uid.0 >= 65536 || gid >= 65536 {
        return Err(format!("owner {owner:?}: ids must be below 65536"));
    }
    Ok((uid.0, gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_in_the_images_own_account_files() {
        let dir = std::env::temp_dir().join(format!("husk-accounts-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("etc")).unwrap();
        std::fs::write(
            dir.join("etc/passwd"),
            "root:x:0:0::/root:/bin/sh\nnode:x:1000:1000::/home/node:/bin/sh\napp:x:1001:1001::/:/bin/sh\n",
        )
        .unwrap();
        std::fs::write(dir.join("etc/group"), "root:x:0:\nstaff:x:50:\n").unwrap();
        let stack = vec![dir.clone()];
        assert_eq!(step_user("root", &stack), Ok(User::Root));
        assert_eq!(step_user("node", &stack), Ok(User::User));
        assert_eq!(step_user("1000:1000", &stack), Ok(User::User));
        let err = step_user("app", &stack).unwrap_err();
        assert!(err.contains("uid 1001"), "{err}");
        assert!(step_user("ghost", &stack)
            .unwrap_err()
            .contains("does not exist"));
        assert_eq!(owner_ids("node", &stack), Ok((1000, 1000)));
        assert_eq!(owner_ids("app:staff", &stack), Ok((1001, 50)));
        assert_eq!(owner_ids("7:8", &stack), Ok((7, 8)));
        assert!(owner_ids("70000", &stack).is_err());
        assert!(owner_ids("ghost", &stack).is_err());
        assert_eq!(image_user("0:0").as_deref(), Some("root"));
        assert_eq!(image_user("nobody").as_deref(), Some("user"));
        assert_eq!(image_user(""), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
