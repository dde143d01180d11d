//! The pods the workloads make, and what selects them: label selectors as the API server
//! evaluates them, and ports by number or name as the kubelet and Services resolve them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::kustomize::Doc;
use super::Object;

/// The pods of one workload (DaemonSet, Deployment, StatefulSet).
#[derive(Debug)]
pub struct Pods<'a> {
    /// `Kind/name` of the workload.
    pub owner: String,
    pub selector: &'a LabelSelector,
    pub labels: BTreeMap<String, String>,
    /// The pod template's annotations.
    pub annotations: BTreeMap<String, String>,
    pub spec: &'a PodSpec,
    /// Replicas (a DaemonSet: none, one per machine).
    pub replicas: Option<i32>,
    /// Volumes a StatefulSet's claim templates add to each pod.
    pub claims: Vec<String>,
}

/// Every container of a pod: its containers, then its init containers.
pub fn containers(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
}

/// Every workload's pods in `docs`. A workload without a selector or pod spec panics: the
/// API server refuses one.
pub fn all(docs: &[Doc]) -> Vec<Pods<'_>> {
    let mut out = Vec::new();
    for doc in docs {
        let owner = doc.object.id();
        let mut claims = Vec::new();
        let (spec, replicas) = match &doc.object {
            Object::DaemonSet(d) => (d.spec.as_ref().map(|s| (&s.selector, &s.template)), None),
            Object::Deployment(d) => (
                d.spec.as_ref().map(|s| (&s.selector, &s.template)),
                d.spec.as_ref().map(|s| s.replicas.unwrap_or(1)),
            ),
            Object::StatefulSet(d) => {
                let templates = d
                    .spec
                    .iter()
                    .flat_map(|s| s.volume_claim_templates.iter().flatten());
                claims.extend(templates.filter_map(|t| t.metadata.name.clone()));
                (
                    d.spec.as_ref().map(|s| (&s.selector, &s.template)),
                    d.spec.as_ref().map(|s| s.replicas.unwrap_or(1)),
                )
            }
            _ => continue,
        };
        let (selector, template) = spec.unwrap_or_else(|| panic!("{owner} has no spec"));
        out.push(Pods {
            selector,
            labels: template
                .metadata
                .as_ref()
                .and_then(|m| m.labels.clone())
                .unwrap_or_default(),
            annotations: template
                .metadata
                .as_ref()
                .and_then(|m| m.annotations.clone())
                .unwrap_or_default(),
            spec: template
                .spec
                .as_ref()
                .unwrap_or_else(|| panic!("{owner} has no pod spec")),
            replicas,
            claims,
            owner,
        });
    }
    out
}

/// Whether `selector` selects pods labelled `labels`. An empty selector selects every pod.
pub fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_label = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_expression = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        let value = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            other => panic!("unknown selector operator {other}"),
        }
    });
    by_label && by_expression
}

/// Whether a Service's selector (plain labels) selects pods labelled `labels`.
pub fn map_selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The TCP port number `port` names in `container` (a number it exposes, or a port's name).
pub fn container_port(container: &Container, port: &IntOrString) -> Option<i32> {
    container
        .ports
        .iter()
        .flatten()
        .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
        .find(|p| match port {
            IntOrString::Int(n) => p.container_port == *n,
            IntOrString::String(name) => p.name.as_deref() == Some(name.as_str()),
        })
        .map(|p| p.container_port)
}

/// The TCP port `port` names in any container of `spec`.
pub fn pod_port(spec: &PodSpec, port: &IntOrString) -> Option<i32> {
    spec.containers.iter().find_map(|c| container_port(c, port))
}
