//! E2B's templates as code (`Template().from_image(...).run_cmd(...).copy(...)` and
//! `Template.build(...)` in E2B's SDKs): the build the SDK asks for (its
//! `POST /v2/templates/{id}/builds/{buildID}` body), checked ([`E2bTemplate::check`], by the
//! server and again by the build helper, for which it is hostile), and turned into a husk
//! [`BuildPlan`] ([`plan`]) with E2B's semantics:
//!
//! - the build runs as `user` in `/home/user` until a `USER`/`WORKDIR` step says otherwise
//!   (Docker's default is root in `/`), and the last user and workdir become the template's
//!   defaults;
//! - `COPY` takes the archive the SDK uploaded for the step's files hash (the files matching
//!   its source, by their paths in the SDK's context); the source's part before any glob is
//!   what is copied: a file to the destination (into it when it ends with `/`), a directory's
//!   contents into it; owned by the current user unless the step names an owner, its mode
//!   set recursively when the step gives one; a relative destination is under the workdir;
//! - `ENV` applies to later steps and to the template's sandboxes; `WORKDIR` creates the
//!   directory as the current user;
//! - a step's `force` rebuilds it and everything after it; the template's `force` rebuilds
//!   everything.
//!
//! husk's sandboxes run as `root` or `user`, so `USER` of any other name is refused. A private
//! registry's login (`fromImageRegistry` of type `registry`) is used for this build's pull only.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::plan::{Base, BuildPlan, Command, Defaults, PlanError, Step, StepKind};

/// Most steps a template may have.
pub const MAX_STEPS: usize = 1000;
/// Longest argument (a command, a path), and longest start or ready command.
pub const MAX_ARG_BYTES: usize = 64 << 10;
/// Most bytes of all arguments of a template together.
pub const MAX_TEMPLATE_BYTES: usize = 1 << 20;
/// Where the files of a `COPY` step are unpacked in the build's context:
/// `e2b-files/<files hash>/`.
pub const FILES_DIR: &str = "e2b-files";

/// E2B's default user and workdir of a template build.
const DEFAULT_USER: &str = "user";

/// A template build as E2B's SDKs send it (`TemplateBuildStartV2`, less the registry
/// credentials, which the server refuses before this is made).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct E2bTemplate {
    pub from_image: Option<String>,
    pub from_template: Option<String>,
    /// Rebuild every step, whatever the cache holds.
    pub force: bool,
    pub steps: Vec<E2bStep>,
    pub start_cmd: Option<String>,
    pub ready_cmd: Option<String>,
    /// The login to `from_image`'s registry (E2B's `fromImageRegistry` of type `registry`).
    pub registry_login: Option<RegistryLogin>,
}

/// A registry's username and password, for one build's pull. Never shown: its `Debug` says
/// only who.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistryLogin {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for RegistryLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RegistryLogin({:?}, <password>)", self.username)
    }
}

/// One step (`TemplateStep`): `RUN [cmd, user?]`, `COPY [src, dest, owner?, mode?]` with
/// its files' hash, `ENV [k1, v1, k2, v2, ...]`, `WORKDIR [path]`, `USER [name]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct E2bStep {
    pub kind: String,
    pub args: Vec<String>,
    pub files_hash: Option<String>,
    /// Rebuild this step and every later one.
    pub force: bool,
}

/// Whether `name` names a template with an optional tag, `name[:tag]` (E2B's tags: a build
/// registered under several names, `Sandbox.create("name:tag")`): the name as husk's, the tag
/// 1 to 63 of ASCII letters, digits, `.`, `_` and `-`, starting with a letter or digit.
pub fn valid_tagged_name(name: &str) -> bool {
    let (base, tag) = match name.split_once(':') {
        Some((b, t)) => (b, Some(t)),
        None => (name, None),
    };
    crate::spec::valid_template_name(base)
        && tag.is_none_or(|t| {
            !t.is_empty()
                && t.len() <= 63
                && t.as_bytes()[0].is_ascii_alphanumeric()
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        })
}

/// The name a template's `tag` is registered under: `name` for E2B's `default`, else
/// `name:tag`.
pub fn tagged(name: &str, tag: &str) -> String {
    if tag == "default" {
        name.to_string()
    } else {
        format!("{name}:{tag}")
    }
}

