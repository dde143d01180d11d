//! Dockerfiles, the subset husk builds: one stage of `FROM`, `RUN`, `COPY`, `ADD`, `ENV`,
//! `ARG`, `WORKDIR` and `USER`, parsed into a [`BuildPlan`].
//!
//! Lines, continuations, comments, quoting and `$VAR` expansion follow Docker (BuildKit), so a
//! Dockerfile means the same here as there. What husk cannot do the same way (multi-stage
//! builds, `CMD`, mounts, heredocs, `ADD` of URLs and archives, ...) is an error naming the
//! line rather than something silently dropped.

use std::path::{Path, PathBuf};

use crate::plan::{Base, BuildPlan, Command, Defaults, PlanError, Step, StepKind};
use crate::spec::{
    check_env_var, check_source, context_dir, display, error, file_label, merge_env, valid_user,
};

const SUPPORTED: &str = "supported: FROM, RUN, COPY, ADD, ENV, ARG, WORKDIR, USER";

/// Instructions Docker has and husk does not.
const UNSUPPORTED: &[&str] = &[
    "CMD",
    "ENTRYPOINT",
    "EXPOSE",
    "LABEL",
    "VOLUME",
    "HEALTHCHECK",
    "ONBUILD",
    "STOPSIGNAL",
    "SHELL",
    "MAINTAINER",
];

/// File names `ADD` would extract rather than copy.
const ARCHIVES: &[&str] = &[
    ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tbz", ".tar.xz", ".txz", ".tar.zst", ".tzst",
];

/// Parses the Dockerfile `text`, read from `file` (whose directory is the build context).
/// `build_args` are `--build-arg NAME=VALUE`s; each must be declared by an `ARG`.
pub fn parse_dockerfile(
    text: &str,
    file: &Path,
    build_args: &[(String, String)],
) -> Result<BuildPlan, PlanError> {
    let label = file_label(file);
    let mut parser = Parser {
        context: context_dir(file),
        build_args,
        declared: Vec::new(),
        meta_args: Vec::new(),
        base: None,
        args: Vec::new(),
        env: Vec::new(),
        order: Vec::new(),
        user: None,
        workdir: None,
        steps: Vec::new(),
    };
    for ins in instructions(text, &label)? {
        let origin = format!("{label}:{}", ins.line);
        parser
            .instruction(&ins, &origin)
            .map_err(|message| error(origin, message))?;
    }
    let Some(base) = parser.base else {
        return Err(error(label, "no FROM instruction"));
    };
    for (name, _) in build_args {
        if !parser.declared.contains(name) {
            return Err(error(
                format!("--build-arg {name}"),
                format!("the Dockerfile declares no ARG {name}"),
            ));
        }
    }
    Ok(BuildPlan {
        name: None,
        context: parser.context,
        base,
        steps: parser.steps,
        defaults: Defaults {
            user: parser.user,
            workdir: parser.workdir,
            env: parser.env,
            ..Defaults::default()
        },
        force_from: None,
    })
}

/// One instruction, its continuation lines joined.
struct Instruction {
    /// 1-based number of its first line.
    line: usize,
    /// As written (`run`, `RUN`).
    keyword: String,
    /// The rest, trimmed.
    rest: String,
}

/// Splits `text` into instructions as BuildKit does: parser directives at the top, comment
/// and empty lines skipped (within continuations too), a trailing `\` continues the line.
fn instructions(text: &str, label: &str) -> Result<Vec<Instruction>, PlanError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let lines: Vec<&str> = text
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .collect();
    let mut out = Vec::new();
    let mut in_directives = true;
    let mut i = 0;
    while i < lines.len() {
        let number = i + 1;
        let line = lines[i].trim_start();
        i += 1;
        if in_directives {
            match directive(line) {
                Some((name, value)) => {
                    match name.to_ascii_lowercase().as_str() {
                        "escape" if value != "\\" => {
                            return Err(error(
                                format!("{label}:{number}"),
                                format!(
                                    "escape={value} is not supported: husk only understands the \
                                     default escape character \\"
                                ),
                            ));
                        }
                        "escape" | "syntax" | "check" => {}
                        // Docker reads an unknown directive as a comment, and looks no further.
                        _ => in_directives = false,
                    }
                    continue;
                }
                None => in_directives = false,
            }
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (first, mut more) = continuation(line);
        let mut joined = first.to_owned();
        while more && i < lines.len() {
            let next = lines[i];
            i += 1;
            let trimmed = next.trim_start();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let part;
            (part, more) = continuation(next);
            joined.push_str(part);
        }
        let joined = joined.trim();
        if joined.is_empty() {
            continue;
        }
        let (keyword, rest) = joined
            .split_once(char::is_whitespace)
            .unwrap_or((joined, ""));
        out.push(Instruction {
            line: number,
            keyword: keyword.to_owned(),
            rest: rest.trim().to_owned(),
        });
    }
    Ok(out)
}

