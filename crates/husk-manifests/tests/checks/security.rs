//! Privileges: the node has exactly what deploy/kubernetes/base/node.yaml argues it needs, and
//! every other pod (gateways, PostgreSQL) none at all.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec};

use super::assert_none;
use crate::support::kustomize::roots;
use crate::support::{husk_containers, kubernetes_dir, pods, running, shown};

/// The host paths a node mounts, each at the same path in the pod, and whether read-only.
const NODE_HOST_PATHS: [(&str, bool); 5] = [
    // The state directory: template images, saved sandboxes (--state-dir); workspaces are on
    // components/shared-workspaces' claim, mounted over its workspaces/.
    ("/var/lib/husk", false),
    // The registry of running sandboxes, uid-range and uplink locks, per machine.
    ("/run/husk", false),
    // Loop devices made after the pod started.
    ("/dev", false),
    // systemd's private socket: a scope for sandboxes outside the pod's cgroup.
    ("/run/systemd", true),
    // modprobe.
    ("/lib/modules", true),
];

fn seccomp(spec: &PodSpec, c: &Container) -> Option<String> {
    let own = c
        .security_context
        .as_ref()
        .and_then(|s| s.seccomp_profile.as_ref());
    let pod = spec
        .security_context
        .as_ref()
        .and_then(|s| s.seccomp_profile.as_ref());
    own.or(pod).map(|p| p.type_.clone())
}

#[test]
fn the_node_has_exactly_the_privileges_it_needs() {
    let mut errors = Vec::new();
    for (root, build) in roots(&kubernetes_dir()) {
        let all = pods::all(&build.docs);
        let husk = husk_containers(&all);
        for h in running(&husk, "node") {
            let at = format!("{}: {}", shown(&root), h.pods.owner);
            let spec = h.pods.spec;
            let sc = h.container.security_context.clone().unwrap_or_default();
            if sc.privileged != Some(true) {
                errors.push(format!("{at}: not privileged"));
            }
            if sc.capabilities.is_some() {
                errors.push(format!("{at}: lists capabilities; privileged has them all"));
            }
            if seccomp(spec, h.container).as_deref() != Some("Unconfined") {
                errors.push(format!("{at}: seccomp is not Unconfined"));
            }
            if sc.app_armor_profile.map(|p| p.type_).as_deref() != Some("Unconfined") {
                errors.push(format!("{at}: AppArmor is not Unconfined"));
            }
            if sc.run_as_non_root == Some(true) || sc.run_as_user.is_some_and(|u| u != 0) {
                errors.push(format!("{at}: not root"));
            }
            if spec.host_pid != Some(true) {
                errors.push(format!("{at}: not in the host's PID namespace"));
            }
            if spec.host_network == Some(true) || spec.host_ipc == Some(true) {
                errors.push(format!("{at}: in the host's network or IPC namespace"));
            }
            let mut mounted = BTreeMap::new();
            for v in spec.volumes.iter().flatten() {
                let Some(host) = &v.host_path else { continue };
                let mounts: Vec<_> = h
                    .container
                    .volume_mounts
                    .iter()
                    .flatten()
                    .filter(|m| m.name == v.name)
                    .collect();
                match mounts.as_slice() {
                    [m] if m.mount_path == host.path => {
                        mounted.insert(host.path.clone(), m.read_only == Some(true));
                    }
                    _ => errors.push(format!(
                        "{at}: host path {} is not mounted once, at the same path",
                        host.path
                    )),
                }
            }
            let expected: BTreeMap<String, bool> = NODE_HOST_PATHS
                .iter()
                .map(|(p, ro)| (p.to_string(), *ro))
                .collect();
            if mounted != expected {
                errors.push(format!(
                    "{at}: host paths (path: read-only) are {mounted:?}, not {expected:?}"
                ));
            }
            if h.inv.value("state-dir") != Some("/var/lib/husk") {
                errors.push(format!(
                    "{at}: --state-dir is not the host path /var/lib/husk"
                ));
            }
        }
    }
    assert_none("the node's privileges", errors);
}

#[test]
fn everything_but_the_node_runs_without_privilege() {
    let mut errors = Vec::new();
    for (root, build) in roots(&kubernetes_dir()) {
        let all = pods::all(&build.docs);
        let husk = husk_containers(&all);
        let nodes: Vec<String> = running(&husk, "node")
            .iter()
            .map(|h| h.pods.owner.clone())
            .collect();
        // The gateways must be among them.
        running(&husk, "gateway");
        for p in all.iter().filter(|p| !nodes.contains(&p.owner)) {
            let at = format!("{}: {}", shown(&root), p.owner);
            let spec = p.spec;
            if [spec.host_pid, spec.host_network, spec.host_ipc].contains(&Some(true)) {
                errors.push(format!("{at}: shares a host namespace"));
            }
            if spec.volumes.iter().flatten().any(|v| v.host_path.is_some()) {
                errors.push(format!("{at}: mounts a host path"));
            }
            let pod = spec.security_context.clone().unwrap_or_default();
            for c in pods::containers(spec) {
                let at = format!("{at} container {}", c.name);
                let sc = c.security_context.clone().unwrap_or_default();
                if sc.run_as_non_root.or(pod.run_as_non_root) != Some(true) {
                    errors.push(format!("{at}: may run as root (runAsNonRoot)"));
                }
                if sc.run_as_user.or(pod.run_as_user) == Some(0) {
                    errors.push(format!("{at}: runs as uid 0"));
                }
                if sc.read_only_root_filesystem != Some(true) {
                    errors.push(format!("{at}: its root file system is writable"));
                }
                if sc.allow_privilege_escalation != Some(false) {
                    errors.push(format!(
                        "{at}: may gain privileges (allowPrivilegeEscalation)"
                    ));
                }
                if sc.privileged == Some(true) {
                    errors.push(format!("{at}: privileged"));
                }
                let caps = sc.capabilities.clone().unwrap_or_default();
                if !caps.drop.iter().flatten().any(|d| d == "ALL") {
                    errors.push(format!("{at}: does not drop ALL capabilities"));
                }
                if caps.add.as_ref().is_some_and(|a| !a.is_empty()) {
                    errors.push(format!("{at}: adds capabilities {:?}", caps.add));
                }
                if !matches!(
                    seccomp(spec, c).as_deref(),
                    Some("RuntimeDefault" | "Localhost")
                ) {
                    errors.push(format!("{at}: no seccomp profile"));
                }
            }
        }
    }
    assert_none("privileges of everything but the node", errors);
}
