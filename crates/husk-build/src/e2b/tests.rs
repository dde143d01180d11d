use super::*;
use crate::testutil::Scratch;

fn step(kind: &str, args: &[&str]) -> E2bStep {
    E2bStep {
        kind: kind.into(),
        args: args.iter().map(|a| a.to_string()).collect(),
        files_hash: None,
        force: false,
    }
}

fn copy(args: &[&str], hash: &str) -> E2bStep {
    E2bStep {
        files_hash: Some(hash.into()),
        ..step("COPY", args)
    }
}

fn image(steps: Vec<E2bStep>) -> E2bTemplate {
    E2bTemplate {
        from_image: Some("python:3".into()),
        steps,
        ..E2bTemplate::default()
    }
}

fn run_of(s: &Step) -> (&Command, &str, &str, &[(String, String)]) {
    match &s.kind {
        StepKind::Run {
            command,
            user,
            workdir,
            env,
        } => (command, user, workdir, env),
        other => panic!("not a run step: {other:?}"),
    }
}

#[test]
fn steps_run_as_user_in_its_home_until_told_otherwise_and_the_last_user_and_workdir_stay() {
    let ctx = Scratch::new();
    let t = E2bTemplate {
        start_cmd: Some("python3 -m http.server 8000".into()),
        ready_cmd: Some("curl -sf localhost:8000".into()),
        ..image(vec![
            step("RUN", &["whoami"]),
            step("ENV", &["A", "1", "B", "two words"]),
            step("RUN", &["apt-get update", "root"]),
            step("WORKDIR", &["app"]),
            step("USER", &["root"]),
            step("RUN", &["pwd"]),
            step("ENV", &["A", "3"]),
        ])
    };
    let (plan, numbers) = plan(&t, "my-env", ctx.path(), Base::Image("python:3".into())).unwrap();
    assert_eq!(numbers, vec![1, 3, 4, 6]);
    assert_eq!(numbers, step_numbers(&t));
    let (cmd, user, workdir, env) = run_of(&plan.steps[0]);
    assert_eq!(
        (cmd, user, workdir),
        (&Command::Shell("whoami".into()), "user", "/home/user")
    );
    assert!(env.is_empty());
    let (_, user, workdir, env) = run_of(&plan.steps[1]);
    assert_eq!((user, workdir), ("root", "/home/user"));
    assert_eq!(
        env,
        &[("A".into(), "1".into()), ("B".into(), "two words".into())]
    );
    // WORKDIR makes its directory as the current user; relative to the current workdir.
    let (cmd, user, _, _) = run_of(&plan.steps[2]);
    assert_eq!(
        cmd,
        &Command::Exec(vec![
            "/bin/mkdir".into(),
            "-p".into(),
            "--".into(),
            "/home/user/app".into()
        ])
    );
    assert_eq!(user, "user");
    let (_, user, workdir, _) = run_of(&plan.steps[3]);
    assert_eq!((user, workdir), ("root", "/home/user/app"));
    assert_eq!(plan.defaults.user.as_deref(), Some("root"));
    assert_eq!(plan.defaults.workdir.as_deref(), Some("/home/user/app"));
    assert_eq!(
        plan.defaults.env,
        vec![
            ("B".to_string(), "two words".to_string()),
            ("A".to_string(), "3".to_string())
        ]
    );
    assert_eq!(
        plan.defaults.start_cmd.as_deref(),
        Some("python3 -m http.server 8000")
    );
    assert_eq!(
        plan.defaults.ready_cmd.as_deref(),
        Some("curl -sf localhost:8000")
    );
    assert_eq!(plan.name.as_deref(), Some("my-env"));
    assert_eq!(plan.force_from, None);
}

