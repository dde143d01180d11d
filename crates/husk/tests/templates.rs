//! Templates end to end, as a user builds and uses them: `husk template build` from a Debian
//! spec and from Dockerfiles, the layer cache, a template pushed to a local registry and built
//! upon, bad input that must fail clearly and register nothing, and a damaged image refused at
//! sandbox creation. Builds share a layer cache between test runs (see common/templates.rs).

mod common;

use std::fs;

use common::templates::{busybox_context, leftovers, Registry, State};
use common::{rand, TempDir};

/// Lines of a build's progress that report step `display` as done, cached or not.
fn step_line<'a>(progress: &'a str, display: &str) -> &'a str {
    progress
        .lines()
        .find(|l| l.starts_with('✓') && l.contains(display))
        .unwrap_or_else(|| panic!("no finished step {display:?} in:\n{progress}"))
}

fn cached(progress: &str, display: &str) -> bool {
    step_line(progress, display).ends_with("CACHED")
}

#[test]
fn a_debian_spec_builds_a_template_whose_sandboxes_see_its_packages_not_the_hosts() {
    let state = State::new("tmpl-debian");
    let ctx = TempDir::new("ctx-debian");
    fs::write(ctx.path().join("motd"), "made by husk\n").unwrap();
    let spec = ctx.path().join("husk.toml");
    fs::write(
        &spec,
        r#"
[base]
debian = "bookworm"

[packages]
apt = ["jq"]

[[files]]
src = "motd"
dest = "/etc/motd"

[[run]]
cmd = "jq --version > /opt/jq-version"

[sandbox]
env = { GREETING = "hello" }
workdir = "/opt"
"#,
    )
    .unwrap();
    state.build_ok(&spec, "deb");
    assert_eq!(state.names(), vec!["deb".to_string()]);
    let run = state.run(
        "deb",
        &[],
        &[
            "sh",
            "-c",
            "echo '{\"a\":7}' | jq .a; cat /etc/motd /opt/jq-version; echo $GREETING; pwd; \
             id -un; stat -c %U:%G /usr/bin/jq /etc/motd; . /etc/os-release; echo $VERSION_CODENAME; \
             for f in /usr/bin/mmdebstrap /usr/bin/python3 /usr/bin/cargo /root/.cargo; do \
               test -e $f && echo HOST-FILE-VISIBLE $f; done; echo end",
        ],
    );
    run.ok();
    assert_eq!(
        run.stdout,
        "7\nmade by husk\njq-1.6\nhello\n/opt\nuser\nroot:root\nroot:root\nbookworm\nend\n"
    );
}

#[test]
fn a_rebuild_with_only_the_last_step_changed_reruns_only_that_step() {
    let state = State::new("tmpl-cache");
    let ctx = TempDir::new("ctx-cache");
    // A token unique to this test run, so the first build's last step is not cached.
    let token = format!("{:x}", rand());
    let steps =
        |last: &str| format!("RUN echo one > /one\nRUN echo two > /two\nRUN echo {last} > /last\n");
    let dockerfile = busybox_context(ctx.path(), &steps(&token));
    let first = state.build_ok(&dockerfile, "cached");
    assert!(!cached(&first, &format!("RUN echo {token}")), "{first}");
    let first_image = state.image("cached");
    // The same again: every step from the cache, and the very same image (builds are
    // reproducible: templates built on this one hit the cache too).
    let second = state.build_ok(&dockerfile, "cached");
    assert_eq!(
        state.image("cached"),
        first_image,
        "the same layers made another image"
    );
    for display in [
        "COPY busybox /bin/sh",
        "RUN echo one",
        "RUN echo two",
        &format!("RUN echo {token}"),
    ] {
        assert!(
            cached(&second, display),
            "{display} was not cached:\n{second}"
        );
    }
    // Only the last step changes: everything before it is a cache hit, it runs again.
    let other = format!("{token}-changed");
    busybox_context(ctx.path(), &steps(&other));
    let third = state.build_ok(&dockerfile, "cached");
    for display in ["COPY busybox /bin/busybox", "RUN echo one", "RUN echo two"] {
        assert!(
            cached(&third, display),
            "{display} was not cached:\n{third}"
        );
    }
    assert!(!cached(&third, &format!("RUN echo {other}")), "{third}");
    let run = state.run("cached", &[], &["cat", "/one", "/two", "/last"]);
    run.ok();
    assert_eq!(run.stdout, format!("one\ntwo\n{other}\n"));
    // A changed file in the context invalidates its COPY and what follows.
    fs::write(ctx.path().join("busybox"), format!("not busybox {token}")).unwrap();
    let (code, _, err) = state.build(&dockerfile, "cached", &[]);
    assert_ne!(code, 0, "a build with a broken /bin/sh succeeded:\n{err}");
    assert!(!cached(&err, "COPY busybox /bin/busybox"), "{err}");
}

