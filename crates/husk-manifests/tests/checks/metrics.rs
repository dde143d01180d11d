//! The nodes' Prometheus metrics in the cluster. Where a kustomization uses
//! components/metrics, every node serves them (`--metrics-listen`, as the real binary reads
//! it) on an address another pod reaches, on a port its container declares by the name
//! `metrics` and its pod's `prometheus.io/*` annotations name; everywhere else, the base
//! first, no node serves them. Who may reach that port is `network.rs`'s.

use std::net::SocketAddr;

use super::assert_none;
use crate::support::husk::{self, Setting};
use crate::support::kustomize::roots;
use crate::support::pods::{self, container_port};
use crate::support::{husk_containers, kubernetes_dir, shown, uses_component};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// The component, below deploy/kubernetes.
const COMPONENT: &str = "components/metrics";

/// husk's flag (and so its variable, `HUSK_METRICS_LISTEN`).
const FLAG: &str = "metrics-listen";

#[test]
fn nodes_serve_metrics_where_the_component_is_on_a_declared_port_another_pod_reaches() {
    let mut errors = Vec::new();
    let mut with_component = 0;
    for (root, build) in roots(&kubernetes_dir()) {
        let wired = uses_component(&build, COMPONENT);
        with_component += usize::from(wired);
        let all = pods::all(&build.docs);
        let husk = husk_containers(&all);
        for h in &husk {
            let at = format!("{}: {}", shown(&root), h.pods.owner);
            let serves = h.inv.subcommand == "node" && wired;
            let setting = match (serves, husk::setting(h.container, &h.inv, FLAG)) {
                (false, None) => continue,
                (false, Some(_)) => {
                    errors.push(format!(
                        "{at}: sets --{FLAG} without {COMPONENT} (husk {} serves metrics only \
                         where the component admits a scraper)",
                        h.inv.subcommand
                    ));
                    continue;
                }
                (true, None) => {
                    errors.push(format!(
                        "{at}: uses {COMPONENT} but the node is not started with --{FLAG}"
                    ));
                    continue;
                }
                (true, Some(s)) => s,
            };
            let literal = match &setting {
                Setting::Env(e) if e.value_from.is_some() => None,
                s => s.literal(),
            };
            let Some(addr) = literal else {
                errors.push(format!("{at}: --{FLAG} is not written out"));
                continue;
            };
            // What the binary parses (a SocketAddr); $(POD_IP) is the kubelet's to expand.
            let expanded = addr.replace("$(POD_IP)", "10.1.2.3");
            let Ok(parsed) = expanded.parse::<SocketAddr>() else {
                errors.push(format!(
                    "{at}: --{FLAG} {addr:?} is no ADDR:PORT husk reads"
                ));
                continue;
            };
            if parsed.ip().is_loopback() {
                errors.push(format!(
                    "{at}: --{FLAG} {addr} is loopback: no scraper in another pod reaches it"
                ));
            }
            let port = i32::from(parsed.port());
            let declared = container_port(h.container, &IntOrString::String("metrics".into()));
            if declared != Some(port) {
                errors.push(format!(
                    "{at}: the container's port named \"metrics\" is {declared:?}, not --{FLAG}'s \
                     {port}"
                ));
            }
            let annotation = |key: &str| h.pods.annotations.get(key).map(String::as_str);
            let port_text = port.to_string();
            for (key, want) in [
                ("prometheus.io/scrape", "true"),
                ("prometheus.io/port", port_text.as_str()),
                ("prometheus.io/path", "/metrics"),
            ] {
                if annotation(key) != Some(want) {
                    errors.push(format!(
                        "{at}: annotation {key} is {:?}, not {want:?}",
                        annotation(key)
                    ));
                }
            }
        }
        if wired && !husk.iter().any(|h| h.inv.subcommand == "node") {
            errors.push(format!(
                "{}: uses {COMPONENT} but runs no node to serve the metrics",
                shown(&root)
            ));
        }
    }
    assert!(
        with_component > 0,
        "no kustomization uses {COMPONENT}: nothing was checked"
    );
    assert_none("the nodes' metrics", errors);
}
