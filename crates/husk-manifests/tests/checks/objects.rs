//! Every manifest is a Kubernetes object of a known kind, every kustomization applies (it names
//! only files that exist, and every manifest is in one), and the image is husk's, at the
//! workspace's version, as deploy/Dockerfile builds it.

use std::collections::BTreeSet;

use super::assert_none;
use crate::support::kustomize::{self, stays_inside};
use crate::support::{
    documents, husk, is_kustomization, kubernetes_dir, parse_object, pods, shown, workspace_root,
    yaml_files, Object,
};

/// The workspace's version: the image's tag.
const VERSION: &str = env!("CARGO_PKG_VERSION");

#[test]
fn every_manifest_parses_as_its_kubernetes_type() {
    let mut errors = Vec::new();
    let mut objects = 0;
    for path in yaml_files(&kubernetes_dir()) {
        if is_kustomization(&path) {
            let dir = path.parent().expect("a file has a directory");
            if let Err(e) = kustomize::read(dir) {
                errors.push(e);
            }
            continue;
        }
        let values = match documents(&path) {
            Ok(v) => v,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        for (i, value) in values.iter().enumerate() {
            let at = format!("{} (document {})", shown(&path), i + 1);
            match parse_object(value) {
                Ok(object) if object.metadata().name.is_none() => {
                    errors.push(format!("{at}: {} has no name", object.id()));
                }
                Ok(_) => objects += 1,
                Err(e) => errors.push(format!("{at}: {e}")),
            }
        }
    }
    assert_none("manifests that are not valid Kubernetes objects", errors);
    // The base has a dozen; a walk that found none would prove nothing.
    assert!(
        objects >= 10,
        "only {objects} objects under deploy/kubernetes"
    );
}

#[test]
fn kustomizations_name_only_files_that_exist_and_every_manifest_is_in_one() {
    let dir = kubernetes_dir();
    let mut errors = Vec::new();
    let mut used = BTreeSet::new();
    let mut roots = Vec::new();
    for path in yaml_files(&dir).into_iter().filter(|p| is_kustomization(p)) {
        let root = path.parent().expect("a file has a directory");
        match kustomize::read(root) {
            Ok(k) if k.kind == "Kustomization" => match kustomize::build(root) {
                Ok(build) => roots.push((root.to_owned(), build)),
                Err(e) => errors.push(e),
            },
            Ok(_) => {}
            Err(e) => errors.push(e),
        }
    }
    // Which files are used is known only when every kustomization built.
    let all_built = errors.is_empty();
    for (root, build) in &roots {
        let here = shown(root);
        used.extend(build.files.iter().cloned());
        for (kdir, file) in &build.generator_files {
            // The operator makes these files; they must stay out of git, and inside the
            // kustomization's directory (kustomize reads nothing outside it).
            if !stays_inside(file) {
                errors.push(format!(
                    "{}: generator file {file} is outside the kustomization",
                    shown(kdir)
                ));
                continue;
            }
            let parent = kdir.join(file);
            let parent = parent.parent().expect("a file has a directory");
            let ignored = std::fs::read_to_string(parent.join(".gitignore"))
                .is_ok_and(|t| t.lines().any(|l| l.trim() == "*"));
            if !ignored {
                errors.push(format!(
                    "{}: generator file {file}: its directory has no .gitignore with `*`: \
                     the operator's secrets could be committed",
                    shown(kdir)
                ));
            }
        }
        if !build.docs.iter().any(
            |d| matches!(&d.object, Object::Namespace(n) if n.metadata.name.as_deref() == Some("husk")),
        ) {
            errors.push(format!("{here}: does not create the namespace husk"));
        }
        for doc in &build.docs {
            let ns = doc.object.metadata().namespace.as_deref();
            if !matches!(doc.object, Object::Namespace(_)) && ns != Some("husk") {
                errors.push(format!(
                    "{here}: {} ({}) lands in namespace {ns:?}, not husk",
                    doc.object.id(),
                    shown(&doc.file)
                ));
            }
        }
    }
    for path in yaml_files(&dir).into_iter().filter(|_| all_built) {
        let canonical = path.canonicalize().unwrap_or_else(|_| path.clone());
        if !is_kustomization(&path) && !used.contains(&canonical) {
            errors.push(format!(
                "{} is in no kustomization: nothing applies it",
                shown(&path)
            ));
        }
    }
    let names: Vec<String> = roots.iter().map(|(r, _)| shown(r)).collect();
    for expected in [
        "deploy/kubernetes/base",
        "deploy/kubernetes/overlays/with-postgres",
        "deploy/kubernetes/overlays/with-shared-workspaces",
        "deploy/kubernetes/overlays/with-node-tls",
    ] {
        if !names.iter().any(|n| n == expected) {
            errors.push(format!("{expected} is not a kustomization that applies"));
        }
    }
    assert_none("kustomizations that do not apply as they should", errors);
}

#[test]
fn images_are_husk_at_the_workspace_version_and_the_dockerfile_builds_it() {
    let expected = format!("husk:{VERSION}");
    let mut errors = Vec::new();
    for (root, build) in kustomize::roots(&kubernetes_dir()) {
        for p in pods::all(&build.docs) {
            for c in pods::containers(p.spec) {
                let image = c.image.as_deref().unwrap_or_default();
                if husk::is_husk(c) {
                    if image != expected {
                        errors.push(format!(
                            "{}: {} container {} runs {image}, not {expected}",
                            shown(&root),
                            p.owner,
                            c.name
                        ));
                    }
                } else if !image.contains(':') || image.ends_with(":latest") {
                    errors.push(format!(
                        "{}: {} container {} runs {image:?}: name a release",
                        shown(&root),
                        p.owner,
                        c.name
                    ));
                }
            }
        }
    }
    let deploy = workspace_root().join("deploy");
    let dockerfile = std::fs::read_to_string(deploy.join("Dockerfile")).expect("deploy/Dockerfile");
    for needed in [
        "FROM debian:bookworm-slim".to_owned(),
        format!("docker build -f deploy/Dockerfile -t {expected} ."),
        format!("org.opencontainers.image.version=\"{VERSION}\""),
        "COPY target/x86_64-unknown-linux-gnu/release/husk /usr/local/bin/husk".to_owned(),
        // The manifests' args start with the subcommand.
        "ENTRYPOINT [\"/usr/local/bin/husk\"]".to_owned(),
    ] {
        if !dockerfile.contains(&needed) {
            errors.push(format!("deploy/Dockerfile does not say `{needed}`"));
        }
    }
    let ignore = std::fs::read_to_string(deploy.join("Dockerfile.dockerignore"))
        .expect("deploy/Dockerfile.dockerignore");
    if !ignore
        .lines()
        .any(|l| l == "!target/x86_64-unknown-linux-gnu/release/husk")
    {
        errors.push("deploy/Dockerfile.dockerignore keeps the binary out of the build".into());
    }
    assert_none("images", errors);
}
