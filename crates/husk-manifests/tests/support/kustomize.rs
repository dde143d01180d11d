//! What `kubectl apply -k DIR` would apply, as far as husk's kustomizations go: their
//! resources, components, namespace, Secret generators and strategic merge patches. A
//! kustomization field this model does not know fails to read (`deny_unknown_fields`), and so
//! does a patch it cannot apply as kustomize would, so that a new feature (labels, images,
//! JSON patches) comes with the model's understanding of it instead of being ignored.
//! `checks::kubectl` compares what the model makes with what `kubectl kustomize` makes, object
//! by object and field by field, where kubectl is installed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use super::{documents, parse_object, shown, Object};

const KUSTOMIZATION_API: &str = "kustomize.config.k8s.io/v1beta1";
const COMPONENT_API: &str = "kustomize.config.k8s.io/v1alpha1";

/// A `kustomization.yaml` (kind `Kustomization` or `Component`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Kustomization {
    pub api_version: String,
    pub kind: String,
    pub namespace: Option<String>,
    #[serde(default)]
    pub resources: Vec<String>,
    #[serde(default)]
    pub components: Vec<String>,
    #[serde(default)]
    pub secret_generator: Vec<SecretGenerator>,
    #[serde(default)]
    pub patches: Vec<Patch>,
}

/// A `patches` entry: a strategic merge patch in a file, applied to the one object its
/// apiVersion, kind and name (and namespace, if it gives one) name, as kustomize does when no
/// `target` is given. Inline patches, targets and JSON 6902 patches are not modelled.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Patch {
    pub path: String,
}

/// A `secretGenerator` entry: a Secret made from files, one key each.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretGenerator {
    pub name: String,
    /// The Secret's type (`kubernetes.io/tls`); kustomize makes `Opaque` ones without it.
    #[serde(rename = "type")]
    pub type_: Option<String>,
    #[serde(default)]
    pub files: Vec<String>,
    #[serde(default)]
    pub options: GeneratorOptions,
}

/// A generator's `options`, as far as husk uses them.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GeneratorOptions {
    /// The Secret keeps its name (no hash of its content as a suffix).
    #[serde(default)]
    pub disable_name_suffix_hash: bool,
}

impl SecretGenerator {
    /// Each file's key and path (`key=path`, or the path alone, whose file name is the key).
    pub fn entries(&self) -> Vec<(String, String)> {
        self.files
            .iter()
            .map(|f| match f.split_once('=') {
                Some((key, path)) => (key.to_owned(), path.to_owned()),
                None => {
                    let key = Path::new(f)
                        .file_name()
                        .map_or_else(|| f.clone(), |n| n.to_string_lossy().into_owned());
                    (key, f.clone())
                }
            })
            .collect()
    }
}

/// Reads `dir/kustomization.yaml` and checks its apiVersion against its kind.
pub fn read(dir: &Path) -> Result<Kustomization, String> {
    let path = dir.join("kustomization.yaml");
    let mut docs = documents(&path)?;
    if docs.len() != 1 {
        return Err(format!(
            "{}: {} documents, not one",
            shown(&path),
            docs.len()
        ));
    }
    let k: Kustomization =
        serde_json::from_value(docs.remove(0)).map_err(|e| format!("{}: {e}", shown(&path)))?;
    let api = match k.kind.as_str() {
        "Kustomization" => KUSTOMIZATION_API,
        "Component" => COMPONENT_API,
        other => return Err(format!("{}: unknown kind {other:?}", shown(&path))),
    };
    if k.api_version != api {
        return Err(format!(
            "{}: a {} is apiVersion {api}, not {}",
            shown(&path),
            k.kind,
            k.api_version
        ));
    }
    Ok(k)
}

/// An object and the file it came from.
#[derive(Debug, Clone)]
pub struct Doc {
    pub file: PathBuf,
    pub object: Object,
}