#[test]
fn copies_take_the_uploaded_files_with_e2b_semantics() {
    let ctx = Scratch::new();
    let h1 = "1".repeat(64);
    let h2 = "2".repeat(64);
    let h3 = "3".repeat(64);
    let files = ctx.path().join(FILES_DIR);
    std::fs::create_dir_all(files.join(&h1)).unwrap();
    std::fs::write(files.join(&h1).join("package.json"), "{}").unwrap();
    std::fs::create_dir_all(files.join(&h2).join("src/lib")).unwrap();
    std::fs::write(files.join(&h2).join("src/a.js"), "a").unwrap();
    std::fs::write(files.join(&h2).join("src/lib/b.js"), "b").unwrap();
    std::fs::create_dir_all(files.join(&h3).join("bin")).unwrap();
    std::fs::write(files.join(&h3).join("bin/tool"), "#!/bin/sh").unwrap();
    let t = image(vec![
        copy(&["package.json", "/app/"], &h1),
        copy(&["src/*.js", "lib", "", "0640"], &h2),
        step("USER", &["root"]),
        copy(
            &["bin/tool", "/usr/local/bin/tool", "user:user", "0755"],
            &h3,
        ),
    ]);
    let (plan, numbers) = plan(&t, "x", ctx.path(), Base::Image("python:3".into())).unwrap();
    assert_eq!(numbers, vec![1, 2, 2, 4, 4]);
    assert_eq!(numbers, step_numbers(&t));
    let copy_of = |s: &Step| match &s.kind {
        StepKind::Copy {
            sources,
            dest,
            owner,
            ..
        } => (sources.clone(), dest.clone(), owner.clone()),
        other => panic!("not a copy: {other:?}"),
    };
    // A file into a directory, owned by the current user.
    assert_eq!(
        copy_of(&plan.steps[0]),
        (
            vec![PathBuf::from(FILES_DIR).join(&h1).join("package.json")],
            "/app/".into(),
            Some("user:user".into())
        )
    );
    // A glob: what is before it is a directory, whose contents go into the destination
    // (relative to the workdir); its entries then get the mode.
    assert_eq!(
        copy_of(&plan.steps[1]),
        (
            vec![PathBuf::from(FILES_DIR).join(&h2).join("src")],
            "/home/user/lib".into(),
            Some("user:user".into())
        )
    );
    let (cmd, user, _, _) = run_of(&plan.steps[2]);
    assert_eq!(user, "root");
    assert_eq!(
        cmd,
        &Command::Exec(
            [
                "/bin/chmod",
                "-R",
                "640",
                "--",
                "/home/user/lib/a.js",
                "/home/user/lib/lib"
            ]
            .map(String::from)
            .to_vec()
        )
    );
    // A file to an exact path, with the owner given; its mode never reaches a directory.
    assert_eq!(
        copy_of(&plan.steps[3]),
        (
            vec![PathBuf::from(FILES_DIR).join(&h3).join("bin/tool")],
            "/usr/local/bin/tool".into(),
            Some("user:user".into())
        )
    );
    let (cmd, _, _, _) = run_of(&plan.steps[4]);
    match cmd {
        Command::Exec(argv) => {
            assert_eq!(argv[0], "/bin/sh");
            assert_eq!(&argv[4..], ["755", "/usr/local/bin/tool", "tool"]);
        }
        other => panic!("{other:?}"),
    }
    // Files that are not there.
    let t = image(vec![copy(&["missing.txt", "/x"], &h1)]);
    let e = super::plan(&t, "x", ctx.path(), Base::Scratch).unwrap_err();
    assert_eq!(e.origin, "step 1");
    assert!(e.message.contains("hold nothing"), "{e}");
}

#[test]
fn force_rebuilds_from_the_first_forced_step() {
    let ctx = Scratch::new();
    let mut steps = vec![
        step("RUN", &["a"]),
        step("ENV", &["X", "1"]),
        step("RUN", &["b"]),
        step("RUN", &["c"]),
    ];
    steps[2].force = true;
    let (p, _) = plan(&image(steps.clone()), "x", ctx.path(), Base::Scratch).unwrap();
    assert_eq!(p.force_from, Some(1));
    let t = E2bTemplate {
        force: true,
        ..image(steps)
    };
    let (p, _) = plan(&t, "x", ctx.path(), Base::Scratch).unwrap();
    assert_eq!(p.force_from, Some(0));
}

