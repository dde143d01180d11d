//! The tests' model of kustomize against the real one, where `kubectl` is installed: each
//! kustomization, built by `kubectl kustomize` on a copy with stand-in secret files, makes the
//! same objects (kind, name, namespace) as the model says. Without kubectl this check says so
//! and passes: the model's own checks still run.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use super::assert_none;
use crate::support::kustomize::{roots, Build};
use crate::support::{documents, kubernetes_dir, shown, Object};

/// (kind, name, namespace) of every object `build` makes; a generated Secret's name is the
/// generator's (kustomize adds a hash of the content).
fn modelled(build: &Build) -> BTreeSet<(String, String, String)> {
    let mut out: BTreeSet<_> = build
        .docs
        .iter()
        .map(|d| {
            let meta = d.object.metadata();
            let kind = d
                .object
                .id()
                .split('/')
                .next()
                .unwrap_or_default()
                .to_owned();
            let ns = match d.object {
                Object::Namespace(_) => String::new(),
                _ => meta.namespace.clone().unwrap_or_default(),
            };
            (kind, meta.name.clone().unwrap_or_default(), ns)
        })
        .collect();
    let written: BTreeSet<String> = out
        .iter()
        .filter(|(k, _, _)| k == "Secret")
        .map(|(_, n, _)| n.clone())
        .collect();
    for name in build.secrets.keys().filter(|n| !written.contains(*n)) {
        out.insert(("Secret".into(), name.clone(), "husk".into()));
    }
    out
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

#[test]
fn kubectl_kustomize_makes_what_the_model_says() {
    let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into());
    let has_kubectl = Command::new(&kubectl)
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_kubectl {
        eprintln!("no {kubectl}: the model of kustomize is not compared with the real one");
        return;
    }
    let dir = kubernetes_dir();
    let copy = std::env::temp_dir().join(format!("husk-manifests-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&copy);
    copy_dir(&dir, &copy).expect("copy deploy/kubernetes");
    let mut errors = Vec::new();
    for (root, build) in roots(&dir) {
        for (kdir, file) in &build.generator_files {
            let rel = kdir.strip_prefix(&dir).expect("inside deploy/kubernetes");
            std::fs::write(copy.join(rel).join(file), "stand-in").expect("write a stand-in");
        }
        let rel = root.strip_prefix(&dir).expect("inside deploy/kubernetes");
        let out = Command::new(&kubectl)
            .arg("kustomize")
            .arg(copy.join(rel))
            .output()
            .expect("run kubectl kustomize");
        if !out.status.success() {
            errors.push(format!(
                "kubectl kustomize {}: {}",
                shown(&root),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
            continue;
        }
        let built = copy.join("built.yaml");
        std::fs::write(&built, &out.stdout).expect("write kubectl's output");
        let real: BTreeSet<_> = documents(&built)
            .expect("kubectl's output is YAML")
            .iter()
            .map(|v| {
                let kind = v["kind"].as_str().unwrap_or_default().to_owned();
                let mut name = v["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                if kind == "Secret"
                    && build
                        .secrets
                        .keys()
                        .any(|s| name.starts_with(&format!("{s}-")))
                {
                    name.truncate(name.rfind('-').unwrap_or(name.len()));
                }
                let ns = v["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                (kind, name, ns)
            })
            .collect();
        let model = modelled(&build);
        if real != model {
            errors.push(format!(
                "{}: kubectl makes {:?} that the model does not, and not {:?} that it does",
                shown(&root),
                real.difference(&model).collect::<Vec<_>>(),
                model.difference(&real).collect::<Vec<_>>()
            ));
        }
    }
    let _ = std::fs::remove_dir_all(&copy);
    assert_none("kustomize's model", errors);
}