/// `# name=value`, a parser directive.
fn directive(line: &str) -> Option<(&str, &str)> {
    let (name, value) = line.strip_prefix('#')?.split_once('=')?;
    let name = name.trim();
    let valid = name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name.chars().all(|c| c.is_ascii_alphanumeric());
    valid.then(|| (name, value.trim()))
}

/// The line without a trailing `\` (and blanks after it), and whether there was one.
fn continuation(line: &str) -> (&str, bool) {
    let trimmed = line.trim_end_matches([' ', '\t']);
    match trimmed.strip_suffix('\\') {
        Some(line) => (line, true),
        None => (line, false),
    }
}

struct Parser<'a> {
    context: PathBuf,
    build_args: &'a [(String, String)],
    /// Every ARG name declared anywhere, to check the build args against.
    declared: Vec<String>,
    /// ARGs before FROM: usable in FROM only, and as defaults of a later `ARG NAME`.
    meta_args: Vec<(String, Option<String>)>,
    base: Option<Base>,
    /// ARGs of the stage; `None`: declared without a value.
    args: Vec<(String, Option<String>)>,
    /// ENV, one per name, in first-declaration order.
    env: Vec<(String, String)>,
    /// ENV and ARG names of the stage, in first-declaration order (a RUN step's env order).
    order: Vec<String>,
    user: Option<String>,
    workdir: Option<String>,
    steps: Vec<Step>,
}

