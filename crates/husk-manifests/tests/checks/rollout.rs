//! Rollouts and sizing: nodes are replaced one machine at a time and never doubled on one,
//! gateways stay available through rollouts and drains, and a node's memory request covers
//! the sandboxes it takes.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::assert_none;
use crate::support::husk::{self, husk_size, quantity_bytes};
use crate::support::kustomize::roots;
use crate::support::{husk_containers, kubernetes_dir, pods, running, shown, Object};

#[test]
fn nodes_are_replaced_one_machine_at_a_time() {
    let mut errors = Vec::new();
    for (root, build) in roots(&kubernetes_dir()) {
        let all = pods::all(&build.docs);
        let husk = husk_containers(&all);
        for h in running(&husk, "node") {
            let at = format!("{}: {}", shown(&root), h.pods.owner);
            let Some(ds) = build.docs.iter().find_map(|d| match &d.object {
                Object::DaemonSet(ds) if d.object.id() == h.pods.owner => Some(ds),
                _ => None,
            }) else {
                errors.push(format!("{at}: a node is not a DaemonSet's pod"));
                continue;
            };
            let strategy = ds
                .spec
                .as_ref()
                .and_then(|s| s.update_strategy.clone())
                .unwrap_or_default();
            let rolling = strategy.rolling_update.unwrap_or_default();
            if strategy.type_.as_deref().unwrap_or("RollingUpdate") != "RollingUpdate"
                || rolling.max_unavailable != Some(IntOrString::Int(1))
            {
                errors.push(format!(
                    "{at}: not a rolling update of one machine at a time"
                ));
            }
            // The new pod would start beside the old one, on the same state directory.
            if !matches!(rolling.max_surge, None | Some(IntOrString::Int(0))) {
                errors.push(format!(
                    "{at}: maxSurge {:?} puts two nodes on one machine",
                    rolling.max_surge
                ));
            }
            let grace = h.pods.spec.termination_grace_period_seconds;
            if !grace.is_some_and(|g| (15..=60).contains(&g)) {
                errors.push(format!(
                    "{at}: terminationGracePeriodSeconds {grace:?}, not 15-60"
                ));
            }
        }
        for h in running(&husk, "gateway") {
            let at = format!("{}: {}", shown(&root), h.pods.owner);
            if h.pods.replicas.is_none_or(|r| r < 2) {
                errors.push(format!(
                    "{at}: {:?} replicas; one gateway down would stop the cluster",
                    h.pods.replicas
                ));
            }
            let protected = build.docs.iter().any(|d| match &d.object {
                Object::PodDisruptionBudget(b) => b
                    .spec
                    .as_ref()
                    .and_then(|s| s.selector.as_ref())
                    .is_some_and(|s| pods::selects(s, &h.pods.labels)),
                _ => false,
            });
            if !protected {
                errors.push(format!("{at}: no PodDisruptionBudget"));
            }
            let spread = h
                .pods
                .spec
                .affinity
                .as_ref()
                .and_then(|a| a.pod_anti_affinity.as_ref())
                .is_some();
            if !spread {
                errors.push(format!(
                    "{at}: no anti-affinity: the replicas may share a machine"
                ));
            }
            let unavailable = build.docs.iter().find_map(|d| match &d.object {
                Object::Deployment(dep) if d.object.id() == h.pods.owner => dep
                    .spec
                    .as_ref()
                    .and_then(|s| s.strategy.as_ref())
                    .and_then(|s| s.rolling_update.as_ref())
                    .and_then(|r| r.max_unavailable.clone()),
                _ => None,
            });
            if unavailable != Some(IntOrString::Int(0)) {
                errors.push(format!(
                    "{at}: a rollout may take gateways down first (maxUnavailable {unavailable:?})"
                ));
            }
        }
    }
    assert_none("rollouts", errors);
}

#[test]
fn node_memory_request_covers_its_capacity() {
    let mut errors = Vec::new();
    for (root, build) in roots(&kubernetes_dir()) {
        let all = pods::all(&build.docs);
        let husk = husk_containers(&all);
        for h in running(&husk, "node") {
            let at = format!("{}: {}", shown(&root), h.pods.owner);
            let literal = |flag| {
                husk::setting(h.container, &h.inv, flag)
                    .and_then(|s| s.literal().map(str::to_owned))
            };
            let capacity = literal("capacity").and_then(|c| c.parse::<u64>().ok());
            // Explicit, so that the sizing below can be checked (and read).
            let memory = literal("memory").as_deref().and_then(husk_size);
            let disk = literal("disk").as_deref().and_then(husk_size);
            let resources = h.container.resources.clone().unwrap_or_default();
            let request = resources
                .requests
                .as_ref()
                .and_then(|r| r.get("memory"))
                .and_then(|q| quantity_bytes(&q.0));
            match (capacity, memory, disk, request) {
                (Some(c), Some(m), Some(d), Some(r)) => {
                    // A sandbox's writable layer is in RAM too.
                    let needed = c * (m + d);
                    if r < needed {
                        errors.push(format!(
                            "{at}: requests {} MiB of memory for {c} sandboxes of {} + {} MiB: {} MiB needed",
                            r >> 20,
                            m >> 20,
                            d >> 20,
                            needed >> 20
                        ));
                    }
                }
                other => errors.push(format!(
                    "{at}: capacity, --memory, --disk and a memory request must all be set: {other:?}"
                )),
            }
            // Sandboxes live in husk's own systemd scope, not the pod's cgroup: a limit would
            // bound only the server and its helpers, and kill it under load.
            if resources
                .limits
                .as_ref()
                .is_some_and(|l| l.contains_key("memory"))
            {
                errors.push(format!("{at}: has a memory limit"));
            }
        }
    }
    assert_none("the node's sizing", errors);
}