/// What package managers do in a step: write a file far bigger than the build sandbox's
/// skeleton tmpfs (deno's npm package has a 96 MB binary; torch's wheels more), and hard-link
/// (or rename) files into other directories (npm's cache, git's objects). The token keeps the
/// step out of the cache, so it really runs.
#[test]
fn a_build_step_writes_big_files_and_links_across_directories() {
    let state = State::new("tmpl-big");
    let ctx = TempDir::new("ctx-big");
    let token = format!("{:x}", rand());
    let dockerfile = busybox_context(
        ctx.path(),
        &format!(
            "RUN echo {token} && dd if=/dev/zero of=/big bs=1048576 count=80 && rm /big && \
             mkdir -p /x/a /x/b && echo hi > /x/a/f && ln /x/a/f /x/b/f && cat /x/b/f\n"
        ),
    );
    state.build_ok(&dockerfile, "big");
}

#[test]
fn a_dockerfile_sets_env_workdir_user_and_copies_with_owners() {
    let state = State::new("tmpl-docker");
    let ctx = TempDir::new("ctx-docker");
    fs::create_dir(ctx.path().join("app")).unwrap();
    fs::write(ctx.path().join("app/main.sh"), "echo app says $1\n").unwrap();
    let dockerfile = busybox_context(
        ctx.path(),
        "ARG GREETING=hi\n\
         ENV APP_HOME=/srv/app \\\n    MODE=\"test mode\"\n\
         WORKDIR $APP_HOME\n\
         COPY --chown=1000:1000 app/ ./\n\
         RUN echo \"$GREETING from $MODE\" > built.txt\n\
         USER user\n\
         RUN id -u > /srv/app/built-as\n",
    );
    state.build_ok(&dockerfile, "dock");
    let run = state.run(
        "dock",
        &[],
        &[
            "sh",
            "-c",
            "pwd; id -u; echo $APP_HOME $MODE; cat built.txt built-as; sh main.sh ok; \
             stat -c %u:%g main.sh; echo GREETING=$GREETING",
        ],
    );
    run.ok();
    assert_eq!(
        run.stdout,
        "/srv/app\n1000\n/srv/app test mode\nhi from test mode\n1000\napp says ok\n1000:1000\nGREETING=\n"
    );
    // --build-arg overrides the ARG default.
    state.build(&dockerfile, "dock2", &["--build-arg", "GREETING=hello"]);
    let run = state.run("dock2", &[], &["cat", "/srv/app/built.txt"]);
    run.ok();
    assert_eq!(run.stdout, "hello from test mode\n");
}