impl Parser<'_> {
    fn instruction(&mut self, ins: &Instruction, origin: &str) -> Result<(), String> {
        let keyword = ins.keyword.to_ascii_uppercase();
        if UNSUPPORTED.contains(&keyword.as_str()) {
            let hint = match keyword.as_str() {
                "CMD" | "ENTRYPOINT" => ": set start_cmd in a husk.toml spec instead",
                _ => "",
            };
            return Err(format!(
                "{keyword} is not supported by husk ({SUPPORTED}){hint}"
            ));
        }
        let known = [
            "FROM", "RUN", "COPY", "ADD", "ENV", "ARG", "WORKDIR", "USER",
        ];
        if !known.contains(&keyword.as_str()) {
            return Err(format!(
                "unknown instruction {:?} ({SUPPORTED})",
                ins.keyword
            ));
        }
        if matches!(keyword.as_str(), "RUN" | "COPY" | "ADD") && has_heredoc(&ins.rest) {
            return Err(format!(
                "{keyword} <<EOF: heredocs are not supported by husk: COPY a script file and \
                 RUN it instead"
            ));
        }
        let rest = ins.rest.as_str();
        match keyword.as_str() {
            "ARG" => return self.arg(rest),
            "FROM" => return self.from(rest),
            _ if self.base.is_none() => {
                return Err(format!(
                    "{keyword} before FROM: a Dockerfile starts with FROM (only ARG may precede it)"
                ));
            }
            _ => {}
        }
        match keyword.as_str() {
            "RUN" => self.run(rest, origin),
            "COPY" | "ADD" => self.copy(&keyword, rest, origin),
            "ENV" => self.env(rest),
            "WORKDIR" => {
                let dir = self.expand(rest)?;
                if dir.is_empty() {
                    return Err("WORKDIR needs a directory".into());
                }
                let dir = join_path(self.workdir.as_deref().unwrap_or("/"), &dir);
                self.workdir = Some(dir);
                Ok(())
            }
            "USER" => {
                let user = self.expand(rest)?;
                if !valid_user(&user) {
                    return Err(format!(
                        "USER {user:?} is not a user name or uid[:gid] (one word, no spaces)"
                    ));
                }
                self.user = Some(user);
                Ok(())
            }
            _ => unreachable!("checked against the known instructions"),
        }
    }

    fn from(&mut self, rest: &str) -> Result<(), String> {
        if self.base.is_some() {
            return Err("multi-stage builds are not supported by husk: use a single FROM".into());
        }
        let (flags, rest) = flags(rest);
        for (name, value) in flags {
            if name != "--platform" {
                return Err(format!("FROM {name} is not supported by husk"));
            }
            let platform = self.expand(value.unwrap_or(""))?;
            if platform != "linux/amd64" {
                return Err(format!(
                    "FROM --platform={platform}: husk only builds linux/amd64 images"
                ));
            }
        }
        let words: Vec<&str> = rest.split_whitespace().collect();
        let image = match words.as_slice() {
            [image] => *image,
            [_, r#as, _] if r#as.eq_ignore_ascii_case("as") => {
                return Err(
                    "multi-stage builds are not supported by husk (FROM ... AS <name>): drop \
                     the AS name and use a single FROM"
                        .into(),
                );
            }
            [] => return Err("FROM needs an image: FROM <image>".into()),
            _ => return Err(format!("FROM takes one image, not {rest:?}")),
        };
        let image = self.expand(image)?;
        if image.is_empty() || image.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!(
                "FROM {image:?} is not an image reference (is an ARG used in it unset?)"
            ));
        }
        self.base = Some(if image == "scratch" {
            Base::Scratch
        } else {
            Base::Image(image)
        });
        Ok(())
    }

    fn arg(&mut self, rest: &str) -> Result<(), String> {
        let words = split_words(rest);
        if words.is_empty() {
            return Err("ARG needs a name: ARG NAME or ARG NAME=default".into());
        }
        for word in words {
            let (name, default) = match word.split_once('=') {
                Some((name, default)) => (name.to_owned(), Some(self.expand(default)?)),
                None => (word, None),
            };
            check_env_var(&name, default.as_deref().unwrap_or(""))
                .map_err(|m| format!("ARG {m}"))?;
            let given = self
                .build_args
                .iter()
                .rev()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone());
            if !self.declared.contains(&name) {
                self.declared.push(name.clone());
            }
            if self.base.is_none() {
                let value = given.or(default);
                set(&mut self.meta_args, name, value);
            } else {
                let meta = self.meta_args.iter().find(|(n, _)| *n == name);
                let value = given
                    .or(default)
                    .or_else(|| meta.and_then(|(_, v)| v.clone()));
                if !self.order.contains(&name) {
                    self.order.push(name.clone());
                }
                set(&mut self.args, name, value);
            }
        }
        Ok(())
    }

    fn env(&mut self, rest: &str) -> Result<(), String> {
        let words = split_words(rest);
        let Some(first) = words.first() else {
            return Err("ENV needs a variable: ENV NAME=value".into());
        };
        let pairs: Vec<(String, String)> = if first.contains('=') {
            words
                .iter()
                .map(|word| {
                    let (name, value) = word.split_once('=').ok_or_else(|| {
                        format!(
                            "ENV: {word:?} is not NAME=value (quote values that contain spaces)"
                        )
                    })?;
                    Ok((name.to_owned(), value.to_owned()))
                })
                .collect::<Result<_, String>>()?
        } else {
            // The legacy `ENV NAME the rest of the line`.
            match rest.split_once(char::is_whitespace) {
                Some((name, value)) => vec![(name.to_owned(), value.trim().to_owned())],
                None => return Err(format!("ENV {first} needs a value: ENV {first}=value")),
            }
        };
        // Like Docker, every value of one ENV sees the variables as they were before it.
        let mut expanded = Vec::with_capacity(pairs.len());
        for (name, value) in pairs {
            let value = self.expand(&value)?;
            check_env_var(&name, &value).map_err(|m| format!("ENV {m}"))?;
            expanded.push((name, value));
        }
        for (name, value) in expanded {
            if !self.order.contains(&name) {
                self.order.push(name.clone());
            }
            self.env = merge_env(
                std::mem::take(&mut self.env)
                    .into_iter()
                    .chain([(name, value)]),
            );
        }
        Ok(())
    }

    fn run(&mut self, rest: &str, origin: &str) -> Result<(), String> {
        let (flags, command) = flags(rest);
        if let Some((name, _)) = flags.first() {
            return Err(format!(
                "RUN {name} is not supported by husk (no RUN flags are: --mount, --network, \
                 --security)"
            ));
        }
        let command = match json_array(command) {
            Some(argv) if argv.is_empty() => return Err("RUN [] has no command".into()),
            Some(argv) => Command::Exec(argv),
            None if command.is_empty() => return Err("RUN needs a command".into()),
            None => Command::Shell(command.to_owned()),
        };
        // Docker passes ARGs to RUN as environment variables; an ENV of the same name wins.
        let env = self
            .order
            .iter()
            .filter_map(|name| Some((name.clone(), self.lookup(name)?)))
            .collect();
        self.steps.push(Step {
            origin: origin.to_owned(),
            display: display(&format!("RUN {rest}")),
            kind: StepKind::Run {
                command,
                user: self.user.clone().unwrap_or_else(|| "root".into()),
                workdir: self.current_workdir(),
                env,
            },
        });
        Ok(())
    }

    fn copy(&mut self, keyword: &str, rest: &str, origin: &str) -> Result<(), String> {
        let (flags, args) = flags(rest);
        let mut owner = None;
        for (name, value) in flags {
            match name {
                "--chown" => {
                    let user = self.expand(value.unwrap_or(""))?;
                    if !valid_user(&user) {
                        return Err(format!(
                            "{keyword} --chown={user:?}: not a user name or uid[:gid]"
                        ));
                    }
                    owner = Some(user);
                }
                "--from" => {
                    return Err(format!(
                        "multi-stage {keyword} --from is not supported by husk"
                    ));
                }
                _ => return Err(format!("{keyword} {name} is not supported by husk")),
            }
        }
        let words = match json_array(args) {
            Some(words) => words,
            None => args.split_whitespace().map(str::to_owned).collect(),
        };
        let mut words = words
            .iter()
            .map(|w| self.expand(w))
            .collect::<Result<Vec<_>, _>>()?;
        let Some(dest) = words.pop().filter(|_| !words.is_empty()) else {
            return Err(format!(
                "{keyword} needs at least one source and a destination: {keyword} <src>... <dest>"
            ));
        };
        let workdir = self.current_workdir();
        if dest.is_empty() {
            return Err(format!("{keyword}: the destination is empty"));
        }
        let dest = resolve_dest(&workdir, &dest);
        if words.len() > 1 && !dest.ends_with('/') {
            return Err(format!(
                "{keyword} with several sources needs a directory destination ending in '/', \
                 not {dest:?}"
            ));
        }
        for src in &words {
            if keyword == "ADD" {
                check_add_source(src)?;
            }
            if src.contains(['*', '?', '[']) {
                return Err(format!(
                    "{keyword} {src:?}: wildcards in {keyword} sources are not supported by husk: \
                     name the files or copy their directory"
                ));
            }
            check_source(&self.context, src).map_err(|m| format!("{keyword} source {m}"))?;
        }
        self.steps.push(Step {
            origin: origin.to_owned(),
            display: display(&format!("{keyword} {rest}")),
            kind: StepKind::Copy {
                sources: words.iter().map(PathBuf::from).collect(),
                dest,
                owner,
                workdir,
            },
        });
        Ok(())
    }

    fn current_workdir(&self) -> String {
        self.workdir.clone().unwrap_or_else(|| "/".into())
    }

    /// A variable's value in scope: before FROM the ARGs before it; then ENV, which wins over
    /// an ARG of the same name, as in Docker. `None`: unset.
    fn lookup(&self, name: &str) -> Option<String> {
        let find = |vars: &[(String, Option<String>)]| {
            vars.iter()
                .find(|(n, _)| n == name)
                .and_then(|(_, v)| v.clone())
        };
        if self.base.is_none() {
            return find(&self.meta_args);
        }
        self.env
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .or_else(|| find(&self.args))
    }

    fn expand(&self, word: &str) -> Result<String, String> {
        expand(word, &|name| self.lookup(name))
    }
}

