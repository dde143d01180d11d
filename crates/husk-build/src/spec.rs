//! husk's own template spec, a TOML file (`husk.toml`), parsed into a [`BuildPlan`]; and
//! [`load`], which reads a spec or a Dockerfile from a path.
//!
//! ```toml
//! name = "python"
//! [base]
//! debian = "bookworm"
//! [packages]
//! apt = ["python3", "python3-pip"]
//! pip = ["numpy==2.1"]
//! [[run]]
//! cmd = "echo hi > /etc/motd"
//! [sandbox]
//! env = { LANG = "C.UTF-8" }
//! ```
//!
//! Unknown keys are errors (a typo must not silently do nothing), and every error names the
//! key it is about, since users read these messages verbatim.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::plan::{Base, BuildPlan, Command, Defaults, PlanError, Step, StepKind};

/// mmdebstrap's variants.
const VARIANTS: &[&str] = &[
    "extract",
    "custom",
    "essential",
    "apt",
    "required",
    "minbase",
    "buildd",
    "important",
    "debootstrap",
    "standard",
];

/// Longest `display` of a step, in characters, before it is cut with `…`.
const DISPLAY_MAX: usize = 100;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    name: Option<String>,
    base: Option<RawBase>,
    #[serde(default)]
    packages: RawPackages,
    #[serde(default)]
    files: Vec<RawFile>,
    #[serde(default)]
    run: Vec<RawRun>,
    #[serde(default)]
    sandbox: RawSandbox,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBase {
    debian: Option<String>,
    variant: Option<String>,
    image: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawPackages {
    #[serde(default)]
    apt: Vec<String>,
    #[serde(default)]
    pip: Vec<String>,
    #[serde(default)]
    npm: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    src: String,
    dest: String,
    owner: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRun {
    cmd: String,
    user: Option<String>,
    workdir: Option<String>,
    // A BTreeMap: toml tables need not keep their order, and the plan (a cache key) must be
    // deterministic, so env maps are sorted by key.
    #[serde(default)]
    env: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawSandbox {
    user: Option<String>,
    workdir: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    start_cmd: Option<String>,
    ready_cmd: Option<String>,
    ready_timeout: Option<i64>,
    /// Languages whose code contexts start with every sandbox (`["python"]`).
    contexts: Option<Vec<String>>,
    /// Sandboxes of the template a server keeps booted ahead of demand (a warm pool).
    warm: Option<i64>,
}

/// Largest spec or Dockerfile read (they also arrive in contexts uploaded over HTTP).
pub const MAX_SPEC_BYTES: u64 = 1 << 20;

/// The file's text, refusing one larger than [`MAX_SPEC_BYTES`] without reading it all.
fn read_bounded(file: &Path) -> Result<String, PlanError> {
    use std::io::Read;
    let name = file.display().to_string();
    let mut text = String::new();
    std::fs::File::open(file)
        .and_then(|f| f.take(MAX_SPEC_BYTES + 1).read_to_string(&mut text))
        .map_err(|e| error(name.clone(), format!("cannot read the file: {e}")))?;
    if text.len() as u64 > MAX_SPEC_BYTES {
        return Err(error(
            name,
            format!("the file is larger than {MAX_SPEC_BYTES} bytes"),
        ));
    }
    Ok(text)
}

/// Reads the spec or Dockerfile at `path` into a plan. A directory is searched for `husk.toml`,
/// then `e2b.Dockerfile`, then `Dockerfile`. A file whose name ends in `.toml` is a spec,
/// anything else a Dockerfile; `build_args` (`--build-arg NAME=VALUE`) only apply to the latter.
pub fn load(path: &Path, build_args: &[(String, String)]) -> Result<BuildPlan, PlanError> {
    let file = if path.is_dir() {
        ["husk.toml", "e2b.Dockerfile", "Dockerfile"]
            .iter()
            .map(|name| path.join(name))
            .find(|candidate| candidate.is_file())
            .ok_or_else(|| {
                error(
                    path.display().to_string(),
                    "no husk.toml, e2b.Dockerfile or Dockerfile in this directory",
                )
            })?
    } else {
        path.to_path_buf()
    };
    let text = read_bounded(&file)?;
    let is_spec = file.file_name().is_some_and(|name| {
        name.to_string_lossy()
            .to_ascii_lowercase()
            .ends_with(".toml")
    });
    if is_spec {
        if let Some((name, _)) = build_args.first() {
            return Err(error(
                format!("--build-arg {name}"),
                format!(
                    "--build-arg only applies to Dockerfiles, and {} is a husk spec",
                    file_label(&file)
                ),
            ));
        }
        parse_spec(&text, &file)
    } else {
        crate::dockerfile::parse_dockerfile(&text, &file, build_args)
    }
}

/// Whether `name` can name a template: `[a-z0-9][a-z0-9._-]*`, 1 to 63 characters.
pub fn valid_template_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes
            .iter()
            .all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

/// Parses the TOML spec `text`, read from `file` (whose directory is the build context).
pub fn parse_spec(text: &str, file: &Path) -> Result<BuildPlan, PlanError> {
    let label = file_label(file);
    let raw: RawSpec = toml::from_str(text).map_err(|e| toml_error(&label, text, &e))?;
    let at = |key: &str, message: String| error(format!("{label}: {key}"), message);
    let context = context_dir(file);

    if let Some(name) = &raw.name {
        if !valid_template_name(name) {
            return Err(at(
                "name",
                format!(
                    "{name:?} is not a valid template name: use 1 to 63 of a-z, 0-9, '.', '_', \
                     '-', starting with a letter or digit"
                ),
            ));
        }
    }

    let sandbox = sandbox_defaults(&raw.sandbox, &at)?;
    let base = base(raw.base.as_ref(), &raw.packages.apt, &at)?;
    let mut steps = Vec::new();

    // Package steps run as root in `/`, with the sandbox env like every other run step (as a
    // Dockerfile's ENV would be); their own variables win, since the tools depend on them.
    let package_step = |key: &str, command: String, display: String, env: &[(&str, &str)]| {
        let own = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        Step {
            origin: format!("{label}: packages.{key}"),
            display,
            kind: StepKind::Run {
                command: Command::Shell(command),
                user: "root".into(),
                workdir: "/".into(),
                env: merge_env(sandbox.env.iter().cloned().chain(own)),
            },
        }
    };
    if matches!(base, Base::Image(_)) && !raw.packages.apt.is_empty() {
        let pkgs = dedup(&raw.packages.apt);
        steps.push(package_step(
            "apt",
            format!(
                "apt-get update && apt-get install -y --no-install-recommends {} && rm -rf \
                 /var/lib/apt/lists/*",
                quote_all(&pkgs)
            ),
            format!("apt-get install {}", pkgs.join(" ")),
            &[("DEBIAN_FRONTEND", "noninteractive")],
        ));
    }
    if !raw.packages.pip.is_empty() {
        check_tool_packages(&raw.packages.pip, "pip", &at)?;
        let pkgs = dedup(&raw.packages.pip);
        steps.push(package_step(
            "pip",
            format!("python3 -m pip install --no-cache-dir {}", quote_all(&pkgs)),
            format!("pip install {}", pkgs.join(" ")),
            &[
                ("PIP_BREAK_SYSTEM_PACKAGES", "1"),
                ("PIP_ROOT_USER_ACTION", "ignore"),
                ("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
            ],
        ));
    }
    if !raw.packages.npm.is_empty() {
        check_tool_packages(&raw.packages.npm, "npm", &at)?;
        let pkgs = dedup(&raw.packages.npm);
        // npm's cache (the packages' tarballs) and its log go to a directory removed after
        // the install, as pip's --no-cache-dir: the layer keeps only what was installed.
        steps.push(package_step(
            "npm",
            format!(
                "npm install -g --no-fund --no-audit --cache {NPM_CACHE} {} && rm -rf {NPM_CACHE}",
                quote_all(&pkgs)
            ),
            format!("npm install -g {}", pkgs.join(" ")),
            &[],
        ));
    }

    for (i, file) in raw.files.iter().enumerate() {
        let key = format!("[[files]] #{}", i + 1);
        let at = |message: String| at(&key, message);
        check_source(&context, &file.src).map_err(|m| at(format!("src: {m}")))?;
        if !file.dest.starts_with('/') || file.dest.contains('\0') {
            return Err(at(format!(
                "dest {:?} must be an absolute path in the image",
                file.dest
            )));
        }
        if let Some(owner) = &file.owner {
            if !valid_user(owner) {
                return Err(at(format!(
                    "owner {owner:?} is not a user name or uid[:gid]"
                )));
            }
        }
        steps.push(Step {
            origin: format!("{label}: {key}"),
            display: display(&format!("COPY {} {}", file.src, file.dest)),
            kind: StepKind::Copy {
                sources: vec![PathBuf::from(&file.src)],
                dest: file.dest.clone(),
                owner: file.owner.clone(),
                workdir: "/".into(),
            },
        });
    }

    for (i, run) in raw.run.iter().enumerate() {
        let key = format!("[[run]] #{}", i + 1);
        let at = |message: String| at(&key, message);
        if run.cmd.trim().is_empty() {
            return Err(at("cmd is empty".into()));
        }
        if run.cmd.contains('\0') {
            return Err(at("cmd contains a NUL character".into()));
        }
        let user = run.user.clone().unwrap_or_else(|| "root".into());
        if !valid_user(&user) {
            return Err(at(format!("user {user:?} is not a user name or uid[:gid]")));
        }
        let workdir = run.workdir.clone().unwrap_or_else(|| "/".into());
        if !workdir.starts_with('/') || workdir.contains('\0') {
            return Err(at(format!("workdir {workdir:?} must be an absolute path")));
        }
        let own = check_env(&run.env).map_err(at)?;
        steps.push(Step {
            origin: format!("{label}: {key}"),
            display: display(&format!("RUN {}", run.cmd)),
            kind: StepKind::Run {
                command: Command::Shell(run.cmd.clone()),
                user,
                workdir,
                env: merge_env(sandbox.env.iter().cloned().chain(own)),
            },
        });
    }

    Ok(BuildPlan {
        name: raw.name,
        context,
        base,
        steps,
        defaults: sandbox,
        force_from: None,
    })
}

/// The base, with the apt packages if mmdebstrap installs them.
fn base(
    raw: Option<&RawBase>,
    apt: &[String],
    at: &impl Fn(&str, String) -> PlanError,
) -> Result<Base, PlanError> {
    let Some(raw) = raw else {
        return Err(at(
            "base",
            "missing [base] table: say debian = \"bookworm\" (a Debian suite) or image = \
             \"<OCI reference or template name>\""
                .into(),
        ));
    };
    for pkg in apt {
        if !valid_apt_package(pkg) {
            return Err(at(
                "packages.apt",
                format!(
                    "{pkg:?} is not a Debian package name (a-z, 0-9, '+', '.', '-', starting \
                     with a letter or digit, optionally =version)"
                ),
            ));
        }
    }
    match (&raw.debian, &raw.image) {
        (Some(_), Some(_)) => Err(at("base", "set either debian or image, not both".into())),
        (None, None) => Err(at(
            "base",
            "set one of debian = \"<suite>\" (e.g. \"bookworm\") or image = \"<OCI reference \
             or template name>\""
                .into(),
        )),
        (Some(suite), None) => {
            let valid_suite = suite.starts_with(|c: char| c.is_ascii_lowercase())
                && suite
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
            if !valid_suite {
                return Err(at(
                    "base.debian",
                    format!("{suite:?} is not a Debian suite name (like \"bookworm\")"),
                ));
            }
            let variant = raw.variant.clone().unwrap_or_else(|| "minbase".into());
            if !VARIANTS.contains(&variant.as_str()) {
                return Err(at(
                    "base.variant",
                    format!(
                        "{variant:?} is not an mmdebstrap variant (one of {})",
                        VARIANTS.join(", ")
                    ),
                ));
            }
            let mut packages = apt.to_vec();
            packages.sort();
            packages.dedup();
            Ok(Base::Debian {
                suite: suite.clone(),
                variant,
                packages,
            })
        }
        (None, Some(image)) => {
            if raw.variant.is_some() {
                return Err(at(
                    "base.variant",
                    "variant only applies to a debian base, not to image".into(),
                ));
            }
            let valid = !image.is_empty()
                && !image.starts_with('-')
                && !image.chars().any(|c| c.is_whitespace() || c.is_control());
            if !valid {
                return Err(at(
                    "base.image",
                    format!("{image:?} is not an image reference or template name"),
                ));
            }
            Ok(Base::Image(image.clone()))
        }
    }
}

fn sandbox_defaults(
    raw: &RawSandbox,
    at: &impl Fn(&str, String) -> PlanError,
) -> Result<Defaults, PlanError> {
    if let Some(user) = &raw.user {
        if user != "user" && user != "root" {
            return Err(at(
                "sandbox.user",
                format!("{user:?} is not a sandbox user: use \"user\" or \"root\""),
            ));
        }
    }
    if let Some(workdir) = &raw.workdir {
        if !workdir.starts_with('/') || workdir.contains('\0') {
            return Err(at(
                "sandbox.workdir",
                format!("{workdir:?} must be an absolute path"),
            ));
        }
    }
    let env = check_env(&raw.env).map_err(|m| at("sandbox.env", m))?;
    for (key, cmd) in [("start_cmd", &raw.start_cmd), ("ready_cmd", &raw.ready_cmd)] {
        if let Some(cmd) = cmd {
            if cmd.trim().is_empty() || cmd.contains('\0') {
                return Err(at(
                    &format!("sandbox.{key}"),
                    "must be a non-empty command without NUL characters".into(),
                ));
            }
        }
    }
    if raw.ready_cmd.is_some() && raw.start_cmd.is_none() {
        return Err(at(
            "sandbox.ready_cmd",
            "ready_cmd checks that start_cmd is ready, so it needs a start_cmd".into(),
        ));
    }
    let ready_timeout = match raw.ready_timeout {
        None => None,
        Some(_) if raw.ready_cmd.is_none() => {
            return Err(at(
                "sandbox.ready_timeout",
                "ready_timeout bounds ready_cmd, so it needs a ready_cmd".into(),
            ));
        }
        Some(secs @ 1..=3600) => Some(Duration::from_secs(secs.unsigned_abs())),
        Some(secs) => {
            return Err(at(
                "sandbox.ready_timeout",
                format!("{secs} is out of range: give seconds, from 1 to 3600"),
            ));
        }
    };
    let contexts = match &raw.contexts {
        None => None,
        Some(list) => {
            if list.len() > 8 {
                return Err(at(
                    "sandbox.contexts",
                    format!(
                        "{} languages; at most 8 contexts start with a sandbox",
                        list.len()
                    ),
                ));
            }
            let mut out: Vec<String> = Vec::new();
            for lang in list {
                let ok = !lang.is_empty()
                    && lang.len() <= 32
                    && lang
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
                if !ok {
                    return Err(at(
                        "sandbox.contexts",
                        format!("{lang:?} is not a language name (letters, digits, - and _)"),
                    ));
                }
                let lang = lang.to_ascii_lowercase();
                if !out.contains(&lang) {
                    out.push(lang);
                }
            }
            Some(out)
        }
    };
    let warm = match raw.warm {
        None => None,
        Some(n @ 0..=1000) => Some(n as u32),
        Some(n) => {
            return Err(at(
                "sandbox.warm",
                format!("{n} is out of range: give a count of warm sandboxes, from 0 to 1000"),
            ));
        }
    };
    Ok(Defaults {
        warm,
        user: raw.user.clone(),
        workdir: raw.workdir.clone(),
        env,
        start_cmd: raw.start_cmd.clone(),
        ready_cmd: raw.ready_cmd.clone(),
        ready_timeout,
        contexts,
    })
}

/// Where the npm step's cache lives during the install (removed after it).
const NPM_CACHE: &str = "/tmp/.husk-npm-cache";

/// Checks pip or npm package specs. They are single-quoted in the command anyway; this
/// rejects what is surely a mistake (several in one string, an option) or an attempt at the
/// shell.
fn check_tool_packages(
    pkgs: &[String],
    tool: &str,
    at: &impl Fn(&str, String) -> PlanError,
) -> Result<(), PlanError> {
    for pkg in pkgs {
        let problem = if pkg.is_empty() {
            Some("an empty package name")
        } else if pkg.chars().any(|c| c.is_whitespace() || c.is_control()) {
            Some("whitespace: give one package per string")
        } else if pkg.starts_with('-') {
            Some("a leading '-': options are not allowed")
        } else if pkg.chars().any(|c| ";&|$`\\'\"(){}".contains(c)) {
            Some("shell metacharacters")
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(at(
                &format!("packages.{tool}"),
                format!("{pkg:?} is not a valid {tool} package: it has {problem}"),
            ));
        }
    }
    Ok(())
}

fn valid_apt_package(spec: &str) -> bool {
    let (name, version) = match spec.split_once('=') {
        Some((name, version)) => (name, Some(version)),
        None => (spec, None),
    };
    let name_ok = name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+.-".contains(c));
    let version_ok = version.is_none_or(|v| {
        v.starts_with(|c: char| c.is_ascii_digit())
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || ".+~:-".contains(c))
    });
    name_ok && version_ok
}

/// Deduplicates, keeping the first of each.
fn dedup(items: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(items.len());
    for item in items {
        if !out.contains(item) {
            out.push(item.clone());
        }
    }
    out
}

fn quote_all(items: &[String]) -> String {
    items
        .iter()
        .map(|s| shell_quote(s))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `s` single-quoted for `/bin/sh`.
pub(crate) fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Validates an env table, sorted by key.
fn check_env(env: &BTreeMap<String, String>) -> Result<Vec<(String, String)>, String> {
    for (name, value) in env {
        check_env_var(name, value)?;
    }
    Ok(env.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

pub(crate) fn check_env_var(name: &str, value: &str) -> Result<(), String> {
    let valid = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(format!(
            "{name:?} is not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)"
        ));
    }
    if value.contains('\0') {
        return Err(format!("the value of {name} contains a NUL character"));
    }
    Ok(())
}

/// Merges variables, in order: a later value replaces an earlier one of the same name, which
/// keeps its place.
pub(crate) fn merge_env(vars: impl IntoIterator<Item = (String, String)>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (name, value) in vars {
        match out.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = value,
            None => out.push((name, value)),
        }
    }
    out
}

/// A user name (`user`, `www-data`), `uid`, or either with `:group`/`:gid`.
pub(crate) fn valid_user(user: &str) -> bool {
    let part = |s: &str| {
        let numeric = !s.is_empty() && s.len() <= 10 && s.bytes().all(|b| b.is_ascii_digit());
        let name = s.len() <= 32
            && s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
        numeric || name
    };
    match user.split_once(':') {
        Some((user, group)) => part(user) && part(group),
        None => part(user),
    }
}

/// Checks a copy source: relative to the context, without `..`, existing. The message says
/// what is wrong with it.
pub(crate) fn check_source(context: &Path, src: &str) -> Result<(), String> {
    if src.is_empty() {
        return Err("the source path is empty".into());
    }
    let path = Path::new(src);
    if path.has_root() {
        return Err(format!(
            "{src:?} is absolute: sources are relative to the build context {}",
            context.display()
        ));
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(format!(
            "{src:?} contains '..': sources must stay inside the build context {}",
            context.display()
        ));
    }
    if std::fs::symlink_metadata(context.join(path)).is_err() {
        return Err(format!(
            "{src:?} does not exist in the build context {}",
            context.display()
        ));
    }
    Ok(())
}

/// One line for progress output: whitespace runs collapsed, cut at [`DISPLAY_MAX`].
pub(crate) fn display(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() <= DISPLAY_MAX {
        line
    } else {
        let mut cut: String = line.chars().take(DISPLAY_MAX - 1).collect();
        cut.push('…');
        cut
    }
}

/// The name errors use for `file`: its file name.
pub(crate) fn file_label(file: &Path) -> String {
    match file.file_name() {
        Some(name) => name.to_string_lossy().into_owned(),
        None => file.display().to_string(),
    }
}

/// The build context of `file`: its directory, canonical if it exists.
pub(crate) fn context_dir(file: &Path) -> PathBuf {
    let dir = match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf())
}

pub(crate) fn error(origin: impl Into<String>, message: impl Into<String>) -> PlanError {
    PlanError {
        origin: origin.into(),
        message: message.into(),
    }
}

/// Rewords toml's error for people: which key, where, and for unknown keys which ones are
/// allowed.
fn toml_error(label: &str, text: &str, e: &toml::de::Error) -> PlanError {
    let offset = e.span().map(|span| span.start);
    let place = offset.map(|offset| {
        let before = &text[..offset.min(text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
        format!("line {line}, column {column}")
    });
    // The key path is only in the Display of an error without its input ("in `run.env.A`").
    let mut bare = e.clone();
    bare.set_input(None);
    let bare = bare.to_string();
    let keys = bare
        .lines()
        .find_map(|l| l.strip_prefix("in `")?.strip_suffix('`').map(str::to_owned));
    let table = match keys.as_deref() {
        None => "the top level".to_owned(),
        Some(array @ ("run" | "files")) => {
            // Headers up to the error's line, which may be the header itself.
            let nth = offset.map_or(0, |offset| {
                let offset = offset.min(text.len());
                let end = text[offset..].find('\n').map_or(text.len(), |n| offset + n);
                count_array_headers(&text[..end], array)
            });
            if nth > 0 {
                format!("[[{array}]] #{nth}")
            } else {
                format!("[[{array}]]")
            }
        }
        Some(table) => format!("[{table}]"),
    };
    let message = e.message();
    let field = |prefix: &str| {
        let rest = message.strip_prefix(prefix)?;
        let (name, rest) = rest.split_once('`')?;
        Some((name.to_owned(), rest.to_owned()))
    };
    let mut out = if let Some((name, rest)) = field("unknown field `") {
        let allowed = rest
            .trim_start_matches(", expected ")
            .trim_start_matches("one of ")
            .replace('`', "");
        format!("unknown key '{name}' in {table} (allowed: {allowed})")
    } else if let Some((name, _)) = field("missing field `") {
        format!("missing key '{name}' in {table}")
    } else {
        match &keys {
            Some(keys) => format!("{keys}: {message}"),
            None => message.to_owned(),
        }
    };
    if let Some(place) = place {
        out.push_str(&format!(" (at {place})"));
    }
    error(label, out)
}

/// How many `[[name]]` headers `text` has.
fn count_array_headers(text: &str, name: &str) -> usize {
    text.lines()
        .filter(|line| {
            let line = line.trim();
            line.strip_prefix("[[")
                .and_then(|l| l.split_once("]]"))
                .is_some_and(|(inner, _)| inner.trim() == name)
        })
        .count()
}