#[test]
fn bad_templates_are_refused_naming_the_step() {
    let h = "a".repeat(64);
    let cases: Vec<(E2bTemplate, &str, &str)> = vec![
        (E2bTemplate::default(), "template", "required"),
        (
            E2bTemplate {
                from_template: Some("base".into()),
                ..image(vec![])
            },
            "template",
            "not both",
        ),
        (
            image(vec![step("FROB", &[])]),
            "step 1",
            "unknown step type",
        ),
        (image(vec![step("RUN", &[])]), "step 1", "takes a command"),
        (image(vec![step("RUN", &["  "])]), "step 1", "empty"),
        (
            image(vec![step("RUN", &["x"]), step("USER", &["guest"])]),
            "step 2",
            "\"root\" or \"user\"",
        ),
        (
            image(vec![step("RUN", &["x", "nobody"])]),
            "step 1",
            "\"root\" or \"user\"",
        ),
        (image(vec![step("ENV", &["A"])]), "step 1", "pairs"),
        (image(vec![step("ENV", &["1A", "x"])]), "step 1", "not an"),
        (
            image(vec![step("COPY", &["a", "/b"])]),
            "step 1",
            "files hash",
        ),
        (
            image(vec![copy(&["a", "/b"], "ABC")]),
            "step 1",
            "invalid files hash",
        ),
        (
            image(vec![copy(&["../a", "/b"], &h)]),
            "step 1",
            "relative path",
        ),
        (
            image(vec![copy(&["/etc/passwd", "/b"], &h)]),
            "step 1",
            "relative path",
        ),
        (
            image(vec![copy(&["a", "/b", "u;rm", ""], &h)]),
            "step 1",
            "owner",
        ),
        (
            image(vec![copy(&["a", "/b", "", "4755"], &h)]),
            "step 1",
            "permission bits only",
        ),
        (
            image(vec![copy(&["a", "/b", "", "rwx"], &h)]),
            "step 1",
            "octal",
        ),
        (
            image(vec![E2bStep {
                files_hash: Some(h.clone()),
                ..step("RUN", &["x"])
            }]),
            "step 1",
            "only COPY",
        ),
        (image(vec![step("RUN", &["a\0b"])]), "step 1", "NUL"),
        (
            image(vec![step("RUN", &[&"x".repeat(MAX_ARG_BYTES + 1)])]),
            "step 1",
            "64 KiB",
        ),
        (
            image((0..=MAX_STEPS).map(|_| step("RUN", &["x"])).collect()),
            "template",
            "steps",
        ),
        (
            image(
                (0..20)
                    .map(|_| step("RUN", &[&"x".repeat(MAX_ARG_BYTES)]))
                    .collect(),
            ),
            "template",
            "1 MiB",
        ),
    ];
    for (t, origin, want) in cases {
        let e = t.check().unwrap_err();
        assert_eq!(e.origin, origin, "{e}");
        assert!(e.message.contains(want), "{e} (wanted {want:?})");
    }
}

#[test]
fn e2b_base_images_mean_the_local_templates_of_the_same_role() {
    let t = |img: &str| E2bTemplate {
        from_image: Some(img.into()),
        ..E2bTemplate::default()
    };
    let have = |n: &str| n == "base";
    let none = |_: &str| false;
    assert_eq!(
        base_of(&t("e2bdev/base"), &have),
        Base::Image("base".into())
    );
    assert_eq!(
        base_of(&t("docker.io/e2bdev/base:latest"), &have),
        Base::Image("base".into())
    );
    assert_eq!(
        base_of(&t("e2bdev/base:latest"), &none),
        Base::Image("e2bdev/base:latest".into())
    );
    assert_eq!(
        base_of(&t("e2bdev/code-interpreter"), &have),
        Base::Image("e2bdev/code-interpreter".into())
    );
    assert_eq!(
        base_of(&t("127.0.0.1:5000/e2bdev/base:1"), &have),
        Base::Image("127.0.0.1:5000/e2bdev/base:1".into())
    );
    let from = E2bTemplate {
        from_template: Some("my-env".into()),
        ..E2bTemplate::default()
    };
    assert_eq!(base_of(&from, &have), Base::Image("my-env".into()));
}

#[test]
fn paths_and_globs() {
    assert_eq!(absolute("/home/user", "app/"), "/home/user/app/");
    assert_eq!(absolute("/home/user", "./src/"), "/home/user/src/");
    assert_eq!(absolute("/a/b", "../c"), "/a/c");
    assert_eq!(absolute("/", "/etc/x"), "/etc/x");
    assert_eq!(absolute("/x", "/"), "/");
    assert_eq!(glob_base("src/*.js"), "src");
    assert_eq!(glob_base("./a/b/**/c"), "a/b");
    assert_eq!(glob_base("*.txt"), "");
    assert_eq!(glob_base("dir/"), "dir");
    assert!(valid_files_hash(&"0f".repeat(32)));
    for ok in ["my-env", "my-env:v1", "my-env:V1.2_rc-3", "a:b"] {
        assert!(valid_tagged_name(ok), "{ok}");
    }
    let long = format!("a:{}", "t".repeat(64));
    for bad in [
        "My-env",
        "my-env:",
        "my-env:-x",
        "a:b:c",
        ":v1",
        "a:b/c",
        &long,
    ] {
        assert!(!valid_tagged_name(bad), "{bad}");
    }
    assert_eq!(tagged("n", "default"), "n");
    assert_eq!(tagged("n", "v1"), "n:v1");
    assert!(!valid_files_hash(&"0F".repeat(32)));
    assert!(!valid_files_hash("0f"));
}
