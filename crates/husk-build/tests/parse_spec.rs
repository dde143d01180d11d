//! husk's TOML spec: the plans it parses into, and the errors users see.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use husk_build::plan::{Base, BuildPlan, Command, Defaults, PlanError, Step, StepKind};
use husk_build::spec::{load, parse_spec, valid_template_name};

/// A directory under the system's temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "husk-parse-spec-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path.canonicalize().unwrap())
    }

    fn file(&self, rel: &str, text: &str) -> PathBuf {
        let path = self.0.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        path
    }

    fn spec(&self) -> PathBuf {
        self.0.join("husk.toml")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn parse_err(text: &str) -> PlanError {
    let dir = TempDir::new();
    parse_spec(text, &dir.spec()).expect_err("should not parse")
}

fn run_step(origin: &str, display: &str, cmd: &str, env: &[(&str, &str)]) -> Step {
    Step {
        origin: origin.into(),
        display: display.into(),
        kind: StepKind::Run {
            command: Command::Shell(cmd.into()),
            user: "root".into(),
            workdir: "/".into(),
            env: pairs(env),
        },
    }
}

fn pairs(env: &[(&str, &str)]) -> Vec<(String, String)> {
    env.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

const FULL: &str = r#"
name = "py-app"

[base]
image = "docker.io/library/python:3.12-slim"

[packages]
apt = ["curl", "git", "curl"]
pip = ["numpy==2.1", "pandas>=2"]
npm = ["typescript@5"]

[[files]]
src = "app"
dest = "/srv/app/"
owner = "user"

[[files]]
src = "config/settings.ini"
dest = "/etc/app.ini"

[[run]]
cmd = "echo hi > /etc/motd"

[[run]]
cmd = "make install"
user = "user"
workdir = "/srv/app"
env = { Z = "last", LANG = "override" }

[sandbox]
user = "user"
workdir = "/home/user"
env = { LANG = "C.UTF-8", APP_HOME = "/srv/app" }
start_cmd = "python3 -m http.server 8000"
ready_cmd = "curl -sf localhost:8000"
ready_timeout = 30
contexts = ["Python", "bash", "python"]
warm = 4
"#;

#[test]
fn full_spec_round_trip() {
    let dir = TempDir::new();
    dir.file("app/main.py", "print('hi')\n");
    dir.file("config/settings.ini", "[x]\n");
    let plan = parse_spec(FULL, &dir.spec()).unwrap();
    let sandbox_env = [("APP_HOME", "/srv/app"), ("LANG", "C.UTF-8")];
    fn with(
        sandbox: &[(&'static str, &'static str)],
        extra: &[(&'static str, &'static str)],
    ) -> Vec<(&'static str, &'static str)> {
        [sandbox, extra].concat()
    }
    let expected = BuildPlan {
        name: Some("py-app".into()),
        context: dir.0.clone(),
        base: Base::Image("docker.io/library/python:3.12-slim".into()),
        steps: vec![
            run_step(
                "husk.toml: packages.apt",
                "apt-get install curl git",
                "apt-get update && apt-get install -y --no-install-recommends 'curl' 'git' && \
                 rm -rf /var/lib/apt/lists/*",
                &with(&sandbox_env, &[("DEBIAN_FRONTEND", "noninteractive")]),
            ),
            run_step(
                "husk.toml: packages.pip",
                "pip install numpy==2.1 pandas>=2",
                "python3 -m pip install --no-cache-dir 'numpy==2.1' 'pandas>=2'",
                &with(
                    &sandbox_env,
                    &[
                        ("PIP_BREAK_SYSTEM_PACKAGES", "1"),
                        ("PIP_ROOT_USER_ACTION", "ignore"),
                        ("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
                    ],
                ),
            ),
            run_step(
                "husk.toml: packages.npm",
                "npm install -g typescript@5",
                "npm install -g --no-fund --no-audit --cache /tmp/.husk-npm-cache 'typescript@5' \
                 && rm -rf /tmp/.husk-npm-cache",
                &sandbox_env,
            ),
            Step {
                origin: "husk.toml: [[files]] #1".into(),
                display: "COPY app /srv/app/".into(),
                kind: StepKind::Copy {
                    sources: vec![PathBuf::from("app")],
                    dest: "/srv/app/".into(),
                    owner: Some("user".into()),
                    workdir: "/".into(),
                },
            },
            Step {
                origin: "husk.toml: [[files]] #2".into(),
                display: "COPY config/settings.ini /etc/app.ini".into(),
                kind: StepKind::Copy {
                    sources: vec![PathBuf::from("config/settings.ini")],
                    dest: "/etc/app.ini".into(),
                    owner: None,
                    workdir: "/".into(),
                },
            },
            run_step(
                "husk.toml: [[run]] #1",
                "RUN echo hi > /etc/motd",
                "echo hi > /etc/motd",
                &sandbox_env,
            ),
            Step {
                origin: "husk.toml: [[run]] #2".into(),
                display: "RUN make install".into(),
                kind: StepKind::Run {
                    command: Command::Shell("make install".into()),
                    user: "user".into(),
                    workdir: "/srv/app".into(),
                    // The step's own LANG replaces the sandbox's, in its place.
                    env: pairs(&[
                        ("APP_HOME", "/srv/app"),
                        ("LANG", "override"),
                        ("Z", "last"),
                    ]),
                },
            },
        ],
        defaults: Defaults {
            user: Some("user".into()),
            workdir: Some("/home/user".into()),
            env: pairs(&sandbox_env),
            start_cmd: Some("python3 -m http.server 8000".into()),
            ready_cmd: Some("curl -sf localhost:8000".into()),
            ready_timeout: Some(Duration::from_secs(30)),
            // Lower-cased, duplicates dropped, in order.
            contexts: Some(vec!["python".into(), "bash".into()]),
            warm: Some(4),
        },
        force_from: None,
    };
    assert_eq!(plan, expected);
}

#[test]
fn debian_base_takes_the_apt_packages() {
    let dir = TempDir::new();
    let text = r#"
        [base]
        debian = "bookworm"
        [packages]
        apt = ["python3", "curl", "ca-certificates", "curl", "libc6=2.36-9+deb12u4"]
    "#;
    let plan = parse_spec(text, &dir.spec()).unwrap();
    assert_eq!(
        plan,
        BuildPlan {
            name: None,
            context: dir.0.clone(),
            base: Base::Debian {
                suite: "bookworm".into(),
                variant: "minbase".into(),
                packages: vec![
                    "ca-certificates".into(),
                    "curl".into(),
                    "libc6=2.36-9+deb12u4".into(),
                    "python3".into(),
                ],
            },
            steps: vec![],
            defaults: Defaults::default(),
            force_from: None,
        }
    );
    let text = "[base]\ndebian = \"trixie\"\nvariant = \"buildd\"\n";
    let plan = parse_spec(text, &dir.spec()).unwrap();
    assert_eq!(
        plan.base,
        Base::Debian {
            suite: "trixie".into(),
            variant: "buildd".into(),
            packages: vec![],
        }
    );
}

#[test]
fn unknown_keys_are_named() {
    let e = parse_err("foo = 1\n[base]\ndebian = \"bookworm\"\n");
    assert_eq!(e.origin, "husk.toml");
    assert!(
        e.message
            .starts_with("unknown key 'foo' in the top level (allowed: name, base,"),
        "{e}"
    );
    assert!(e.message.ends_with("(at line 1, column 1)"), "{e}");

    let e = parse_err("[base]\ndebian = \"bookworm\"\nsuite = \"x\"\n");
    assert_eq!(e.origin, "husk.toml");
    assert_eq!(
        e.message,
        "unknown key 'suite' in [base] (allowed: debian, variant, image) (at line 3, column 1)"
    );

    let e = parse_err(
        "[base]\ndebian = \"bookworm\"\n[[run]]\ncmd = \"a\"\n[[run]]\ncmd = \"b\"\ncwd = \"/\"\n",
    );
    assert!(
        e.message
            .starts_with("unknown key 'cwd' in [[run]] #2 (allowed: cmd, user,"),
        "{e}"
    );

    let e = parse_err("[base]\ndebian = \"bookworm\"\n[packages]\npipx = []\n");
    assert!(
        e.message.starts_with("unknown key 'pipx' in [packages]"),
        "{e}"
    );

    let e = parse_err("[base]\ndebian = \"bookworm\"\n[sandbox]\ntimeout = 3\n");
    assert!(
        e.message.starts_with("unknown key 'timeout' in [sandbox]"),
        "{e}"
    );

    let e = parse_err("[base]\nimage = \"x\"\n[[files]]\nsrc = \"a\"\ndest = \"/a\"\nmode = 1\n");
    assert!(
        e.message.starts_with("unknown key 'mode' in [[files]] #1"),
        "{e}"
    );
}

#[test]
fn toml_errors_say_where() {
    let e = parse_err("[base]\ndebian = \"bookworm\"\n[[run]]\nuser = \"root\"\n");
    assert_eq!(
        e.message,
        "missing key 'cmd' in [[run]] #1 (at line 3, column 1)"
    );

    let e = parse_err("[base]\ndebian = \"bookworm\"\n[packages]\npip = \"numpy\"\n");
    assert_eq!(e.origin, "husk.toml");
    assert!(e.message.starts_with("packages.pip: invalid type"), "{e}");
    assert!(e.message.ends_with("(at line 4, column 7)"), "{e}");

    let e = parse_err("[base\n");
    assert_eq!(e.origin, "husk.toml");
    assert!(e.message.contains("(at line 1, column"), "{e}");

    let e = parse_err("[base]\nimage = \"x\"\n[sandbox.env]\nA = 1\n");
    assert!(e.message.starts_with("sandbox.env.A: invalid type"), "{e}");

    // The origin is the file's own name.
    let dir = TempDir::new();
    let e = parse_spec("bogus = 1", &dir.0.join("web.toml")).unwrap_err();
    assert_eq!(e.origin, "web.toml");
}

#[test]
fn base_needs_exactly_one_source() {
    let e = parse_err("[base]\ndebian = \"bookworm\"\nimage = \"debian:12\"\n");
    assert_eq!(e.origin, "husk.toml: base");
    assert!(
        e.message.contains("either debian or image, not both"),
        "{e}"
    );

    let e = parse_err("[base]\n");
    assert_eq!(e.origin, "husk.toml: base");
    assert!(e.message.starts_with("set one of debian"), "{e}");

    let e = parse_err("name = \"x\"\n");
    assert_eq!(e.origin, "husk.toml: base");
    assert!(e.message.starts_with("missing [base] table"), "{e}");

    let e = parse_err("[base]\nimage = \"debian:12\"\nvariant = \"buildd\"\n");
    assert_eq!(e.origin, "husk.toml: base.variant");

    let e = parse_err("[base]\ndebian = \"bookworm\"\nvariant = \"tiny\"\n");
    assert_eq!(e.origin, "husk.toml: base.variant");
    assert!(e.message.contains("minbase"), "{e}");

    let e = parse_err("[base]\ndebian = \"Bookworm\"\n");
    assert_eq!(e.origin, "husk.toml: base.debian");

    let e = parse_err("[base]\nimage = \"debian 12\"\n");
    assert_eq!(e.origin, "husk.toml: base.image");
}

#[test]
fn template_names() {
    for good in ["a", "base", "py3.12", "my_tmpl-2", "0", &"a".repeat(63)] {
        assert!(valid_template_name(good), "{good}");
    }
    for bad in [
        "",
        "Base",
        "-x",
        ".x",
        "_x",
        "a b",
        "a/b",
        "é",
        &"a".repeat(64),
    ] {
        assert!(!valid_template_name(bad), "{bad}");
    }
    let e = parse_err("name = \"My Template\"\n[base]\ndebian = \"bookworm\"\n");
    assert_eq!(e.origin, "husk.toml: name");
    assert!(
        e.message
            .contains("\"My Template\" is not a valid template name"),
        "{e}"
    );
}

#[test]
fn package_lists_are_checked() {
    let base = "[base]\nimage = \"debian:12\"\n[packages]\n";
    for (list, bad) in [
        ("apt = [\"Python3\"]", "apt"),
        ("apt = [\"curl; rm -rf /\"]", "apt"),
        ("apt = [\"\"]", "apt"),
        ("pip = [\"numpy pandas\"]", "pip"),
        ("pip = [\"-r requirements.txt\"]", "pip"),
        ("pip = [\"x;reboot\"]", "pip"),
        ("pip = [\"$(id)\"]", "pip"),
        ("pip = [\"\"]", "pip"),
        ("npm = [\"a`id`\"]", "npm"),
        ("npm = [\"--global-style\"]", "npm"),
        ("npm = [\"it's\"]", "npm"),
    ] {
        let e = parse_err(&format!("{base}{list}\n"));
        assert_eq!(
            e.origin,
            format!("husk.toml: packages.{bad}"),
            "{list}: {e}"
        );
    }
    let e = parse_err(&format!("{base}pip = [\"numpy pandas\"]\n"));
    assert_eq!(
        e.message,
        "\"numpy pandas\" is not a valid pip package: it has whitespace: give one package per \
         string"
    );
}

#[test]
fn sandbox_defaults_are_checked() {
    let base = "[base]\ndebian = \"bookworm\"\n[sandbox]\n";
    let cases = [
        (
            "ready_cmd = \"true\"",
            "sandbox.ready_cmd",
            "needs a start_cmd",
        ),
        (
            "start_cmd = \"x\"\nready_timeout = 5",
            "sandbox.ready_timeout",
            "needs a ready_cmd",
        ),
        (
            "start_cmd = \"x\"\nready_cmd = \"y\"\nready_timeout = 0",
            "sandbox.ready_timeout",
            "out of range",
        ),
        (
            "start_cmd = \"x\"\nready_cmd = \"y\"\nready_timeout = 3601",
            "sandbox.ready_timeout",
            "out of range",
        ),
        ("user = \"admin\"", "sandbox.user", "\"user\" or \"root\""),
        ("workdir = \"home\"", "sandbox.workdir", "absolute"),
        ("start_cmd = \"  \"", "sandbox.start_cmd", "non-empty"),
        (
            "env = { \"1X\" = \"a\" }",
            "sandbox.env",
            "\"1X\" is not a valid",
        ),
        ("env = { \"A-B\" = \"a\" }", "sandbox.env", "not a valid"),
        ("env = { X = \"a\\u0000b\" }", "sandbox.env", "NUL"),
        (
            "contexts = [\"py thon\"]",
            "sandbox.contexts",
            "not a language name",
        ),
        (
            "contexts = [\"\"]",
            "sandbox.contexts",
            "not a language name",
        ),
        (
            "contexts = [\"a\", \"b\", \"c\", \"d\", \"e\", \"f\", \"g\", \"h\", \"i\"]",
            "sandbox.contexts",
            "at most 8",
        ),
        ("warm = -1", "sandbox.warm", "out of range"),
        ("warm = 1001", "sandbox.warm", "out of range"),
    ];
    for (text, origin, part) in cases {
        let e = parse_err(&format!("{base}{text}\n"));
        assert_eq!(e.origin, format!("husk.toml: {origin}"), "{text}: {e}");
        assert!(e.message.contains(part), "{text}: {e}");
    }
}

#[test]
fn files_are_checked() {
    let dir = TempDir::new();
    dir.file("present.txt", "x");
    let spec = |src: &str, dest: &str| {
        format!("[base]\nimage = \"x\"\n[[files]]\nsrc = \"present.txt\"\ndest = \"/a\"\n[[files]]\nsrc = \"{src}\"\ndest = \"{dest}\"\n")
    };
    let err = |src: &str, dest: &str| parse_spec(&spec(src, dest), &dir.spec()).unwrap_err();

    let e = err("missing.txt", "/a");
    assert_eq!(e.origin, "husk.toml: [[files]] #2");
    assert_eq!(
        e.message,
        format!(
            "src: \"missing.txt\" does not exist in the build context {}",
            dir.0.display()
        )
    );
    let e = err("/etc/passwd", "/a");
    assert!(e.message.contains("\"/etc/passwd\" is absolute"), "{e}");
    let e = err("../present.txt", "/a");
    assert!(e.message.contains("contains '..'"), "{e}");
    let e = err("sub/../../x", "/a");
    assert!(e.message.contains("contains '..'"), "{e}");
    let e = err("", "/a");
    assert!(e.message.contains("empty"), "{e}");
    let e = err("present.txt", "srv/a");
    assert!(
        e.message
            .contains("dest \"srv/a\" must be an absolute path"),
        "{e}"
    );

    let text = format!("{}owner = \"1000:x y\"\n", spec("present.txt", "/a"));
    let e = parse_spec(&text, &dir.spec()).unwrap_err();
    assert!(e.message.contains("owner \"1000:x y\""), "{e}");

    // Numeric owners and "." are fine.
    let text = format!("{}owner = \"1000:1000\"\n", spec(".", "/srv/"));
    let plan = parse_spec(&text, &dir.spec()).unwrap();
    assert_eq!(plan.steps.len(), 2);
}

#[test]
fn run_steps_are_checked() {
    let base = "[base]\nimage = \"x\"\n[[run]]\n";
    let cases = [
        ("cmd = \"\"", "cmd is empty"),
        ("cmd = \"  \\n \"", "cmd is empty"),
        (
            "cmd = \"x\"\nworkdir = \"tmp\"",
            "workdir \"tmp\" must be an absolute path",
        ),
        ("cmd = \"x\"\nuser = \"a b\"", "user \"a b\" is not"),
        (
            "cmd = \"x\"\nenv = { \"\" = \"a\" }",
            "\"\" is not a valid environment",
        ),
    ];
    for (text, part) in cases {
        let e = parse_err(&format!("{base}{text}\n"));
        assert_eq!(e.origin, "husk.toml: [[run]] #1", "{text}");
        assert!(e.message.contains(part), "{text}: {e}");
    }
}

#[test]
fn run_display_is_one_short_line() {
    let dir = TempDir::new();
    let long = "x".repeat(300);
    let text = format!(
        "[base]\nimage = \"x\"\n[[run]]\ncmd = \"\"\"\nset -e\n  echo  a\n\"\"\"\n[[run]]\ncmd = \"{long}\"\n"
    );
    let plan = parse_spec(&text, &dir.spec()).unwrap();
    assert_eq!(plan.steps[0].display, "RUN set -e echo a");
    let display = &plan.steps[1].display;
    assert_eq!(display.chars().count(), 100);
    assert!(display.starts_with("RUN xxx") && display.ends_with('…'));
    match &plan.steps[0].kind {
        StepKind::Run { command, .. } => {
            assert_eq!(*command, Command::Shell("set -e\n  echo  a\n".into()))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn load_finds_and_reads_the_file() {
    let dir = TempDir::new();
    let e = load(&dir.0, &[]).unwrap_err();
    assert_eq!(e.origin, dir.0.display().to_string());
    assert!(
        e.message
            .contains("no husk.toml, e2b.Dockerfile or Dockerfile"),
        "{e}"
    );

    dir.file("Dockerfile", "FROM debian:12\n");
    assert_eq!(
        load(&dir.0, &[]).unwrap().base,
        Base::Image("debian:12".into())
    );
    dir.file("e2b.Dockerfile", "FROM ubuntu:24.04\n");
    assert_eq!(
        load(&dir.0, &[]).unwrap().base,
        Base::Image("ubuntu:24.04".into())
    );
    dir.file("husk.toml", "[base]\nimage = \"alpine\"\n");
    assert_eq!(
        load(&dir.0, &[]).unwrap().base,
        Base::Image("alpine".into())
    );

    let other = dir.file("web.dockerfile", "FROM scratch\n");
    let plan = load(&other, &[]).unwrap();
    assert_eq!(plan.base, Base::Scratch);
    assert_eq!(plan.context, dir.0);

    let args = [("V".to_string(), "1".to_string())];
    let e = load(&dir.spec(), &args).unwrap_err();
    assert_eq!(e.origin, "--build-arg V");
    assert!(
        e.message
            .starts_with("--build-arg only applies to Dockerfiles"),
        "{e}"
    );

    let missing = dir.0.join("nope.toml");
    let e = load(&missing, &[]).unwrap_err();
    assert_eq!(e.origin, missing.display().to_string());
    assert!(e.message.starts_with("cannot read the file"), "{e}");
}

#[test]
fn context_of_a_bare_file_name_is_the_current_directory() {
    let plan = parse_spec("[base]\nimage = \"x\"\n", Path::new("husk.toml")).unwrap();
    assert_eq!(plan.context, Path::new(".").canonicalize().unwrap());
}

#[test]
fn an_oversized_spec_is_refused_without_being_read_whole() {
    let dir = TempDir::new();
    let big = format!(
        "[base]\ndebian = \"bookworm\"\n#{}\n",
        "x".repeat(husk_build::spec::MAX_SPEC_BYTES as usize)
    );
    let path = dir.file("husk.toml", &big);
    let err = load(&path, &[]).unwrap_err();
    assert!(err.message.contains("larger than"), "{err}");
    let df = dir.file(
        "Dockerfile",
        &format!("FROM scratch\n#{}\n", "y".repeat(2 << 20)),
    );
    assert!(load(&df, &[]).unwrap_err().message.contains("larger than"));
}
