//! What `kubectl apply -k DIR` would apply, as far as husk's kustomizations go: their
//! resources, components, namespace and Secret generators. A kustomization field this model
//! does not know fails to read (`deny_unknown_fields`), so that a new feature (patches,
//! labels, images) comes with the model's understanding of it instead of being ignored.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

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
}

/// A `secretGenerator` entry: a Secret made from files, one key each.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretGenerator {
    pub name: String,
    #[serde(default)]
    pub files: Vec<String>,
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
    /// Every manifest file read.
    pub files: BTreeSet<PathBuf>,
    /// Every generator file named: (kustomization directory, path as written).
    pub generator_files: Vec<(PathBuf, String)>,
}

/// Builds the kustomization in `dir` (kind `Kustomization`).
pub fn build(dir: &Path) -> Result<Build, String> {
    let mut out = Build::default();
    let docs = gather(dir, "Kustomization", &mut out, &mut Vec::new())?;
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

/// Gathers the objects of the kustomization in `dir`; `visiting` holds the directories of the
/// kustomizations that led here.
fn gather(
    dir: &Path,
    kind: &str,
    out: &mut Build,
    visiting: &mut Vec<PathBuf>,
) -> Result<Vec<Doc>, String> {
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
    visiting.push(canonical);
    let docs = gather_in(dir, &k, &here, out, visiting);
    visiting.pop();
    docs
}

fn gather_in(
    dir: &Path,
    k: &Kustomization,
    here: &str,
    out: &mut Build,
    visiting: &mut Vec<PathBuf>,
) -> Result<Vec<Doc>, String> {
    let mut docs = Vec::new();
    for resource in &k.resources {
        let path = dir.join(resource);
        if path.is_dir() {
            docs.extend(gather(&path, "Kustomization", out, visiting)?);
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
        docs.extend(gather(&path, "Component", out, visiting)?);
    }
    for generator in &k.secret_generator {
        let keys = out.secrets.entry(generator.name.clone()).or_default();
        for (key, path) in generator.entries() {
            keys.insert(key);
            out.generator_files.push((dir.to_owned(), path));
        }
    }
    if let Some(ns) = &k.namespace {
        for doc in &mut docs {
            if !matches!(doc.object, Object::Namespace(_)) {
                doc.object.metadata_mut().namespace = Some(ns.clone());
            }
        }
    }
    Ok(docs)
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
