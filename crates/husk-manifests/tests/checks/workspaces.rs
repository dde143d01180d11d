//! Workspaces (and E2B volumes) in the cluster: a node serves them only from storage every node
//! mounts, since a team's next sandbox may land on any machine. Where a kustomization uses
//! components/shared-workspaces, every node mounts one ReadWriteMany claim at exactly its
//! `--state-dir`'s `workspaces/` and is told so (`HUSK_SHARED_WORKSPACES`, with a value the real
//! binary takes as true); everywhere else, the base first, no node is told so (it must refuse
//! workspaces, saying why) and none mounts anything there.

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, VolumeMount};

use super::assert_none;
use crate::support::husk::{self, Setting};
use crate::support::kustomize::{roots, Build};
use crate::support::{
    husk_containers, kubernetes_dir, pods, running, shown, uses_component, HuskContainer, Object,
};

/// The component, below deploy/kubernetes.
const COMPONENT: &str = "components/shared-workspaces";

/// husk's flag (and so its variable, `HUSK_SHARED_WORKSPACES`).
const FLAG: &str = "shared-workspaces";

/// Where the node keeps workspaces: `--state-dir`'s `workspaces/`, as husk makes it.
fn workspaces_dir(h: &HuskContainer<'_>) -> Option<String> {
    let state = husk::setting(h.container, &h.inv, "state-dir")?
        .literal()?
        .to_owned();
    Some(format!("{}/workspaces", state.trim_end_matches('/')))
}

/// The container's mounts at `path` (or `path/`).
fn mounts_at<'a>(h: &'a HuskContainer<'a>, path: &str) -> Vec<&'a VolumeMount> {
    h.container
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| m.mount_path.trim_end_matches('/') == path)
        .collect()
}

/// Whether the node is told its workspaces are shared, as the binary reads what it is given.
fn told_shared(h: &HuskContainer<'_>) -> Result<bool, String> {
    match husk::setting(h.container, &h.inv, FLAG) {
        None => Ok(false),
        Some(Setting::Flag(None)) => Ok(true),
        Some(Setting::Flag(Some(v))) => Err(format!(
            "--{FLAG} takes no value, and is given {v:?} (husk would take it for an argument)"
        )),
        Some(Setting::Env(e)) => match e.value.as_deref() {
            Some(v) if e.value_from.is_none() => husk::boolean_env("node", &e.name, v),
            _ => Err(format!(
                "{} is not written out: whether the node shares workspaces must be plain",
                e.name
            )),
        },
    }
}

/// The claim named `name` in the workload's namespace, if `build` makes it.
fn claim<'a>(
    build: &'a Build,
    name: &str,
    namespace: Option<&str>,
) -> Option<&'a PersistentVolumeClaim> {
    build.docs.iter().find_map(|d| match &d.object {
        Object::PersistentVolumeClaim(c)
            if c.metadata.name.as_deref() == Some(name)
                && c.metadata.namespace.as_deref() == namespace =>
        {
            Some(c)
        }
        _ => None,
    })
}