/// Declares `name` in `vars`, replacing an earlier value.
fn set(vars: &mut Vec<(String, Option<String>)>, name: String, value: Option<String>) {
    match vars.iter_mut().find(|(n, _)| *n == name) {
        Some(slot) => slot.1 = value,
        None => vars.push((name, value)),
    }
}

/// Refuses what `ADD` would do differently from `COPY`.
fn check_add_source(src: &str) -> Result<(), String> {
    let lower = src.to_ascii_lowercase();
    if ["http://", "https://", "git@", "git://", "ssh://"]
        .iter()
        .any(|p| lower.starts_with(p))
    {
        return Err(format!(
            "ADD from a URL is not supported: use RUN curl (or git clone) instead ({src})"
        ));
    }
    if ARCHIVES.iter().any(|ext| lower.ends_with(ext)) {
        return Err(format!(
            "ADD of a local archive (Docker extracts it) is not supported: use COPY and RUN tar \
             ({src})"
        ));
    }
    Ok(())
}

/// Leading `--name[=value]` flags, and the rest.
fn flags(mut rest: &str) -> (Vec<(&str, Option<&str>)>, &str) {
    let mut out = Vec::new();
    while rest.starts_with("--") {
        let (word, after) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
        rest = after.trim_start();
        match word.split_once('=') {
            Some((name, value)) => out.push((name, Some(value))),
            None => out.push((word, None)),
        }
    }
    (out, rest)
}