/// What applying one kustomization would create.
#[derive(Debug, Default)]
pub struct Build {
    pub docs: Vec<Doc>,
    /// Secrets by name, with their keys: those written as objects and those generated.
    pub secrets: BTreeMap<String, BTreeSet<String>>,
    /// Every manifest file read (resources and patches).
    pub files: BTreeSet<PathBuf>,
    /// The directory of every component used, canonical.
    pub components: BTreeSet<PathBuf>,
    /// Every generator file named: (kustomization directory, path as written).
    pub generator_files: Vec<(PathBuf, String)>,
    /// Generated Secrets whose names get no hash suffix (edited in place, not rolled).
    pub fixed_names: BTreeSet<String>,
    /// Generated Secrets by name, with their type (`Opaque` unless the generator says).
    pub generated_types: BTreeMap<String, String>,
}

/// Builds the kustomization in `dir` (kind `Kustomization`).
pub fn build(dir: &Path) -> Result<Build, String> {
    let mut out = Build::default();
    let mut docs = Vec::new();
    gather(dir, "Kustomization", &mut docs, &mut out, &mut Vec::new())?;
    out.docs = docs;
    for doc in &out.docs {
        if let Object::Secret(s) = &doc.object {
            let keys = out
                .secrets
                .entry(s.metadata.name.clone().unwrap_or_default())
                .or_default();
            keys.extend(s.data.iter().flat_map(|d| d.keys().cloned()));
            keys.extend(s.string_data.iter().flat_map(|d| d.keys().cloned()));
        }
    }
    Ok(out)
}

/// Gathers the kustomization in `dir` into `docs`. A `Kustomization` starts from nothing (the
/// caller gives it an empty `docs`); a `Component` is applied to what the kustomization that
/// names it has gathered so far, as kustomize does: its resources join them, and its patches
/// and namespace apply to all of them. `visiting` holds the directories of the
/// kustomizations that led here.
fn gather(
    dir: &Path,
    kind: &str,
    docs: &mut Vec<Doc>,
    out: &mut Build,
    visiting: &mut Vec<PathBuf>,
) -> Result<(), String> {
    let k = read(dir)?;
    let here = shown(&dir.join("kustomization.yaml"));
    if k.kind != kind {
        return Err(format!("{here}: used as a {kind}, but is a {}", k.kind));
    }
    // kustomize refuses a kustomization whose directory holds one it came from (an overlay
    // inside its base's directory): "cycle detected".
    let canonical = dir
        .canonicalize()
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    if let Some(inner) = visiting.iter().find(|v| v.starts_with(&canonical)) {
        return Err(format!(
            "{here}: its directory contains {}, which uses it (kustomize: cycle detected)",
            shown(inner)
        ));
    }
    if kind == "Component" {
        out.components.insert(canonical.clone());
    }
    visiting.push(canonical);
    let gathered = gather_in(dir, &k, &here, docs, out, visiting);
    visiting.pop();
    gathered
}

fn gather_in(
    dir: &Path,
    k: &Kustomization,
    here: &str,
    docs: &mut Vec<Doc>,
    out: &mut Build,
    visiting: &mut Vec<PathBuf>,
) -> Result<(), String> {
    for resource in &k.resources {
        let path = dir.join(resource);
        if path.is_dir() {
            // Built on its own: its namespace and patches are its own business.
            let mut own = Vec::new();
            gather(&path, "Kustomization", &mut own, out, visiting)?;
            docs.extend(own);
        } else if path.is_file() {
            for value in documents(&path)? {
                let object = parse_object(&value).map_err(|e| format!("{}: {e}", shown(&path)))?;
                docs.push(Doc {
                    file: path.clone(),
                    object,
                });
            }
            out.files.insert(path.canonicalize().unwrap_or(path));
        } else {
            return Err(format!("{here}: resource {resource} does not exist"));
        }
    }
    for component in &k.components {
        let path = dir.join(component);
        if !path.join("kustomization.yaml").is_file() {
            return Err(format!(
                "{here}: component {component} is not a directory with a kustomization.yaml"
            ));
        }
        gather(&path, "Component", docs, out, visiting)?;
    }
    for generator in &k.secret_generator {
        if generator.options.disable_name_suffix_hash {
            out.fixed_names.insert(generator.name.clone());
        }
        out.generated_types.insert(
            generator.name.clone(),
            generator.type_.clone().unwrap_or_else(|| "Opaque".into()),
        );
        let keys = out.secrets.entry(generator.name.clone()).or_default();
        for (key, path) in generator.entries() {
            keys.insert(key);
            out.generator_files.push((dir.to_owned(), path));
        }
    }
    // kustomize's transformers run patches before the namespace: a patch names its object as
    // the resource's file does.
    for patch in &k.patches {
        if !stays_inside(&patch.path) {
            return Err(format!(
                "{here}: patch {} is outside the kustomization",
                patch.path
            ));
        }
        let path = dir.join(&patch.path);
        if !path.is_file() {
            return Err(format!("{here}: patch {} does not exist", patch.path));
        }
        apply_patch(&path, docs)?;
        out.files.insert(path.canonicalize().unwrap_or(path));
    }
    if let Some(ns) = &k.namespace {
        for doc in docs.iter_mut() {
            if !matches!(doc.object, Object::Namespace(_)) {
                doc.object.metadata_mut().namespace = Some(ns.clone());
            }
        }
    }
    Ok(())
}

