//! What the tests share: where the manifests are, each manifest read into its Kubernetes API
//! type, and small models of what kustomize (`kustomize`), husk (`husk`) and the pod
//! controllers (`pods`) make of them.

pub mod husk;
pub mod kustomize;
pub mod pods;

use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, PersistentVolumeClaim, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::Resource;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The workspace's root directory.
pub fn workspace_root() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    dir.canonicalize()
        .unwrap_or_else(|e| panic!("workspace root {}: {e}", dir.display()))
}

/// `deploy/kubernetes`.
pub fn kubernetes_dir() -> PathBuf {
    workspace_root().join("deploy/kubernetes")
}

/// A path for messages: relative to the workspace root.
pub fn shown(path: &Path) -> String {
    let root = workspace_root();
    let path = path.canonicalize().unwrap_or_else(|_| path.to_owned());
    path.strip_prefix(&root)
        .unwrap_or(&path)
        .display()
        .to_string()
}

/// Every file under `dir` (recursively) whose name ends in `.yaml` or `.yml`, sorted.
pub fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        let entries = std::fs::read_dir(&d).unwrap_or_else(|e| panic!("read {}: {e}", d.display()));
        for entry in entries {
            let path = entry
                .unwrap_or_else(|e| panic!("read {}: {e}", d.display()))
                .path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|x| x == "yaml" || x == "yml") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Whether `path` is a kustomization file (kustomize's, not a Kubernetes object).
pub fn is_kustomization(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n == "kustomization.yaml")
}

/// The YAML documents of `path` as JSON values (empty documents skipped).
pub fn documents(path: &Path) -> Result<Vec<Value>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", shown(path)))?;
    let mut out = Vec::new();
    for (i, doc) in serde_norway::Deserializer::from_str(&text).enumerate() {
        let value = Value::deserialize(doc)
            .map_err(|e| format!("{} (document {}): {e}", shown(path), i + 1))?;
        if !value.is_null() {
            out.push(value);
        }
    }
    Ok(out)
}

/// One Kubernetes object of the manifests, in its API type: the kinds husk's manifests use.
/// Any other kind is an error, so that a new kind comes with checks of its own.
#[derive(Debug, Clone)]
pub enum Object {
    Namespace(Namespace),
    ServiceAccount(ServiceAccount),
    Secret(Secret),
    ConfigMap(ConfigMap),
    PersistentVolumeClaim(PersistentVolumeClaim),
    Service(Service),
    DaemonSet(DaemonSet),
    Deployment(Deployment),
    StatefulSet(StatefulSet),
    PodDisruptionBudget(PodDisruptionBudget),
    NetworkPolicy(NetworkPolicy),
}

impl Object {
    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            Object::Namespace(o) => &o.metadata,
            Object::ServiceAccount(o) => &o.metadata,
            Object::Secret(o) => &o.metadata,
            Object::ConfigMap(o) => &o.metadata,
            Object::PersistentVolumeClaim(o) => &o.metadata,
            Object::Service(o) => &o.metadata,
            Object::DaemonSet(o) => &o.metadata,
            Object::Deployment(o) => &o.metadata,
            Object::StatefulSet(o) => &o.metadata,
            Object::PodDisruptionBudget(o) => &o.metadata,
            Object::NetworkPolicy(o) => &o.metadata,
        }
    }

    pub fn metadata_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Object::Namespace(o) => &mut o.metadata,
            Object::ServiceAccount(o) => &mut o.metadata,
            Object::Secret(o) => &mut o.metadata,
            Object::ConfigMap(o) => &mut o.metadata,
            Object::PersistentVolumeClaim(o) => &mut o.metadata,
            Object::Service(o) => &mut o.metadata,
            Object::DaemonSet(o) => &mut o.metadata,
            Object::Deployment(o) => &mut o.metadata,
            Object::StatefulSet(o) => &mut o.metadata,
            Object::PodDisruptionBudget(o) => &mut o.metadata,
            Object::NetworkPolicy(o) => &mut o.metadata,
        }
    }

    /// The object's kind (`DaemonSet`).
    pub fn kind(&self) -> &'static str {
        match self {
            Object::Namespace(_) => Namespace::KIND,
            Object::ServiceAccount(_) => ServiceAccount::KIND,
            Object::Secret(_) => Secret::KIND,
            Object::ConfigMap(_) => ConfigMap::KIND,
            Object::PersistentVolumeClaim(_) => PersistentVolumeClaim::KIND,
            Object::Service(_) => Service::KIND,
            Object::DaemonSet(_) => DaemonSet::KIND,
            Object::Deployment(_) => Deployment::KIND,
            Object::StatefulSet(_) => StatefulSet::KIND,
            Object::PodDisruptionBudget(_) => PodDisruptionBudget::KIND,
            Object::NetworkPolicy(_) => NetworkPolicy::KIND,
        }
    }

    /// The object as JSON, as its API type writes it (every field it read, and the defaults
    /// of required fields it did not).
    pub fn to_value(&self) -> Value {
        let value = match self {
            Object::Namespace(o) => serde_json::to_value(o),
            Object::ServiceAccount(o) => serde_json::to_value(o),
            Object::Secret(o) => serde_json::to_value(o),
            Object::ConfigMap(o) => serde_json::to_value(o),
            Object::PersistentVolumeClaim(o) => serde_json::to_value(o),
            Object::Service(o) => serde_json::to_value(o),
            Object::DaemonSet(o) => serde_json::to_value(o),
            Object::Deployment(o) => serde_json::to_value(o),
            Object::StatefulSet(o) => serde_json::to_value(o),
            Object::PodDisruptionBudget(o) => serde_json::to_value(o),
            Object::NetworkPolicy(o) => serde_json::to_value(o),
        };
        value.unwrap_or_else(|e| panic!("{} as JSON: {e}", self.id()))
    }

    /// `Kind/name`, for messages.
    pub fn id(&self) -> String {
        format!(
            "{}/{}",
            self.kind(),
            self.metadata().name.as_deref().unwrap_or("?")
        )
    }
}

