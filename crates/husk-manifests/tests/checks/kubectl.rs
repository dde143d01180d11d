//! The tests' model of kustomize against the real one, where `kubectl` is installed: each
//! kustomization, built by `kubectl kustomize` on a copy with stand-in secret files, makes the
//! same objects (kind, name, namespace) as the model says, each the same field for field (read
//! into its API type on both sides; the generated Secrets' names without kustomize's hash
//! suffix, and their contents, which are stand-ins, aside: of those, the type, the keys and
//! whether the name is hashed are compared). Without kubectl this check says so and passes:
//! the model's own checks still run.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use super::assert_none;
use crate::support::kustomize::{roots, Build};
use crate::support::{documents, kubernetes_dir, parse_object, shown, Object};

/// At most this many differing fields are named per object.
const SHOWN_DIFFERENCES: usize = 8;

/// (kind, name, namespace) of `object`.
fn key(object: &Object) -> (String, String, String) {
    let meta = object.metadata();
    let ns = match object {
        Object::Namespace(_) => String::new(),
        _ => meta.namespace.clone().unwrap_or_default(),
    };
    (
        object.kind().to_owned(),
        meta.name.clone().unwrap_or_default(),
        ns,
    )
}

/// (kind, name, namespace) of every object `build` makes; a generated Secret's name is the
/// generator's (kustomize adds a hash of the content).
fn modelled(build: &Build) -> BTreeSet<(String, String, String)> {
    let mut out: BTreeSet<_> = build.docs.iter().map(|d| key(&d.object)).collect();
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

/// `name` without the suffix kustomize gives a generated Secret's name (`-` and ten
/// characters of its content's hash), if it is one of `generated`.
fn unhashed<'a>(name: &'a str, generated: &BTreeSet<&str>) -> &'a str {
    match name.rsplit_once('-') {
        Some((base, hash))
            if generated.contains(base)
                && hash.len() == 10
                && hash
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()) =>
        {
            base
        }
        _ => name,
    }
}

/// `value` with every string that names a generated Secret (its references in pods) unhashed.
fn unhash_all(value: &mut Value, generated: &BTreeSet<&str>) {
    match value {
        Value::String(s) => {
            let plain = unhashed(s, generated);
            if plain.len() != s.len() {
                *s = plain.to_owned();
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| unhash_all(v, generated)),
        Value::Object(fields) => fields.values_mut().for_each(|v| unhash_all(v, generated)),
        _ => {}
    }
}

/// Where `a` and `b` differ (`path: a / b`).
fn differences(a: &Value, b: &Value, path: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for key in keys {
                let (l, r) = (
                    x.get(key).unwrap_or(&Value::Null),
                    y.get(key).unwrap_or(&Value::Null),
                );
                differences(l, r, &format!("{path}.{key}"), out);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (l, r)) in x.iter().zip(y).enumerate() {
                differences(l, r, &format!("{path}[{i}]"), out);
            }
        }
        (x, y) if x == y => {}
        (x, y) => out.push(format!("{path}: {x} / {y}")),
    }
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
        let generated: BTreeSet<&str> = build.secrets.keys().map(String::as_str).collect();
        // (kind, name, namespace) -> the object as its API type writes it; generated Secrets
        // by name only (their contents are the stand-ins here).
        let mut real_objects = BTreeMap::new();
        let mut real = BTreeSet::new();
        for v in documents(&built).expect("kubectl's output is YAML") {
            let kind = v["kind"].as_str().unwrap_or_default().to_owned();
            let name = v["metadata"]["name"].as_str().unwrap_or_default();
            let plain = unhashed(name, &generated);
            let ns = v["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let id = (kind.clone(), plain.to_owned(), ns);
            real.insert(id.clone());
            if kind == "Secret" && build.generated_types.contains_key(plain) {
                // A generated Secret: its type and keys as the model says, its name hashed
                // exactly where the model says it is not fixed.
                let fixed = build.fixed_names.contains(plain);
                if fixed != (plain == name) {
                    errors.push(format!(
                        "{}: kubectl names the generated Secret {plain} {name:?}, which the \
                         model says is {}",
                        shown(&root),
                        if fixed { "fixed" } else { "hashed" }
                    ));
                }
                let real_type = v["type"].as_str().unwrap_or("Opaque");
                let model_type = build.generated_types.get(plain).map(String::as_str);
                if model_type != Some(real_type) {
                    errors.push(format!(
                        "{}: kubectl makes Secret {plain} of type {real_type}, the model \
                         {model_type:?}",
                        shown(&root)
                    ));
                }
                let real_keys: BTreeSet<String> = v["data"]
                    .as_object()
                    .map(|d| d.keys().cloned().collect())
                    .unwrap_or_default();
                if build.secrets.get(plain) != Some(&real_keys) {
                    errors.push(format!(
                        "{}: kubectl gives Secret {plain} the keys {real_keys:?}, the model {:?}",
                        shown(&root),
                        build.secrets.get(plain)
                    ));
                }
                continue;
            }
            match parse_object(&v) {
                Ok(object) => {
                    let mut value = object.to_value();
                    unhash_all(&mut value, &generated);
                    real_objects.insert(id, value);
                }
                Err(e) => errors.push(format!(
                    "{}: kubectl makes {kind}/{name}, which does not read: {e}",
                    shown(&root)
                )),
            }
        }
        let model = modelled(&build);
        if real != model {
            errors.push(format!(
                "{}: kubectl makes {:?} that the model does not, and not {:?} that it does",
                shown(&root),
                real.difference(&model).collect::<Vec<_>>(),
                model.difference(&real).collect::<Vec<_>>()
            ));
        }
        for doc in &build.docs {
            let Some(real) = real_objects.get(&key(&doc.object)) else {
                continue;
            };
            let mut found = Vec::new();
            differences(&doc.object.to_value(), real, "", &mut found);
            if !found.is_empty() {
                let more = found.len().saturating_sub(SHOWN_DIFFERENCES);
                found.truncate(SHOWN_DIFFERENCES);
                errors.push(format!(
                    "{}: {} differs between the model and kubectl (model / kubectl): {}{}",
                    shown(&root),
                    doc.object.id(),
                    found.join("; "),
                    if more > 0 {
                        format!("; and {more} more")
                    } else {
                        String::new()
                    }
                ));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&copy);
    assert_none("kustomize's model", errors);
}