/// The strings of a JSON array of strings (Docker's exec form), or `None` for anything else,
/// which Docker reads as the shell form.
fn json_array(text: &str) -> Option<Vec<String>> {
    if !text.starts_with('[') {
        return None;
    }
    serde_json::from_str(text).ok()
}

/// Whether a RUN/COPY/ADD line uses a heredoc: a word `<<EOF`, `<<-EOF`, `2<<"EOF"`, as
/// BuildKit detects them (`<<<` is a here-string, not a heredoc).
fn has_heredoc(rest: &str) -> bool {
    rest.split_whitespace().any(|word| {
        let word = word.trim_start_matches(|c: char| c.is_ascii_digit());
        word.strip_prefix("<<").is_some_and(|delimiter| {
            let delimiter = delimiter.strip_prefix('-').unwrap_or(delimiter);
            !delimiter.is_empty() && !delimiter.contains('<')
        })
    })
}

/// `path` (absolute, or relative to `base`) normalized: no `.`, `..` resolved lexically and
/// never above `/`, no trailing `/`.
pub(crate) fn join_path(base: &str, path: &str) -> String {
    let joined = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("{base}/{path}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            part => parts.push(part),
        }
    }
    format!("/{}", parts.join("/"))
}

/// A COPY destination made absolute against the WORKDIR; one that names a directory (ends
/// in `/`, `.` or `..`) keeps a trailing `/`.
fn resolve_dest(workdir: &str, dest: &str) -> String {
    let last = dest.rsplit('/').next().unwrap_or("");
    let directory = matches!(last, "" | "." | "..");
    let mut path = join_path(workdir, dest);
    if directory && path != "/" {
        path.push('/');
    }
    path
}

/// Splits on unquoted blanks, keeping quotes and escapes in the words (BuildKit's
/// `parseWords`, for ENV and ARG).
fn split_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quote = None;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match quote {
            None if c.is_whitespace() => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
                continue;
            }
            None if c == '\'' || c == '"' => quote = Some(c),
            Some(q) if c == q => quote = None,
            _ => {}
        }
        word.push(c);
        if c == '\\' && quote != Some('\'') {
            if let Some(next) = chars.next() {
                word.push(next);
            }
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

/// Docker's word processing: quotes removed, `\` escapes, and `$VAR`, `${VAR}`,
/// `${VAR:-default}`, `${VAR-default}`, `${VAR:+alternative}`, `${VAR+alternative}`,
/// `${VAR:?message}`, `${VAR?message}` expanded (nothing inside single quotes). An unset
/// variable expands to nothing.
fn expand(word: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let chars: Vec<char> = word.chars().collect();
    let mut lexer = Lexer {
        chars: &chars,
        pos: 0,
        lookup,
    };
    let out = lexer.until(None)?;
    Ok(out)
}

struct Lexer<'a> {
    chars: &'a [char],
    pos: usize,
    lookup: &'a dyn Fn(&str) -> Option<String>,
}