/// Lists a strategic merge patch merges element by element, by where they are (`[]`: any
/// element of a list), and the field that names an element (the API's patchMergeKey). The
/// model refuses a patch that reaches into any other list of an object: kustomize replaces
/// some lists whole and merges others by keys of their own, and the model must not guess.
const MERGE_KEYS: [(&str, &str); 8] = [
    ("spec.template.spec.containers", "name"),
    ("spec.template.spec.containers[].ports", "containerPort"),
    ("spec.template.spec.initContainers", "name"),
    ("spec.template.spec.volumes", "name"),
    ("spec.template.spec.containers[].env", "name"),
    ("spec.template.spec.containers[].volumeMounts", "mountPath"),
    ("spec.template.spec.initContainers[].env", "name"),
    (
        "spec.template.spec.initContainers[].volumeMounts",
        "mountPath",
    ),
];

/// Applies the strategic merge patch in `path` to the one object of `docs` it names.
fn apply_patch(path: &Path, docs: &mut [Doc]) -> Result<(), String> {
    let at = shown(path);
    let mut patches = documents(path)?;
    if patches.len() != 1 {
        return Err(format!(
            "{at}: {} documents; the model applies one patch a file",
            patches.len()
        ));
    }
    let patch = patches.remove(0);
    let field = |f: &str| patch.pointer(f).and_then(Value::as_str);
    let (Some(api), Some(kind), Some(name)) = (
        field("/apiVersion"),
        field("/kind"),
        field("/metadata/name"),
    ) else {
        return Err(format!(
            "{at}: a strategic merge patch names its object: apiVersion, kind, metadata.name"
        ));
    };
    let namespace = field("/metadata/namespace");
    let targets: Vec<usize> = docs
        .iter()
        .enumerate()
        .filter(|(_, d)| {
            let meta = d.object.metadata();
            d.object.kind() == kind
                && meta.name.as_deref() == Some(name)
                && namespace.is_none_or(|ns| meta.namespace.as_deref() == Some(ns))
        })
        .map(|(i, _)| i)
        .collect();
    let [target] = targets[..] else {
        return Err(format!(
            "{at}: patches {kind}/{name}, which {} objects gathered so far are",
            targets.len()
        ));
    };
    let doc = &mut docs[target];
    let mut value = doc.object.to_value();
    if value["apiVersion"].as_str() != Some(api) {
        return Err(format!(
            "{at}: patches {kind}/{name} of {api}, which is {}",
            value["apiVersion"]
        ));
    }
    merge(&mut value, &patch, "").map_err(|e| format!("{at}: {e}"))?;
    doc.object =
        parse_object(&value).map_err(|e| format!("{at}: the patched {kind}/{name}: {e}"))?;
    Ok(())
}

