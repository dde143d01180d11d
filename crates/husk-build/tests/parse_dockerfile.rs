//! The Dockerfile subset: the plans it parses into, and the errors users see.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use husk_build::dockerfile::parse_dockerfile;
use husk_build::plan::{Base, BuildPlan, Command, Defaults, PlanError, Step, StepKind};

/// A build context under the system's temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "husk-parse-dockerfile-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path.canonicalize().unwrap())
    }

    fn with_files(files: &[&str]) -> TempDir {
        let dir = TempDir::new();
        for rel in files {
            let path = dir.0.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, "x").unwrap();
        }
        dir
    }

    fn parse(&self, text: &str) -> Result<BuildPlan, PlanError> {
        parse_dockerfile(text, &self.0.join("Dockerfile"), &[])
    }

    fn parse_with(&self, text: &str, args: &[(&str, &str)]) -> Result<BuildPlan, PlanError> {
        let args: Vec<(String, String)> = args
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        parse_dockerfile(text, &self.0.join("Dockerfile"), &args)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn parse(text: &str) -> BuildPlan {
    TempDir::new().parse(text).unwrap()
}

fn parse_err(text: &str) -> PlanError {
    TempDir::new().parse(text).expect_err("should not parse")
}

fn pairs(env: &[(&str, &str)]) -> Vec<(String, String)> {
    env.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The env of the `n`th step, a RUN.
fn run_env(plan: &BuildPlan, n: usize) -> Vec<(String, String)> {
    match &plan.steps[n].kind {
        StepKind::Run { env, .. } => env.clone(),
        other => panic!("not a RUN: {other:?}"),
    }
}

const FULL: &str = r#"# syntax=docker/dockerfile:1
ARG TAG=3.12
FROM python:${TAG}-slim

ENV LANG=C.UTF-8 APP="/srv/my app"
ENV LEGACY some value
# a comment between instructions
ARG MODE=dev
workdir /srv
WORKDIR app/../code
RUN apt-get update \
    # comments inside a continuation are dropped
    && apt-get install -y curl \
      git
RUN ["python3", "-c", "print('hi')"]
COPY --chown=user:user requirements.txt setup.py ./
ADD notes.txt $APP/
USER user
RUN pip install -r requirements.txt
"#;

#[test]
fn full_dockerfile_round_trip() {
    let dir = TempDir::with_files(&["requirements.txt", "setup.py", "notes.txt"]);
    let plan = dir.parse(FULL).unwrap();
    let env = pairs(&[
        ("LANG", "C.UTF-8"),
        ("APP", "/srv/my app"),
        ("LEGACY", "some value"),
        ("MODE", "dev"),
    ]);
    let expected = BuildPlan {
        name: None,
        context: dir.0.clone(),
        base: Base::Image("python:3.12-slim".into()),
        steps: vec![
            Step {
                origin: "Dockerfile:11".into(),
                display: "RUN apt-get update && apt-get install -y curl git".into(),
                kind: StepKind::Run {
                    command: Command::Shell(
                        "apt-get update     && apt-get install -y curl       git".into(),
                    ),
                    user: "root".into(),
                    workdir: "/srv/code".into(),
                    env: env.clone(),
                },
            },
            Step {
                origin: "Dockerfile:15".into(),
                display: r#"RUN ["python3", "-c", "print('hi')"]"#.into(),
                kind: StepKind::Run {
                    command: Command::Exec(vec![
                        "python3".into(),
                        "-c".into(),
                        "print('hi')".into(),
                    ]),
                    user: "root".into(),
                    workdir: "/srv/code".into(),
                    env: env.clone(),
                },
            },
            Step {
                origin: "Dockerfile:16".into(),
                display: "COPY --chown=user:user requirements.txt setup.py ./".into(),
                kind: StepKind::Copy {
                    sources: vec!["requirements.txt".into(), "setup.py".into()],
                    dest: "/srv/code/".into(),
                    owner: Some("user:user".into()),
                    workdir: "/srv/code".into(),
                },
            },
            Step {
                origin: "Dockerfile:17".into(),
                display: "ADD notes.txt $APP/".into(),
                kind: StepKind::Copy {
                    sources: vec!["notes.txt".into()],
                    dest: "/srv/my app/".into(),
                    owner: None,
                    workdir: "/srv/code".into(),
                },
            },
            Step {
                origin: "Dockerfile:19".into(),
                display: "RUN pip install -r requirements.txt".into(),
                kind: StepKind::Run {
                    command: Command::Shell("pip install -r requirements.txt".into()),
                    user: "user".into(),
                    workdir: "/srv/code".into(),
                    env,
                },
            },
        ],
        defaults: Defaults {
            user: Some("user".into()),
            workdir: Some("/srv/code".into()),
            env: pairs(&[
                ("LANG", "C.UTF-8"),
                ("APP", "/srv/my app"),
                ("LEGACY", "some value"),
            ]),
            ..Defaults::default()
        },
        force_from: None,
    };
    assert_eq!(plan, expected);
}

#[test]
fn minimal_dockerfile_has_defaults() {
    let plan = parse("from scratch\nrun true\n");
    assert_eq!(plan.base, Base::Scratch);
    assert_eq!(plan.defaults, Defaults::default());
    assert_eq!(
        plan.steps[0].kind,
        StepKind::Run {
            command: Command::Shell("true".into()),
            user: "root".into(),
            workdir: "/".into(),
            env: vec![],
        }
    );
}

#[test]
fn env_forms_quotes_and_escapes() {
    let plan = parse(concat!(
        "FROM debian:12\n",
        "ENV A=1 B=\"two words\" C='single $A' D=a\\ b E=\n",
        "ENV F \"legacy\" $A   spaced\n",
        "ENV G=\"say \\\"hi\\\"\" H=${B}-${A}\n",
        "ENV A=2 I=$A\n",
    ));
    assert_eq!(
        plan.defaults.env,
        pairs(&[
            ("A", "2"),
            ("B", "two words"),
            ("C", "single $A"),
            ("D", "a b"),
            ("E", ""),
            ("F", "legacy 1   spaced"),
            ("G", "say \"hi\""),
            ("H", "two words-1"),
            // Values in one ENV see the variables as they were before it.
            ("I", "1"),
        ])
    );
    let e = parse_err("FROM x\n\nENV ONLY\n");
    assert_eq!(e.origin, "Dockerfile:3");
    assert_eq!(e.message, "ENV ONLY needs a value: ENV ONLY=value");
    let e = parse_err("FROM x\nENV A=1 B\n");
    assert!(e.message.contains("\"B\" is not NAME=value"), "{e}");
    let e = parse_err("FROM x\nENV 1A=x\n");
    assert!(
        e.message.contains("not a valid environment variable name"),
        "{e}"
    );
    let e = parse_err("FROM x\nENV A=\"open\n");
    assert!(e.message.contains("unterminated double quote"), "{e}");
}

#[test]
fn args_defaults_build_args_and_scope() {
    let text = concat!(
        "ARG BASE=debian\n",
        "ARG SUITE\n",
        "FROM ${BASE}:${SUITE:-bookworm}\n",
        "ARG VERSION=1.0\n",
        "ARG TOKEN\n",
        "ARG BASE\n",
        "RUN echo $VERSION\n",
    );
    let dir = TempDir::new();

    let plan = dir.parse(text).unwrap();
    assert_eq!(plan.base, Base::Image("debian:bookworm".into()));
    // TOKEN has no value: not passed. BASE inherits the value from before FROM.
    assert_eq!(
        run_env(&plan, 0),
        pairs(&[("VERSION", "1.0"), ("BASE", "debian")])
    );
    // ARG values are not sandbox defaults.
    assert!(plan.defaults.env.is_empty());

    let plan = dir
        .parse_with(
            text,
            &[("SUITE", "trixie"), ("TOKEN", "s3cret"), ("VERSION", "2.0")],
        )
        .unwrap();
    assert_eq!(plan.base, Base::Image("debian:trixie".into()));
    assert_eq!(
        run_env(&plan, 0),
        pairs(&[("VERSION", "2.0"), ("TOKEN", "s3cret"), ("BASE", "debian")])
    );

    let e = dir.parse_with(text, &[("NOPE", "1")]).unwrap_err();
    assert_eq!(e.origin, "--build-arg NOPE");
    assert_eq!(
        e.to_string(),
        "--build-arg NOPE: the Dockerfile declares no ARG NOPE"
    );

    // An ARG before FROM is not in scope after it unless declared again.
    let plan = parse("ARG V=1\nFROM x\nRUN a\nENV W=\"[$V]\"\n");
    assert_eq!(run_env(&plan, 0), vec![]);
    assert_eq!(plan.defaults.env, pairs(&[("W", "[]")]));

    // Several in one ARG, a default using another variable.
    let plan = parse("FROM x\nENV P=/opt\nARG A=1 B=$P/bin\nRUN a\n");
    assert_eq!(
        run_env(&plan, 0),
        pairs(&[("P", "/opt"), ("A", "1"), ("B", "/opt/bin")])
    );

    let e = parse_err("FROM x\nARG\n");
    assert_eq!(e.origin, "Dockerfile:2");
}

#[test]
fn env_wins_over_arg_in_run_env() {
    let dir = TempDir::new();
    let text = "FROM x\nARG X=arg\nENV X=env\nRUN a\nARG Y=1\nENV Y=2\nARG Y=3\nRUN b\n";
    let plan = dir.parse_with(text, &[("X", "cli")]).unwrap();
    assert_eq!(run_env(&plan, 0), pairs(&[("X", "env")]));
    assert_eq!(run_env(&plan, 1), pairs(&[("X", "env"), ("Y", "2")]));
}

#[test]
fn workdir_chains_and_normalizes() {
    let plan = parse(concat!(
        "FROM x\n",
        "WORKDIR a\n",
        "RUN one\n",
        "WORKDIR b/./c/\n",
        "RUN two\n",
        "WORKDIR ../../../../..\n",
        "RUN three\n",
        "ENV HOME_DIR=/home/u\n",
        "WORKDIR $HOME_DIR/work\n",
    ));
    let dirs: Vec<String> = plan
        .steps
        .iter()
        .map(|s| match &s.kind {
            StepKind::Run { workdir, .. } => workdir.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(dirs, ["/a", "/a/b/c", "/"]);
    assert_eq!(plan.defaults.workdir.as_deref(), Some("/home/u/work"));
    assert_eq!(parse_err("FROM x\nWORKDIR \"\"\n").origin, "Dockerfile:2");
}

#[test]
fn user_is_checked_and_expanded() {
    let plan = parse("FROM x\nARG UID=1000\nUSER ${UID}:${UID}\nRUN id\n");
    assert_eq!(plan.defaults.user.as_deref(), Some("1000:1000"));
    match &plan.steps[0].kind {
        StepKind::Run { user, .. } => assert_eq!(user, "1000:1000"),
        other => panic!("{other:?}"),
    }
    let e = parse_err("FROM x\nUSER a b\n");
    assert_eq!(e.origin, "Dockerfile:2");
    assert!(e.message.contains("USER \"a b\" is not a user name"), "{e}");
}

#[test]
fn copy_sources_and_destinations() {
    let dir = TempDir::with_files(&["a.txt", "b.txt", "src/lib.rs", "archive.tar.gz"]);
    let copy = |text: &str| match &dir.parse(text).unwrap().steps[0].kind {
        StepKind::Copy {
            sources,
            dest,
            owner,
            ..
        } => (sources.clone(), dest.clone(), owner.clone()),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        copy("FROM x\nWORKDIR /app\nCOPY a.txt .\n"),
        (vec!["a.txt".into()], "/app/".into(), None)
    );
    assert_eq!(
        copy("FROM x\nWORKDIR /app\nCOPY src conf/x\n"),
        (vec!["src".into()], "/app/conf/x".into(), None)
    );
    assert_eq!(
        copy("FROM x\nCOPY [\"a.txt\", \"b.txt\", \"/d/\"]\n"),
        (vec!["a.txt".into(), "b.txt".into()], "/d/".into(), None)
    );
    assert_eq!(
        copy("FROM x\nARG WHO=1000\nCOPY --chown=$WHO src/lib.rs /x\n"),
        (vec!["src/lib.rs".into()], "/x".into(), Some("1000".into()))
    );
    // COPY of an archive copies it; only ADD would extract it.
    assert_eq!(
        copy("FROM x\nCOPY archive.tar.gz /\n"),
        (vec!["archive.tar.gz".into()], "/".into(), None)
    );

    let err = |text: &str| dir.parse(text).unwrap_err();
    let e = err("FROM x\nCOPY a.txt b.txt /d\n");
    assert_eq!(e.origin, "Dockerfile:2");
    assert!(
        e.message
            .contains("needs a directory destination ending in '/'"),
        "{e}"
    );
    let e = err("FROM x\nCOPY missing.txt /d\n");
    assert!(e.message.contains("\"missing.txt\" does not exist"), "{e}");
    let e = err("FROM x\nCOPY /etc/passwd /d\n");
    assert!(e.message.contains("is absolute"), "{e}");
    let e = err("FROM x\nCOPY ../a.txt /d\n");
    assert!(e.message.contains("contains '..'"), "{e}");
    let e = err("FROM x\nCOPY *.txt /d/\n");
    assert!(
        e.message
            .contains("wildcards in COPY sources are not supported"),
        "{e}"
    );
    let e = err("FROM x\nCOPY a.txt\n");
    assert!(
        e.message.contains("at least one source and a destination"),
        "{e}"
    );
    let e = err("FROM x\nCOPY --from=builder /out /out\n");
    assert_eq!(
        e.message,
        "multi-stage COPY --from is not supported by husk"
    );
    let e = err("FROM x\nCOPY --chmod=755 a.txt /d\n");
    assert_eq!(e.message, "COPY --chmod is not supported by husk");
    let e = err("FROM x\nCOPY --link a.txt /d\n");
    assert_eq!(e.message, "COPY --link is not supported by husk");
    let e = err("FROM x\nCOPY --chown=a:b:c a.txt /d\n");
    assert!(e.message.contains("not a user name"), "{e}");
}

#[test]
fn add_refuses_urls_and_archives() {
    let dir = TempDir::with_files(&["a.tar.gz", "b.tgz", "c.TAR.ZST", "plain.gz"]);
    for (src, part) in [
        (
            "https://example.com/x.sh",
            "ADD from a URL is not supported: use RUN curl",
        ),
        ("http://example.com/x", "ADD from a URL"),
        ("git@github.com:a/b.git", "ADD from a URL"),
        (
            "a.tar.gz",
            "ADD of a local archive (Docker extracts it) is not supported",
        ),
        ("b.tgz", "use COPY and RUN tar"),
        ("c.TAR.ZST", "local archive"),
    ] {
        let e = dir
            .parse(&format!("FROM x\n\nADD {src} /d/\n"))
            .unwrap_err();
        assert_eq!(e.origin, "Dockerfile:3", "{src}");
        assert!(e.message.contains(part), "{src}: {e}");
    }
    let e = dir
        .parse("FROM x\nADD --checksum=sha256:00 a.tar.gz /\n")
        .unwrap_err();
    assert_eq!(e.message, "ADD --checksum is not supported by husk");
    let plan = dir.parse("FROM x\nADD plain.gz /d/\n").unwrap();
    assert_eq!(plan.steps[0].display, "ADD plain.gz /d/");
}

#[test]
fn run_forms_and_flags() {
    let plan = parse("FROM x\nRUN [\"/bin/echo\", \"a b\"]\nRUN [not json\n");
    assert_eq!(
        plan.steps[0].kind,
        StepKind::Run {
            command: Command::Exec(vec!["/bin/echo".into(), "a b".into()]),
            user: "root".into(),
            workdir: "/".into(),
            env: vec![],
        }
    );
    match &plan.steps[1].kind {
        StepKind::Run { command, .. } => assert_eq!(*command, Command::Shell("[not json".into())),
        other => panic!("{other:?}"),
    }
    // RUN is not expanded by husk: the shell does it.
    let plan = parse("FROM x\nENV A=1\nRUN echo $A '${A}'\n");
    match &plan.steps[0].kind {
        StepKind::Run { command, .. } => {
            assert_eq!(*command, Command::Shell("echo $A '${A}'".into()))
        }
        other => panic!("{other:?}"),
    }
    for flag in [
        "--mount=type=cache,target=/root/.cache",
        "--network=none",
        "--security=insecure",
    ] {
        let e = parse_err(&format!("FROM x\nRUN {flag} make\n"));
        let name = flag.split('=').next().unwrap();
        assert!(
            e.message
                .starts_with(&format!("RUN {name} is not supported")),
            "{e}"
        );
    }
    assert!(parse_err("FROM x\nRUN\n")
        .message
        .contains("RUN needs a command"));
    assert!(parse_err("FROM x\nRUN []\n").message.contains("no command"));
}

#[test]
fn unsupported_instructions_name_their_line() {
    let prefix = "# escape=\\\nFROM debian:12\nRUN echo one \\\n    two \\\n\n    three\n";
    // The instruction under test is on line 7.
    for keyword in [
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
        "cmd",
        "Expose",
    ] {
        let e = parse_err(&format!("{prefix}{keyword} something\n"));
        assert_eq!(e.origin, "Dockerfile:7", "{keyword}");
        let upper = keyword.to_ascii_uppercase();
        let expected = format!(
            "{upper} is not supported by husk (supported: FROM, RUN, COPY, ADD, ENV, ARG, \
             WORKDIR, USER)"
        );
        if upper == "CMD" || upper == "ENTRYPOINT" {
            assert_eq!(
                e.message,
                format!("{expected}: set start_cmd in a husk.toml spec instead")
            );
        } else {
            assert_eq!(e.message, expected);
        }
    }
    let e = parse_err(&format!("{prefix}FRM x\n"));
    assert_eq!(e.origin, "Dockerfile:7");
    assert!(
        e.message
            .starts_with("unknown instruction \"FRM\" (supported: FROM,"),
        "{e}"
    );
}

#[test]
fn lines_continuations_and_comments() {
    let text = "\u{feff}FROM x\r\n\r\n  # indented comment\r\nRUN a \\\r\n  # gone\r\n\r\n  b\\  \r\n  c\r\nENV A=1 \\\n  B=2\n";
    let plan = parse(text);
    match &plan.steps[0].kind {
        StepKind::Run { command, .. } => assert_eq!(*command, Command::Shell("a   b  c".into())),
        other => panic!("{other:?}"),
    }
    assert_eq!(plan.steps[0].origin, "Dockerfile:4");
    assert_eq!(plan.defaults.env, pairs(&[("A", "1"), ("B", "2")]));
    // A continuation at the end of the file ends the instruction.
    let plan = parse("FROM x\nRUN a \\");
    assert_eq!(plan.steps[0].display, "RUN a");
}

#[test]
fn parser_directives() {
    let plan = parse("# syntax=docker/dockerfile:1.7\n# escape=\\\nFROM x\n");
    assert_eq!(plan.base, Base::Image("x".into()));
    let e = parse_err("# escape=`\nFROM x\n");
    assert_eq!(e.origin, "Dockerfile:1");
    assert!(e.message.starts_with("escape=` is not supported"), "{e}");
    // After a comment, a directive is only a comment.
    let plan = parse("# hello\n# escape=`\nFROM x\n");
    assert_eq!(plan.base, Base::Image("x".into()));
}

#[test]
fn heredocs_are_refused() {
    for text in [
        "FROM x\nRUN <<EOF\necho hi\nEOF\n",
        "FROM x\nRUN cat <<-'EOT' > /x\nhi\nEOT\n",
        "FROM x\nCOPY <<EOF /etc/x\nhi\nEOF\n",
    ] {
        let e = parse_err(text);
        assert_eq!(e.origin, "Dockerfile:2", "{text}");
        assert!(
            e.message.contains("heredocs are not supported by husk"),
            "{e}"
        );
    }
    // Not heredocs.
    parse("FROM x\nRUN echo $((1<<3)) && cat <<<word\n");
}

#[test]
fn from_rules() {
    let e = parse_err("FROM a AS build\nRUN make\n");
    assert_eq!(e.origin, "Dockerfile:1");
    assert!(
        e.message
            .starts_with("multi-stage builds are not supported"),
        "{e}"
    );
    let e = parse_err("FROM a\nRUN make\nFROM b\n");
    assert_eq!(e.origin, "Dockerfile:3");
    assert!(
        e.message
            .starts_with("multi-stage builds are not supported"),
        "{e}"
    );
    let e = parse_err("RUN make\nFROM b\n");
    assert_eq!(e.origin, "Dockerfile:1");
    assert!(e.message.contains("only ARG may precede it"), "{e}");
    let e = parse_err("# just a comment\nARG X=1\n");
    assert_eq!(e.to_string(), "Dockerfile: no FROM instruction");
    let e = parse_err("");
    assert_eq!(e.to_string(), "Dockerfile: no FROM instruction");
    let e = parse_err("FROM --platform=linux/arm64 debian\n");
    assert!(e.message.contains("only builds linux/amd64"), "{e}");
    let e = parse_err("ARG IMG\nFROM $IMG\n");
    assert!(e.message.contains("is an ARG used in it unset?"), "{e}");
    let e = parse_err("FROM a b\n");
    assert!(e.message.contains("one image"), "{e}");
    let plan = parse("ARG P=linux/amd64\nFROM --platform=$P debian@sha256:abc\n");
    assert_eq!(plan.base, Base::Image("debian@sha256:abc".into()));
}

#[test]
fn origin_uses_the_file_name() {
    let dir = TempDir::new();
    let file = dir.0.join("e2b.Dockerfile");
    let e = parse_dockerfile("FROM x\n\nEXPOSE 80\n", &file, &[]).unwrap_err();
    assert_eq!(e.origin, "e2b.Dockerfile:3");
    let e = parse_dockerfile("", &file, &[]).unwrap_err();
    assert_eq!(e.origin, "e2b.Dockerfile");
    let plan = parse_dockerfile("FROM x\nRUN a\n", &file, &[]).unwrap();
    assert_eq!(plan.steps[0].origin, "e2b.Dockerfile:2");
    assert_eq!(plan.context, dir.0);
}

#[test]
fn expansion_in_instructions() {
    let dir = TempDir::with_files(&["app-v2/main.py"]);
    let text = concat!(
        "FROM x\n",
        "ARG V=2\n",
        "ENV NAME=app DEST=\n",
        "ENV D=${DEST:-/opt}/${NAME} E=${V:+v$V} F=${UNSET-none} G=$NAME-v$V\n",
        "COPY ${NAME}-v${V}/main.py ${D}/\n",
    );
    let plan = dir.parse(text).unwrap();
    assert_eq!(
        plan.defaults.env,
        pairs(&[
            ("NAME", "app"),
            ("DEST", ""),
            ("D", "/opt/app"),
            ("E", "v2"),
            ("F", "none"),
            ("G", "app-v2"),
        ])
    );
    match &plan.steps[0].kind {
        StepKind::Copy { sources, dest, .. } => {
            assert_eq!(*sources, vec![PathBuf::from("app-v2/main.py")]);
            assert_eq!(dest, "/opt/app/");
        }
        other => panic!("{other:?}"),
    }
    let e = dir
        .parse("FROM x\nENV A=\"${B:?B must be set}\"\n")
        .unwrap_err();
    assert_eq!(e.origin, "Dockerfile:2");
    assert_eq!(e.message, "B: B must be set");
    let e = dir.parse("FROM x\nENV A=${B%%.*}\n").unwrap_err();
    assert!(e.message.starts_with("unsupported substitution"), "{e}");
}