/// `value` as the Kubernetes object its `apiVersion` and `kind` name.
pub fn parse_object(value: &Value) -> Result<Object, String> {
    let api = value["apiVersion"].as_str().unwrap_or_default();
    let kind = value["kind"].as_str().unwrap_or_default();
    macro_rules! by_kind {
        ($($t:ident),*) => {
            $(
                if api == <$t as Resource>::API_VERSION && kind == <$t as Resource>::KIND {
                    return typed::<$t>(value).map(Object::$t);
                }
            )*
        };
    }
    by_kind!(
        Namespace,
        ServiceAccount,
        Secret,
        ConfigMap,
        PersistentVolumeClaim,
        Service,
        DaemonSet,
        Deployment,
        StatefulSet,
        PodDisruptionBudget,
        NetworkPolicy
    );
    Err(format!(
        "kind {kind:?} of apiVersion {api:?} is not one these tests know (support::Object)"
    ))
}

/// `value` as a `T`, refusing any field `T` does not have. k8s-openapi's types skip unknown
/// fields, as the API server does (with a warning): a misspelt `securityContxt` would read as
/// no security context at all. So the typed value is written back and every field of the
/// input must still be there, with the same value.
fn typed<T: DeserializeOwned + Serialize>(value: &Value) -> Result<T, String> {
    let object: T = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&object).map_err(|e| e.to_string())?;
    let mut lost = Vec::new();
    lost_fields(value, &back, "", &mut lost);
    if lost.is_empty() {
        Ok(object)
    } else {
        Err(format!(
            "fields the API type does not have (misspelt, misplaced, or newer than the \
             Kubernetes version k8s-openapi is built for): {}",
            lost.join(", ")
        ))
    }
}

/// The paths of `input` that `output` lacks or has with another value.
fn lost_fields(input: &Value, output: &Value, path: &str, lost: &mut Vec<String>) {
    match (input, output) {
        (Value::Object(i), Value::Object(o)) => {
            for (key, value) in i {
                let at = format!("{path}.{key}");
                match o.get(key) {
                    Some(out) => lost_fields(value, out, &at, lost),
                    None => lost.push(at),
                }
            }
        }
        (Value::Array(i), Value::Array(o)) if i.len() == o.len() => {
            for (n, (a, b)) in i.iter().zip(o).enumerate() {
                lost_fields(a, b, &format!("{path}[{n}]"), lost);
            }
        }
        (Value::Number(a), Value::Number(b)) if a.as_f64() == b.as_f64() => {}
        (a, b) if a == b => {}
        (a, b) => lost.push(format!("{path} ({a} read as {b})")),
    }
}

/// A container that runs husk, with its command line.
pub struct HuskContainer<'a> {
    pub pods: &'a pods::Pods<'a>,
    pub container: &'a k8s_openapi::api::core::v1::Container,
    pub inv: husk::Invocation,
}

/// Every container of `pods` that runs husk's image. A command line that is not husk's panics.
pub fn husk_containers<'a>(pods: &'a [pods::Pods<'a>]) -> Vec<HuskContainer<'a>> {
    let mut out = Vec::new();
    for p in pods {
        for container in p.spec.containers.iter().filter(|c| husk::is_husk(c)) {
            let inv = husk::invocation(container).unwrap_or_else(|e| panic!("{}: {e}", p.owner));
            out.push(HuskContainer {
                pods: p,
                container,
                inv,
            });
        }
    }
    out
}

impl HuskContainer<'_> {
    /// Where it is, for messages: the kustomization `root`, the workload and the container.
    pub fn at(&self, root: &Path) -> String {
        format!(
            "{}: {} container {}",
            shown(root),
            self.pods.owner,
            self.container.name
        )
    }
}

/// Whether `build` uses the component in `dir` (relative to `deploy/kubernetes`).
pub fn uses_component(build: &kustomize::Build, dir: &str) -> bool {
    let dir = kubernetes_dir().join(dir);
    let dir = dir
        .canonicalize()
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    build.components.contains(&dir)
}

/// The husk containers running `subcommand`; panics unless there is at least one.
pub fn running<'a>(all: &'a [HuskContainer<'a>], subcommand: &str) -> Vec<&'a HuskContainer<'a>> {
    let found: Vec<_> = all
        .iter()
        .filter(|h| h.inv.subcommand == subcommand)
        .collect();
    assert!(!found.is_empty(), "no container runs `husk {subcommand}`");
    found
}