/// Merges `patch` into `target` as a strategic merge patch does: maps key by key (`null`
/// removes a key), the lists of [`MERGE_KEYS`] element by element (the patch's elements first,
/// in its order, each merged into the target's element of the same key or new; then the
/// target's elements the patch does not name, in their order: what kustomize makes), anything
/// else replaced. `at` is where `target` is, for [`MERGE_KEYS`] and messages.
fn merge(target: &mut Value, patch: &Value, at: &str) -> Result<(), String> {
    let join = |key: &str| {
        if at.is_empty() {
            key.to_owned()
        } else {
            format!("{at}.{key}")
        }
    };
    match patch {
        Value::Object(fields) => {
            if !target.is_object() {
                *target = Value::Object(serde_json::Map::new());
            }
            let map = target.as_object_mut().expect("made an object");
            for (key, value) in fields {
                if key.starts_with('$') {
                    return Err(format!("{}: directive {key} is not modelled", join(key)));
                }
                if value.is_null() {
                    map.remove(key);
                } else {
                    merge(
                        map.entry(key.clone()).or_insert(Value::Null),
                        value,
                        &join(key),
                    )?;
                }
            }
            Ok(())
        }
        // A list the target does not have yet is the patch's, whatever its kind.
        Value::Array(_) if target.is_null() => {
            no_directives(patch, at)?;
            *target = patch.clone();
            Ok(())
        }
        Value::Array(elements) => {
            let Some((_, key)) = MERGE_KEYS.iter().find(|(path, _)| *path == at) else {
                return Err(format!(
                    "{at}: the model does not know how kustomize merges this list \
                     (support::kustomize::MERGE_KEYS)"
                ));
            };
            let mut rest = match target.take() {
                Value::Array(old) => old,
                Value::Null => Vec::new(),
                other => return Err(format!("{at}: patches {other} with a list")),
            };
            let mut merged = Vec::new();
            for element in elements {
                let Some(id) = element.get(*key).filter(|v| !v.is_null()) else {
                    return Err(format!("{at}: an element without its {key}"));
                };
                let mut into = match rest.iter().position(|old| old.get(*key) == Some(id)) {
                    Some(i) => rest.remove(i),
                    None => Value::Null,
                };
                merge(&mut into, element, &format!("{at}[]"))?;
                merged.push(into);
            }
            merged.extend(rest);
            *target = Value::Array(merged);
            Ok(())
        }
        scalar => {
            *target = scalar.clone();
            Ok(())
        }
    }
}

/// Refuses a strategic merge patch's directives (`$patch`, `$retainKeys`, ...) anywhere in
/// `value`: the model does not apply them.
fn no_directives(value: &Value, at: &str) -> Result<(), String> {
    match value {
        Value::Object(fields) => fields.iter().try_for_each(|(key, v)| {
            if key.starts_with('$') {
                Err(format!("{at}.{key}: directive {key} is not modelled"))
            } else {
                no_directives(v, &format!("{at}.{key}"))
            }
        }),
        Value::Array(elements) => elements
            .iter()
            .try_for_each(|v| no_directives(v, &format!("{at}[]"))),
        _ => Ok(()),
    }
}

/// Whether `path` (as written in a kustomization) stays inside the kustomization's own
/// directory: kustomize refuses to read files outside it by default.
pub fn stays_inside(path: &str) -> bool {
    Path::new(path)
        .components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

/// Every kustomization under `dir` that `kubectl apply -k` can apply (kind `Kustomization`:
/// the base and its overlays), built. A kustomization that does not build panics; the test of
/// the kustomizations says why in full.
pub fn roots(dir: &Path) -> Vec<(PathBuf, Build)> {
    let mut out = Vec::new();
    for path in super::yaml_files(dir) {
        if !super::is_kustomization(&path) {
            continue;
        }
        let root = path.parent().unwrap_or(dir).to_owned();
        if read(&root).is_ok_and(|k| k.kind == "Kustomization") {
            let build = build(&root).unwrap_or_else(|e| panic!("{e}"));
            out.push((root, build));
        }
    }
    out
}