impl Lexer<'_> {
    fn next(&mut self) -> Option<char> {
        let c = self.chars.get(self.pos).copied();
        self.pos += usize::from(c.is_some());
        c
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    /// Processes up to `stop` (not consumed) or the end.
    fn until(&mut self, stop: Option<char>) -> Result<String, String> {
        let mut out = String::new();
        while let Some(c) = self.peek() {
            if Some(c) == stop {
                return Ok(out);
            }
            self.pos += 1;
            match c {
                '\'' => loop {
                    match self.next() {
                        None => return Err("unterminated single quote".into()),
                        Some('\'') => break,
                        Some(c) => out.push(c),
                    }
                },
                '"' => loop {
                    match self.next() {
                        None => return Err("unterminated double quote".into()),
                        Some('"') => break,
                        Some('\\') => match self.peek() {
                            Some(c @ ('"' | '$' | '\\')) => {
                                self.pos += 1;
                                out.push(c);
                            }
                            _ => out.push('\\'),
                        },
                        Some('$') => out.push_str(&self.dollar()?),
                        Some(c) => out.push(c),
                    }
                },
                '\\' => out.push(self.next().unwrap_or('\\')),
                '$' => out.push_str(&self.dollar()?),
                c => out.push(c),
            }
        }
        match stop {
            Some(_) => Err("a ${...} is missing its closing '}'".into()),
            None => Ok(out),
        }
    }

    /// After a `$`.
    fn dollar(&mut self) -> Result<String, String> {
        let braced = self.peek() == Some('{');
        if !braced {
            let name = self.name();
            if name.is_empty() {
                return Ok("$".into());
            }
            return Ok((self.lookup)(&name).unwrap_or_default());
        }
        self.pos += 1;
        let name = self.name();
        if name.is_empty() {
            return Err("bad substitution: ${ must be followed by a variable name".into());
        }
        let value = (self.lookup)(&name);
        let colon = self.peek() == Some(':');
        if colon {
            self.pos += 1;
        }
        let op = match self.next() {
            Some('}') if !colon => return Ok(value.unwrap_or_default()),
            Some(op @ ('-' | '+' | '?')) => op,
            Some(other) => {
                return Err(format!(
                    "unsupported substitution ${{{name}{}{other}...}}: husk supports ${{VAR}}, \
                     ${{VAR:-default}}, ${{VAR:+alternative}} and ${{VAR:?message}}",
                    if colon { ":" } else { "" }
                ));
            }
            None => return Err("a ${...} is missing its closing '}'".into()),
        };
        let word = self.until(Some('}'))?;
        self.pos += 1;
        // With ':', an empty value counts as unset.
        let set = match &value {
            Some(v) => !colon || !v.is_empty(),
            None => false,
        };
        match op {
            '-' if set => Ok(value.unwrap_or_default()),
            '-' => Ok(word),
            '+' if set => Ok(word),
            '+' => Ok(String::new()),
            _ if set => Ok(value.unwrap_or_default()),
            _ if word.is_empty() => Err(format!("{name} is not set")),
            _ => Err(format!("{name}: {word}")),
        }
    }

    fn name(&mut self) -> String {
        let mut name = String::new();
        while let Some(c) = self.peek() {
            let valid =
                c == '_' || c.is_ascii_alphabetic() || (!name.is_empty() && c.is_ascii_digit());
            if !valid {
                break;
            }
            name.push(c);
            self.pos += 1;
        }
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(name: &str) -> Option<String> {
        match name {
            "A" => Some("alpha".into()),
            "EMPTY" => Some(String::new()),
            "SP" => Some("a b".into()),
            _ => None,
        }
    }

    fn ex(word: &str) -> Result<String, String> {
        expand(word, &vars)
    }

    #[test]
    fn expansion_forms() {
        let cases = [
            ("$A", "alpha"),
            ("${A}", "alpha"),
            ("x${A}y", "xalphay"),
            ("$A-$A", "alpha-alpha"),
            ("$UNSET", ""),
            ("${UNSET:-dflt}", "dflt"),
            ("${EMPTY:-dflt}", "dflt"),
            ("${EMPTY-dflt}", ""),
            ("${UNSET-dflt}", "dflt"),
            ("${A:-dflt}", "alpha"),
            ("${A:+alt}", "alt"),
            ("${EMPTY:+alt}", ""),
            ("${EMPTY+alt}", "alt"),
            ("${UNSET:+alt}", ""),
            ("${UNSET:-${A}}", "alpha"),
            ("${UNSET:-a b}", "a b"),
            ("${UNSET:-'}'}", "}"),
            ("${A:?must be set}", "alpha"),
            ("'$A'", "$A"),
            ("\"$A\"", "alpha"),
            ("\"a \\\"q\\\" \\$A \\n\"", "a \"q\" $A \\n"),
            (r"\$A", "$A"),
            (r"a\ b", "a b"),
            ("$", "$"),
            ("$1", "$1"),
            ("100%", "100%"),
            ("\"$SP\"", "a b"),
        ];
        for (word, want) in cases {
            assert_eq!(ex(word).as_deref(), Ok(want), "{word}");
        }
    }

    #[test]
    fn expansion_errors() {
        assert_eq!(
            ex("${UNSET:?needs a value}"),
            Err("UNSET: needs a value".into())
        );
        assert_eq!(ex("${UNSET?}"), Err("UNSET is not set".into()));
        assert!(ex("${A").unwrap_err().contains("closing"));
        assert!(ex("${A:-x").unwrap_err().contains("closing"));
        assert!(ex("${}").unwrap_err().contains("variable name"));
        assert!(ex("${A#x}")
            .unwrap_err()
            .contains("unsupported substitution ${A#...}"));
        assert!(ex("${A/x/y}").unwrap_err().contains("unsupported"));
        assert!(ex("'abc").unwrap_err().contains("single quote"));
        assert!(ex("\"abc").unwrap_err().contains("double quote"));
    }

    #[test]
    fn words_keep_quotes() {
        assert_eq!(
            split_words(r#"A=1 B="x y" C='p q' D=a\ b"#),
            [r"A=1", r#"B="x y""#, "C='p q'", r"D=a\ b"]
        );
        assert!(split_words("  ").is_empty());
    }

    #[test]
    fn paths() {
        assert_eq!(join_path("/", "a"), "/a");
        assert_eq!(join_path("/a/b", "../c/./d/"), "/a/c/d");
        assert_eq!(join_path("/a", "../../.."), "/");
        assert_eq!(join_path("/a", "/x//y"), "/x/y");
        assert_eq!(resolve_dest("/app", "."), "/app/");
        assert_eq!(resolve_dest("/app", "x"), "/app/x");
        assert_eq!(resolve_dest("/app", "x/"), "/app/x/");
        assert_eq!(resolve_dest("/app", "/"), "/");
        assert_eq!(resolve_dest("/app", "/srv/.."), "/");
        assert_eq!(resolve_dest("/", "/srv/a/.."), "/srv/");
    }

    #[test]
    fn heredoc_detection() {
        assert!(has_heredoc("<<EOF"));
        assert!(has_heredoc("cat <<-EOF > /x"));
        assert!(has_heredoc("python3 <<'EOF'"));
        assert!(has_heredoc("cat 0<<EOF"));
        assert!(!has_heredoc("echo $((1<<3))"));
        assert!(!has_heredoc("cat <<<word"));
        assert!(!has_heredoc("echo << x"));
    }

    #[test]
    fn flag_splitting() {
        assert_eq!(
            flags("--chown=a:b --link src dest"),
            (vec![("--chown", Some("a:b")), ("--link", None)], "src dest")
        );
        assert_eq!(flags("echo --x"), (vec![], "echo --x"));
    }
}