#[test]
fn a_template_pushed_to_a_registry_is_the_base_of_another() {
    let state = State::new("tmpl-registry");
    let registry = Registry::start();
    let ctx = TempDir::new("ctx-registry");
    let dockerfile = busybox_context(ctx.path(), "RUN echo from-the-pushed-image > /pushed\n");
    state.build_ok(&dockerfile, "pushed");
    let reference = format!("{}/husk/pushed:v1", registry.addr);
    let out = common::husk(&[
        "template",
        "export",
        "pushed",
        "--push",
        &reference,
        "--state-dir",
        state.path().to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    // An OCI layout tar too.
    let tar = ctx.path().join("pushed.tar");
    let out = common::husk(&[
        "template",
        "export",
        "pushed",
        "--output",
        tar.to_str().unwrap(),
        "--state-dir",
        state.path().to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    assert!(fs::metadata(&tar).unwrap().len() > 100_000);
    // Another state directory, as another husk host: FROM the registry.
    let other = State::new("tmpl-registry-2");
    let ctx2 = TempDir::new("ctx-registry-2");
    let df = ctx2.path().join("Dockerfile");
    fs::write(
        &df,
        format!("FROM {reference}\nRUN echo built-on-top > /top\n"),
    )
    .unwrap();
    other.build_ok(&df, "derived");
    let run = other.run(
        "derived",
        &[],
        &["sh", "-c", "cat /pushed /top; ls /bin/ls"],
    );
    run.ok();
    assert_eq!(run.stdout, "from-the-pushed-image\nbuilt-on-top\n/bin/ls\n");
    // A tag that does not exist is a clear error naming it.
    fs::write(&df, format!("FROM {}/husk/nothing:v9\n", registry.addr)).unwrap();
    let (code, _, err) = other.build(&df, "nothing", &[]);
    assert_ne!(code, 0);
    assert!(
        err.contains("husk/nothing:v9") && err.contains("not found"),
        "{err}"
    );
    assert!(!other.names().contains(&"nothing".to_string()));
}

#[test]
fn bad_specs_and_dockerfiles_fail_clearly_and_leave_no_template() {
    let state = State::with_private_cache("tmpl-bad");
    let ctx = TempDir::new("ctx-bad");
    let toml = ctx.path().join("husk.toml");
    let cases: Vec<(&str, std::path::PathBuf, String, i32)> = vec![
        (
            "unknown key",
            {
                fs::write(&toml, "[base]\ndebian = \"bookworm\"\ncolour = \"blue\"\n").unwrap();
                toml.clone()
            },
            "unknown key 'colour' in [base]".to_string(),
            125,
        ),
        (
            "unsupported instruction",
            busybox_context(ctx.path(), "RUN true\nEXPOSE 8080\n"),
            "Dockerfile:6: EXPOSE is not supported".to_string(),
            125,
        ),
    ];
    for (what, file, expected, code) in cases {
        let (got, _, err) = state.build(&file, "bad", &[]);
        assert_eq!(got, code, "{what}: {err}");
        assert!(
            err.contains(&expected),
            "{what}: expected {expected:?} in:\n{err}"
        );
    }
    // A failing step: its origin, exit code and the tail of its output.
    let df = busybox_context(
        ctx.path(),
        "RUN echo about to fail; echo details >&2; exit 3\n",
    );
    let (code, _, err) = state.build(&df, "bad", &[]);
    assert_eq!(code, 1, "{err}");
    for part in ["Dockerfile:5", "exit code 3", "details"] {
        assert!(err.contains(part), "{part:?} missing in:\n{err}");
    }
    // A missing package.
    fs::write(
        &toml,
        "[base]\ndebian = \"bookworm\"\n[packages]\napt = [\"husk-no-such-package\"]\n",
    )
    .unwrap();
    let (code, _, err) = state.build(&toml, "bad", &[]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("husk-no-such-package") && err.contains("mmdebstrap failed"),
        "{err}"
    );
    assert!(
        state.names().is_empty(),
        "a failed build registered a template"
    );
    assert!(leftovers(&state).is_empty(), "{:?}", leftovers(&state));
    // The steps that succeeded before the failing one are cached; the failing one is not.
    let layers = fs::read_dir(&state.cache).unwrap().count();
    assert!(layers >= 3, "{layers} layers cached");
    // Nothing was written to the image store either.
    let images = state.path().join("templates/images");
    let n = fs::read_dir(&images).map_or(0, |r| r.count());
    assert_eq!(n, 0, "images left in {}", images.display());
}

#[test]
fn a_damaged_image_is_refused_at_sandbox_creation() {
    let state = State::new("tmpl-damaged");
    let ctx = TempDir::new("ctx-damaged");
    let dockerfile = busybox_context(ctx.path(), "RUN echo fine > /state\n");
    state.build_ok(&dockerfile, "damaged");
    // The build records the image it hashed as it wrote it, for the spawners: the first
    // sandbox mounts it without reading it all again (minutes of a big image, unoptimized).
    let image = state.image("damaged");
    let hex = image.file_stem().unwrap().to_str().unwrap();
    let marker = fs::read_to_string(format!("/run/husk/images/{hex}.verified")).unwrap_or_default();
    assert!(
        marker.contains(image.to_str().unwrap()) && marker.contains(hex),
        "{marker:?}"
    );
    state.run("damaged", &[], &["cat", "/state"]).ok();
    let len = fs::metadata(&image).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&image)
        .unwrap()
        .set_len(len - 4096)
        .unwrap();
    let run = state.run("damaged", &[], &["cat", "/state"]);
    assert_ne!(run.code, 0, "a truncated image was used");
    assert!(
        run.stderr.contains("damaged") && run.stderr.contains("rebuild the template"),
        "{}",
        run.stderr
    );
    // Same size, different content: the digest check catches it.
    state.build_ok(&dockerfile, "damaged");
    let image = state.image("damaged");
    let mut bytes = fs::read(&image).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    fs::write(&image, &bytes).unwrap();
    let run = state.run("damaged", &[], &["cat", "/state"]);
    assert_ne!(run.code, 0, "a corrupted image was used");
    assert!(
        run.stderr.contains("does not match its digest"),
        "{}",
        run.stderr
    );
    // Rebuilding repairs it: the damaged file is not reused for the same layers.
    let progress = state.build_ok(&dockerfile, "damaged");
    assert!(cached(&progress, "RUN echo fine"), "{progress}");
    state.run("damaged", &[], &["cat", "/state"]).ok();
    let image = state.image("damaged");
    // A missing one.
    fs::remove_file(&image).unwrap();
    let run = state.run("damaged", &[], &["true"]);
    assert_ne!(run.code, 0);
    assert!(run.stderr.contains("missing"), "{}", run.stderr);
}