/// Whether `hash` is a files hash as E2B's SDKs compute them: a lower-case hex SHA-256.
pub fn valid_files_hash(hash: &str) -> bool {
    hash.len() == 64 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn error(step: Option<usize>, message: impl Into<String>) -> PlanError {
    PlanError {
        origin: match step {
            Some(n) => format!("step {n}"),
            None => "template".into(),
        },
        message: message.into(),
    }
}

impl E2bTemplate {
    /// Checks everything that does not need the uploaded files: sizes, step kinds and their
    /// arguments, hashes, users. The message names the step (1-based, as E2B's SDKs count
    /// them: step 0 is the base).
    pub fn check(&self) -> Result<(), PlanError> {
        match (&self.from_image, &self.from_template) {
            (Some(_), Some(_)) => {
                return Err(error(None, "give fromImage or fromTemplate, not both"))
            }
            (None, None) => return Err(error(None, "fromImage or fromTemplate is required")),
            (Some(s), None) | (None, Some(s)) => {
                if s.trim().is_empty() || s.len() > 512 || s.contains(char::is_whitespace) {
                    return Err(error(None, format!("invalid base {s:?}")));
                }
            }
        }
        if let Some(login) = &self.registry_login {
            if self.from_image.is_none() {
                return Err(error(None, "a registry login comes with fromImage"));
            }
            let bad = |s: &str| s.is_empty() || s.len() > 4096 || s.contains(['\0', '\n', '\r']);
            if bad(&login.username) || bad(&login.password) {
                return Err(error(
                    None,
                    "the registry's username and password must be 1 to 4096 bytes, on one line",
                ));
            }
        }
        if self.steps.len() > MAX_STEPS {
            return Err(error(None, format!("more than {MAX_STEPS} steps")));
        }
        let mut total = 0usize;
        for cmd in [&self.start_cmd, &self.ready_cmd].into_iter().flatten() {
            if cmd.len() > MAX_ARG_BYTES || cmd.contains('\0') {
                return Err(error(
                    None,
                    "the start and ready commands must be at most 64 KiB, without NUL bytes",
                ));
            }
            total += cmd.len();
        }
        for (i, step) in self.steps.iter().enumerate() {
            let n = Some(i + 1);
            for a in &step.args {
                if a.len() > MAX_ARG_BYTES || a.contains('\0') {
                    return Err(error(
                        n,
                        "arguments must be at most 64 KiB, without NUL bytes",
                    ));
                }
                total += a.len();
            }
            let args = &step.args;
            let want = |lo: usize, hi: usize, form: &str| {
                if args.len() < lo || args.len() > hi {
                    Err(error(n, format!("{} takes {form}", step.kind)))
                } else {
                    Ok(())
                }
            };
            match step.kind.as_str() {
                "RUN" => {
                    want(1, 2, "a command and an optional user")?;
                    if args[0].trim().is_empty() {
                        return Err(error(n, "RUN: the command is empty"));
                    }
                    if let Some(u) = args.get(1).filter(|u| !u.is_empty()) {
                        check_user(u, n)?;
                    }
                }
                "COPY" => {
                    want(2, 4, "a source, a destination, an optional owner and mode")?;
                    match &step.files_hash {
                        Some(h) if valid_files_hash(h) => {}
                        Some(h) => return Err(error(n, format!("COPY: invalid files hash {h:?}"))),
                        None => return Err(error(n, "COPY needs the files hash of its source")),
                    }
                    relative_source(&args[0]).map_err(|m| error(n, m))?;
                    if args[1].is_empty() {
                        return Err(error(n, "COPY: the destination is empty"));
                    }
                    if let Some(owner) = args.get(2).filter(|o| !o.is_empty()) {
                        let ok = owner.split(':').count() <= 2
                            && owner.split(':').all(|p| {
                                !p.is_empty()
                                    && p.len() <= 32
                                    && p.bytes()
                                        .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
                            });
                        if !ok {
                            return Err(error(
                                n,
                                format!("COPY: owner {owner:?} is not user[:group]"),
                            ));
                        }
                    }
                    if let Some(mode) = args.get(3).filter(|m| !m.is_empty()) {
                        parse_mode(mode).map_err(|m| error(n, m))?;
                    }
                }
                "ENV" => {
                    if args.is_empty() || args.len() % 2 != 0 {
                        return Err(error(n, "ENV takes pairs of a name and a value"));
                    }
                    for name in args.iter().step_by(2) {
                        let ok = name
                            .bytes()
                            .next()
                            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
                            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
                        if !ok {
                            return Err(error(
                                n,
                                format!("ENV: {name:?} is not an environment variable name"),
                            ));
                        }
                    }
                }
                "WORKDIR" => {
                    want(1, 1, "a path")?;
                    if args[0].is_empty() {
                        return Err(error(n, "WORKDIR: the path is empty"));
                    }
                }
                "USER" => {
                    want(1, 2, "a user name")?;
                    check_user(&args[0], n)?;
                }
                other => {
                    return Err(error(
                        n,
                        format!(
                            "unknown step type {other:?} (husk builds RUN, COPY, ENV, WORKDIR and \
                             USER steps)"
                        ),
                    ))
                }
            }
            if step.files_hash.is_some() && step.kind != "COPY" {
                return Err(error(n, "only COPY steps have a files hash"));
            }
        }
        if total > MAX_TEMPLATE_BYTES {
            return Err(error(None, "the template's arguments exceed 1 MiB"));
        }
        Ok(())
    }

    /// The files hashes of its `COPY` steps, each once.
    pub fn files_hashes(&self) -> BTreeSet<String> {
        self.steps
            .iter()
            .filter_map(|s| s.files_hash.clone())
            .collect()
    }
}

/// husk's sandboxes (and build steps) run as root or `user`.
fn check_user(user: &str, n: Option<usize>) -> Result<(), PlanError> {
    match user {
        "root" | "user" => Ok(()),
        other => Err(error(
            n,
            format!("user {other:?}: husk's sandboxes and build steps run as \"root\" or \"user\""),
        )),
    }
}

/// A COPY source: relative, inside the SDK's context (the SDK checks this too).
fn relative_source(src: &str) -> Result<PathBuf, String> {
    let base = glob_base(src);
    let p = Path::new(&base);
    let ok = !src.starts_with('/')
        && p.components().all(|c| {
            matches!(
                c,
                std::path::Component::Normal(_) | std::path::Component::CurDir
            )
        });
    if !ok {
        return Err(format!(
            "COPY: source {src:?} must be a relative path inside the build context"
        ));
    }
    Ok(p.to_path_buf())
}

/// The part of a source before its first component with a glob character (`*?[{\`): the
/// file or directory the SDK's archive holds the matches under.
fn glob_base(src: &str) -> String {
    let mut parts = Vec::new();
    for part in src.split('/') {
        if part.bytes().any(|b| b"*?[{\\".contains(&b)) {
            break;
        }
        if !part.is_empty() && part != "." {
            parts.push(part);
        }
    }
    parts.join("/")
}

/// An octal mode as the SDK pads it (`0755`), permission bits only.
fn parse_mode(mode: &str) -> Result<u32, String> {
    let m = u32::from_str_radix(mode, 8)
        .map_err(|_| format!("COPY: mode {mode:?} is not an octal number"))?;
    if m > 0o777 {
        return Err(format!(
            "COPY: mode {mode:?}: permission bits only (at most 0777; no set-id or sticky bits)"
        ));
    }
    Ok(m)
}

fn home_of(user: &str) -> String {
    if user == "root" {
        "/root".into()
    } else {
        format!("/home/{user}")
    }
}

/// `rel` under `dir` when it is relative, normalized as a Dockerfile's paths are, keeping a
/// trailing `/` (it says "into this directory" to a copy).
fn absolute(dir: &str, rel: &str) -> String {
    let path = crate::dockerfile::join_path(dir, rel);
    if rel.ends_with('/') && path != "/" {
        path + "/"
    } else {
        path
    }
}

fn shell_display(kind: &str, rest: &str) -> String {
    crate::spec::display(&format!("{kind} {rest}"))
}

/// The base a template starts from: `fromTemplate` names a husk template; `fromImage` an OCI
/// image, except E2B's own base images, which mean husk's templates of the same role when
/// they are built here (`local` says which are).
pub fn base_of(t: &E2bTemplate, local: &dyn Fn(&str) -> bool) -> Base {
    if let Some(name) = &t.from_template {
        return Base::Image(name.clone());
    }
    let image = t.from_image.clone().unwrap_or_default();
    let bare = image
        .strip_prefix("docker.io/")
        .unwrap_or(&image)
        .split('@')
        .next()
        .unwrap_or("");
    let repo = match bare.rsplit_once(':') {
        Some((r, tag)) if !tag.contains('/') => r,
        _ => bare,
    };
    let husk = match repo {
        "e2bdev/base" => Some("base"),
        "e2bdev/code-interpreter" => Some("code-interpreter"),
        _ => None,
    };
    match husk {
        Some(name) if local(name) => Base::Image(name.to_string()),
        _ => Base::Image(image),
    }
}

/// Why a build cannot start from template `name`, which is not built here.
pub fn missing_base_template(name: &str) -> String {
    if name == husk_core::template::BASE_TEMPLATE {
        "template \"base\" is not built on this server (its sandboxes run on the host's own \
         file system, which a build cannot start from): build husk's base preset first \
         (husk template build templates/base)"
            .into()
    } else {
        format!("template {name:?} not found (GET /templates lists those a build can start from)")
    }
}

/// The plan of `t` (checked with [`E2bTemplate::check`] first), whose `COPY` steps' files
/// are unpacked in `context` under [`FILES_DIR`]`/<hash>/`; `base` from [`base_of`]. Also
/// gives, for each of the plan's steps, the number of the E2B step it comes from.
pub fn plan(
    t: &E2bTemplate,
    name: &str,
    context: &Path,
    base: Base,
) -> Result<(BuildPlan, Vec<usize>), PlanError> {
    t.check()?;
    let mut steps = Vec::new();
    let mut numbers = Vec::new();
    let mut force_from = None;
    let mut user = DEFAULT_USER.to_string();
    let mut workdir: Option<String> = None;
    let mut env: Vec<(String, String)> = Vec::new();
    let mut user_set = false;
    for (i, s) in t.steps.iter().enumerate() {
        let n = i + 1;
        if s.force && force_from.is_none() {
            force_from = Some(steps.len());
        }
        let cwd = workdir.clone().unwrap_or_else(|| home_of(&user));
        // Build errors read "step {origin} failed ...": the SDK's own step number.
        let origin = n.to_string();
        let run = |display: String, command: Command, as_user: &str| Step {
            origin: origin.clone(),
            display,
            kind: StepKind::Run {
                command,
                user: as_user.to_string(),
                workdir: cwd.clone(),
                env: env.clone(),
            },
        };
        match s.kind.as_str() {
            "RUN" => {
                let as_user = s.args.get(1).filter(|u| !u.is_empty()).unwrap_or(&user);
                steps.push(run(
                    shell_display("RUN", &s.args[0]),
                    Command::Shell(s.args[0].clone()),
                    as_user,
                ));
                numbers.push(n);
            }
            "COPY" => {
                let hash = s.files_hash.as_deref().unwrap_or_default();
                let rel = relative_source(&s.args[0]).map_err(|m| error(Some(n), m))?;
                let source = Path::new(FILES_DIR).join(hash).join(&rel);
                let host = context.join(&source);
                let meta = std::fs::symlink_metadata(&host).map_err(|_| {
                    error(
                        Some(n),
                        format!(
                            "COPY: the files uploaded for {:?} hold nothing at {}",
                            s.args[0],
                            rel.display()
                        ),
                    )
                })?;
                let dest = absolute(&cwd, &s.args[1]);
                let owner = match s.args.get(2).filter(|o| !o.is_empty()) {
                    Some(o) => o.clone(),
                    None => format!("{user}:{user}"),
                };
                // What the copy makes in the image (what a mode applies to): a directory's
                // entries land in `dest`, a file at `dest` (or in it, when it ends with `/`).
                let made = if meta.is_dir() {
                    let dir = dest.trim_end_matches('/').to_string();
                    let mut names: Vec<String> = std::fs::read_dir(&host)
                        .map_err(|e| error(Some(n), format!("COPY: reading the files: {e}")))?
                        .filter_map(|e| e.ok())
                        .map(|e| format!("{dir}/{}", e.file_name().to_string_lossy()))
                        .collect();
                    names.sort();
                    names
                } else if dest.ends_with('/') {
                    let f = host.file_name().unwrap_or_default().to_string_lossy();
                    vec![format!("{dest}{f}")]
                } else {
                    vec![dest.clone()]
                };
                steps.push(Step {
                    origin: origin.clone(),
                    display: shell_display("COPY", &format!("{} {}", s.args[0], s.args[1])),
                    kind: StepKind::Copy {
                        sources: vec![source],
                        dest: dest.clone(),
                        owner: Some(owner),
                        workdir: cwd.clone(),
                    },
                });
                numbers.push(n);
                if let Some(mode) = s.args.get(3).filter(|m| !m.is_empty() && !made.is_empty()) {
                    let mode = format!("{:o}", parse_mode(mode).map_err(|m| error(Some(n), m))?);
                    let argv = if meta.is_dir() || dest.ends_with('/') {
                        let mut argv =
                            vec!["/bin/chmod".to_string(), "-R".into(), mode, "--".into()];
                        argv.extend(made);
                        argv
                    } else {
                        // A file copied to an existing directory went into it (as `cp` does):
                        // the mode is the file's, never the directory's.
                        let base = host.file_name().unwrap_or_default().to_string_lossy();
                        vec![
                            "/bin/sh".into(),
                            "-c".into(),
                            r#"t=$2; if [ -d "$t" ] && [ ! -L "$t" ]; then t="$t/$3"; fi; exec chmod "$1" -- "$t""#.into(),
                            "sh".into(),
                            mode,
                            dest.clone(),
                            base.into_owned(),
                        ]
                    };
                    steps.push(run(
                        shell_display("COPY", &format!("{} (mode {})", s.args[1], s.args[3])),
                        Command::Exec(argv),
                        "root",
                    ));
                    numbers.push(n);
                }
            }
            "ENV" => {
                for pair in s.args.chunks(2) {
                    env.retain(|(k, _)| k != &pair[0]);
                    env.push((pair[0].clone(), pair[1].clone()));
                }
            }
            "WORKDIR" => {
                let dir = absolute(&cwd, &s.args[0]);
                let dir = if dir.len() > 1 {
                    dir.trim_end_matches('/').to_string()
                } else {
                    dir
                };
                steps.push(run(
                    shell_display("WORKDIR", &dir),
                    Command::Exec(vec![
                        "/bin/mkdir".into(),
                        "-p".into(),
                        "--".into(),
                        dir.clone(),
                    ]),
                    &user.clone(),
                ));
                numbers.push(n);
                workdir = Some(dir);
            }
            "USER" => {
                user = s.args[0].clone();
                user_set = true;
            }
            _ => unreachable!("checked"),
        }
    }
    let defaults = Defaults {
        // E2B's default user, whatever the image's (the base's own when not set: a husk
        // template's is already `user` or root).
        user: Some(user).filter(|_| user_set || t.from_image.is_some()),
        workdir,
        env,
        start_cmd: t.start_cmd.clone().filter(|c| !c.trim().is_empty()),
        ready_cmd: t.ready_cmd.clone().filter(|c| !c.trim().is_empty()),
        ready_timeout: None,
        contexts: None,
        warm: None,
    };
    Ok((
        BuildPlan {
            name: Some(name.to_string()),
            context: context.to_path_buf(),
            base,
            steps,
            defaults,
            force_from: if t.force { Some(0) } else { force_from },
        },
        numbers,
    ))
}

/// For each plan step of `t`, the E2B step it comes from, without the files (what the server
/// labels a build's log with; the same as [`plan`]'s but for a copy of an empty directory
/// with a mode, which has nothing to set the mode of and makes one step, not two).
pub fn step_numbers(t: &E2bTemplate) -> Vec<usize> {
    let mut out = Vec::new();
    for (i, s) in t.steps.iter().enumerate() {
        let n = i + 1;
        match s.kind.as_str() {
            "RUN" | "WORKDIR" => out.push(n),
            "COPY" => {
                out.push(n);
                if s.args.get(3).is_some_and(|m| !m.is_empty()) {
                    out.push(n);
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests;