#[test]
fn nodes_share_workspaces_where_the_component_is_from_one_read_write_many_claim() {
    let mut errors = Vec::new();
    let mut with_component = 0;
    for (root, build) in roots(&kubernetes_dir()) {
        if !uses_component(&build, COMPONENT) {
            continue;
        }
        with_component += 1;
        let all = pods::all(&build.docs);
        let husk = husk_containers(&all);
        for h in running(&husk, "node") {
            let at = format!("{}: {}", shown(&root), h.pods.owner);
            match told_shared(h) {
                Ok(true) => {}
                Ok(false) => errors.push(format!(
                    "{at}: not started with --{FLAG} ({}=true): it would refuse the workspaces \
                     the component mounts for it",
                    husk::env_name(FLAG)
                )),
                Err(e) => errors.push(format!("{at}: {e}")),
            }
            let Some(dir) = workspaces_dir(h) else {
                errors.push(format!(
                    "{at}: no literal --state-dir: where are its workspaces?"
                ));
                continue;
            };
            let mounts = mounts_at(h, &dir);
            let [mount] = mounts[..] else {
                errors.push(format!(
                    "{at}: {} volumes mounted at {dir} (--state-dir's workspaces/), not one",
                    mounts.len()
                ));
                continue;
            };
            if mount.read_only == Some(true)
                || mount.sub_path.is_some()
                || mount.sub_path_expr.is_some()
            {
                errors.push(format!(
                    "{at}: the workspaces are mounted read-only or from a sub-path"
                ));
            }
            let volume = h
                .pods
                .spec
                .volumes
                .iter()
                .flatten()
                .find(|v| v.name == mount.name);
            let Some(source) = volume.and_then(|v| v.persistent_volume_claim.as_ref()) else {
                errors.push(format!(
                    "{at}: volume {} at {dir} is not a PersistentVolumeClaim: every node must \
                     mount the same storage",
                    mount.name
                ));
                continue;
            };
            if source.read_only == Some(true) {
                errors.push(format!(
                    "{at}: claim {} is mounted read-only",
                    source.claim_name
                ));
            }
            // A DaemonSet's pods are in its namespace.
            let namespace = build.docs.iter().find_map(|d| {
                (d.object.id() == h.pods.owner).then(|| d.object.metadata().namespace.clone())?
            });
            let Some(pvc) = claim(&build, &source.claim_name, namespace.as_deref()) else {
                errors.push(format!(
                    "{at}: claim {} (in {namespace:?}) is not made here",
                    source.claim_name
                ));
                continue;
            };
            let spec = pvc.spec.clone().unwrap_or_default();
            let modes = spec.access_modes.unwrap_or_default();
            if modes != ["ReadWriteMany"] {
                errors.push(format!(
                    "{at}: claim {} has access modes {modes:?}, not ReadWriteMany alone: every \
                     node mounts it at once",
                    source.claim_name
                ));
            }
            if spec
                .volume_mode
                .as_deref()
                .is_some_and(|m| m != "Filesystem")
            {
                errors.push(format!(
                    "{at}: claim {} is a {:?} volume, not a file system",
                    source.claim_name, spec.volume_mode
                ));
            }
            let size = spec
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("storage"));
            if size.is_none() {
                errors.push(format!(
                    "{at}: claim {} asks for no size",
                    source.claim_name
                ));
            }
            // The kubelet would give every file on the volume that group (recursively, at
            // each mount, where the driver lets it), over the owners sandboxes gave them.
            let fs_group = h
                .pods
                .spec
                .security_context
                .as_ref()
                .and_then(|s| s.fs_group);
            if fs_group.is_some() {
                errors.push(format!(
                    "{at}: the pod's fsGroup {fs_group:?} would change the group of every \
                     workspace file"
                ));
            }
        }
    }
    assert_none("shared workspaces", errors);
    assert!(
        with_component > 0,
        "no kustomization uses {COMPONENT}: nothing checks it (overlays/with-shared-workspaces)"
    );
}

#[test]
fn nodes_without_shared_storage_are_not_told_they_have_it() {
    let base = kubernetes_dir().join("base");
    let mut errors = Vec::new();
    let mut base_checked = false;
    for (root, build) in roots(&kubernetes_dir()) {
        if uses_component(&build, COMPONENT) {
            continue;
        }
        base_checked |= root == base;
        let all = pods::all(&build.docs);
        let husk = husk_containers(&all);
        for h in running(&husk, "node") {
            let at = format!("{}: {}", shown(&root), h.pods.owner);
            // Told nothing at all, not even `false`: the variable belongs to the component.
            if husk::setting(h.container, &h.inv, FLAG).is_some() {
                errors.push(format!(
                    "{at}: sets --{FLAG} or {} without {COMPONENT}: workspaces there would be on \
                     one machine, and a team's next sandbox on another",
                    husk::env_name(FLAG)
                ));
            }
            if let Some(dir) = workspaces_dir(h) {
                for m in mounts_at(h, &dir) {
                    errors.push(format!(
                        "{at}: mounts volume {} at {dir} without {COMPONENT}",
                        m.name
                    ));
                }
            }
        }
    }
    assert_none("nodes without shared workspaces", errors);
    assert!(
        base_checked,
        "{} was not among the kustomizations checked",
        shown(&base)
    );
}
