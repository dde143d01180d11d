//! The objects refer to each other correctly: selectors select the pods they are for, ports
//! and probes name ports the containers have, and the Secrets, claims, volumes, files and
//! service accounts that pods use exist.

use super::assert_none;
use crate::support::kustomize::roots;
use crate::support::pods::{self, container_port, map_selects, pod_port, selects};
use crate::support::{husk, husk_containers, kubernetes_dir, shown, Object};

#[test]
fn selectors_select_the_pods_they_are_for() {
    let mut errors = Vec::new();
    for (root, build) in roots(&kubernetes_dir()) {
        let here = shown(&root);
        let all = pods::all(&build.docs);
        for p in &all {
            if p.selector
                .match_labels
                .as_ref()
                .is_none_or(|l| l.is_empty())
            {
                errors.push(format!("{here}: {} selects by no label", p.owner));
            }
            if !selects(p.selector, &p.labels) {
                errors.push(format!(
                    "{here}: {}'s selector misses its own pods",
                    p.owner
                ));
            }
            for other in all.iter().filter(|o| o.owner != p.owner) {
                if selects(p.selector, &other.labels) {
                    errors.push(format!(
                        "{here}: {}'s selector also takes {}'s pods",
                        p.owner, other.owner
                    ));
                }
            }
            let anti = p
                .spec
                .affinity
                .as_ref()
                .and_then(|a| a.pod_anti_affinity.as_ref());
            let terms = anti
                .into_iter()
                .flat_map(|a| {
                    a.preferred_during_scheduling_ignored_during_execution
                        .iter()
                        .flatten()
                })
                .map(|w| &w.pod_affinity_term)
                .chain(anti.into_iter().flat_map(|a| {
                    a.required_during_scheduling_ignored_during_execution
                        .iter()
                        .flatten()
                }));
            for term in terms {
                if !term
                    .label_selector
                    .as_ref()
                    .is_some_and(|s| selects(s, &p.labels))
                {
                    errors.push(format!(
                        "{here}: {}'s anti-affinity does not select its own pods",
                        p.owner
                    ));
                }
            }
        }
        for doc in &build.docs {
            let id = doc.object.id();
            match &doc.object {
                Object::Service(s) => {
                    let spec = s.spec.as_ref().expect("a Service has a spec");
                    let selector = spec.selector.clone().unwrap_or_default();
                    let chosen: Vec<_> = all
                        .iter()
                        .filter(|p| map_selects(&selector, &p.labels))
                        .collect();
                    if chosen.is_empty() {
                        errors.push(format!("{here}: {id} selects no pods"));
                    }
                    for port in spec.ports.iter().flatten() {
                        let target = port.target_port.clone().unwrap_or(
                            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(
                                port.port,
                            ),
                        );
                        for p in &chosen {
                            if pod_port(p.spec, &target).is_none() {
                                errors.push(format!(
                                    "{here}: {id} sends port {} to {target:?}, which {}'s pods do not have",
                                    port.port, p.owner
                                ));
                            }
                        }
                    }
                }
                Object::PodDisruptionBudget(b) => {
                    let spec = b.spec.as_ref().expect("a PDB has a spec");
                    let selector = spec.selector.clone().unwrap_or_default();
                    let chosen: Vec<_> = all
                        .iter()
                        .filter(|p| selects(&selector, &p.labels))
                        .collect();
                    if chosen.is_empty() {
                        errors.push(format!("{here}: {id} selects no pods"));
                    }
                    let min = match &spec.min_available {
                        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n)) => {
                            *n
                        }
                        other => {
                            errors.push(format!(
                                "{here}: {id}: minAvailable {other:?} is not a count"
                            ));
                            continue;
                        }
                    };
                    for p in chosen {
                        // A budget the workload can never have spare blocks every drain.
                        if p.replicas.is_none_or(|r| min < 1 || min >= r) {
                            errors.push(format!(
                                "{here}: {id} keeps {min} of {}'s {:?} pods: a drain would wait forever or it protects nothing",
                                p.owner, p.replicas
                            ));
                        }
                    }
                }
                Object::NetworkPolicy(n) => {
                    let spec = n.spec.as_ref().expect("a NetworkPolicy has a spec");
                    if !all
                        .iter()
                        .any(|p| selects(&spec.pod_selector.clone().unwrap_or_default(), &p.labels))
                    {
                        errors.push(format!("{here}: {id} applies to no pods"));
                    }
                    let peers = spec
                        .ingress
                        .iter()
                        .flatten()
                        .flat_map(|r| r.from.iter().flatten())
                        .chain(
                            spec.egress
                                .iter()
                                .flatten()
                                .flat_map(|r| r.to.iter().flatten()),
                        );
                    for peer in peers {
                        if peer.namespace_selector.is_some() {
                            continue;
                        }
                        if let Some(sel) = &peer.pod_selector {
                            if !all.iter().any(|p| selects(sel, &p.labels)) {
                                errors.push(format!(
                                    "{here}: {id} names peers that are no pods here"
                                ));
                            }
                        }
                    }
                }
                Object::StatefulSet(s) => {
                    let service = s.spec.as_ref().and_then(|s| s.service_name.clone());
                    let exists = build.docs.iter().any(
                        |d| matches!(&d.object, Object::Service(v) if v.metadata.name == service),
                    );
                    if !exists {
                        errors.push(format!("{here}: {id}'s service {service:?} does not exist"));
                    }
                }
                _ => {}
            }
        }
    }
    assert_none("selectors", errors);
}

#[test]
fn secrets_claims_volumes_and_files_the_pods_use_exist() {
    let mut errors = Vec::new();
    for (root, build) in roots(&kubernetes_dir()) {
        let here = shown(&root);
        let has = |name: &str, key: Option<&str>| {
            build
                .secrets
                .get(name)
                .is_some_and(|keys| key.is_none_or(|k| keys.contains(k)))
        };
        let all = pods::all(&build.docs);
        for p in &all {
            let volumes = p.spec.volumes.as_deref().unwrap_or_default();
            for v in volumes {
                if let Some(c) = &v.persistent_volume_claim {
                    let made = build.docs.iter().any(|d| {
                        matches!(&d.object, Object::PersistentVolumeClaim(pvc)
                            if pvc.metadata.name.as_deref() == Some(c.claim_name.as_str()))
                    });
                    if !made {
                        errors.push(format!(
                            "{here}: {} mounts claim {:?}, which is not made",
                            p.owner, c.claim_name
                        ));
                    }
                }
                let Some(secret) = &v.secret else { continue };
                let name = secret.secret_name.as_deref().unwrap_or_default();
                if !has(name, None) {
                    errors.push(format!(
                        "{here}: {} mounts Secret {name:?}, which is not made",
                        p.owner
                    ));
                }
                for item in secret.items.iter().flatten() {
                    if !has(name, Some(&item.key)) {
                        errors.push(format!(
                            "{here}: {} mounts key {} of Secret {name}, which it lacks",
                            p.owner, item.key
                        ));
                    }
                }
            }
            for c in &p.spec.containers {
                for e in c.env.iter().flatten() {
                    if let Some(r) = e
                        .value_from
                        .as_ref()
                        .and_then(|v| v.secret_key_ref.as_ref())
                    {
                        if !has(&r.name, Some(&r.key)) {
                            errors.push(format!(
                                "{here}: {} reads {} from key {} of Secret {}, which is not made",
                                p.owner, e.name, r.key, r.name
                            ));
                        }
                    }
                }
                for m in c.volume_mounts.iter().flatten() {
                    if !volumes.iter().any(|v| v.name == m.name) && !p.claims.contains(&m.name) {
                        errors.push(format!(
                            "{here}: {} mounts volume {}, which it lacks",
                            p.owner, m.name
                        ));
                    }
                }
            }
        }
        // Files husk reads (keys, tokens, certificates, CAs) are where a Secret volume puts
        // them.
        for h in husk_containers(&all) {
            for flag in [
                "master-key",
                "cluster-token-file",
                "database-ca",
                "tls-cert",
                "tls-key",
                "cluster-ca",
            ] {
                let Some(path) = husk::setting(h.container, &h.inv, flag)
                    .and_then(|s| s.literal().map(str::to_owned))
                else {
                    continue;
                };
                let provided = h.container.volume_mounts.iter().flatten().any(|m| {
                    let Some(v) = h
                        .pods
                        .spec
                        .volumes
                        .iter()
                        .flatten()
                        .find(|v| v.name == m.name)
                    else {
                        return false;
                    };
                    let Some(secret) = &v.secret else {
                        return false;
                    };
                    let files: Vec<String> = match &secret.items {
                        Some(items) => items.iter().map(|i| i.path.clone()).collect(),
                        None => build
                            .secrets
                            .get(secret.secret_name.as_deref().unwrap_or_default())
                            .map(|k| k.iter().cloned().collect())
                            .unwrap_or_default(),
                    };
                    files
                        .iter()
                        .any(|f| format!("{}/{f}", m.mount_path) == path)
                });
                if !provided {
                    errors.push(format!(
                        "{here}: {} gives --{flag} {path}, which no mounted Secret provides",
                        h.pods.owner
                    ));
                }
            }
        }
    }
    assert_none("Secrets, claims, volumes and files", errors);
}

/// husk reads its cluster token file again every 2 s, so a rotation needs no restart, if an
/// edit of the Secret reaches the running pods: the Secret keeps its name (no hash suffix,
/// which would make a new Secret and roll the pods) and is mounted as a directory (the
/// kubelet never refreshes a `subPath` mount).
#[test]
fn the_cluster_token_reaches_running_pods_when_edited() {
    let mut errors = Vec::new();
    for (root, build) in roots(&kubernetes_dir()) {
        let here = shown(&root);
        if !build.fixed_names.contains("husk-cluster-token") {
            errors.push(format!(
                "{here}: Secret husk-cluster-token gets a hash suffix: an edit rolls the pods"
            ));
        }
        for p in pods::all(&build.docs) {
            let volumes = p.spec.volumes.as_deref().unwrap_or_default();
            let token_volumes: Vec<&str> = volumes
                .iter()
                .filter(|v| {
                    v.secret.as_ref().and_then(|s| s.secret_name.as_deref())
                        == Some("husk-cluster-token")
                })
                .map(|v| v.name.as_str())
                .collect();
            for c in &p.spec.containers {
                for m in c.volume_mounts.iter().flatten() {
                    if token_volumes.contains(&m.name.as_str()) && m.sub_path.is_some() {
                        errors.push(format!(
                            "{here}: {} mounts the cluster token with subPath: never refreshed",
                            p.owner
                        ));
                    }
                }
            }
        }
    }
    assert_none("the cluster token's rotation", errors);
}

/// The kubelet's probes speak what the listener speaks: HTTPS exactly where husk is given a
/// certificate (`--tls-cert`: the listener then serves HTTPS only), else plain HTTP. The
/// kubelet does not verify a probe's certificate, so the scheme is all a probe needs.
#[test]
fn probes_ask_for_health_on_the_listen_port() {
    let mut errors = Vec::new();
    for (root, build) in roots(&kubernetes_dir()) {
        let here = shown(&root);
        let all = pods::all(&build.docs);
        for h in husk_containers(&all) {
            let at = format!("{here}: {} container {}", h.pods.owner, h.container.name);
            let c = h.container;
            let listen = h.inv.value("listen").and_then(husk::listen_port);
            let exposed = listen.and_then(|port| {
                container_port(
                    c,
                    &k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(port),
                )
            });
            if listen.is_none() || exposed.is_none() {
                errors.push(format!(
                    "{at}: the --listen port {listen:?} is not a containerPort"
                ));
            }
            let tls = husk::setting(c, &h.inv, "tls-cert").is_some();
            let scheme = if tls { "HTTPS" } else { "HTTP" };
            for (kind, probe, needed) in [
                ("startup", &c.startup_probe, false),
                ("liveness", &c.liveness_probe, true),
                ("readiness", &c.readiness_probe, true),
            ] {
                let Some(probe) = probe else {
                    if needed {
                        errors.push(format!("{at}: no {kind} probe"));
                    }
                    continue;
                };
                let Some(get) = &probe.http_get else {
                    errors.push(format!("{at}: the {kind} probe is not an HTTP GET"));
                    continue;
                };
                if get.path.as_deref() != Some("/health") {
                    errors.push(format!(
                        "{at}: the {kind} probe asks for {:?}, not /health",
                        get.path
                    ));
                }
                let asked = get.scheme.as_deref().unwrap_or("HTTP");
                if asked != scheme {
                    errors.push(format!(
                        "{at}: the {kind} probe speaks {asked} to a listener that serves {scheme} \
                         only ({})",
                        if tls {
                            "--tls-cert is set"
                        } else {
                            "no --tls-cert"
                        }
                    ));
                }
                let port = container_port(c, &get.port);
                if port.is_none() || port != listen {
                    errors.push(format!(
                        "{at}: the {kind} probe's port {:?} is {port:?}, the --listen port is {listen:?}",
                        get.port
                    ));
                }
            }
        }
        // Other containers' HTTP probes, too, name ports they have.
        for p in &all {
            for c in p.spec.containers.iter().filter(|c| !husk::is_husk(c)) {
                for probe in [&c.startup_probe, &c.liveness_probe, &c.readiness_probe]
                    .into_iter()
                    .flatten()
                {
                    if let Some(get) = &probe.http_get {
                        if container_port(c, &get.port).is_none() {
                            errors.push(format!(
                                "{here}: {} probes port {:?}, which it lacks",
                                p.owner, get.port
                            ));
                        }
                    }
                }
            }
        }
    }
    assert_none("probes", errors);
}

#[test]
fn service_accounts_mount_no_token() {
    let mut errors = Vec::new();
    for (root, build) in roots(&kubernetes_dir()) {
        let here = shown(&root);
        for doc in &build.docs {
            if let Object::ServiceAccount(sa) = &doc.object {
                if sa.automount_service_account_token != Some(false) {
                    errors.push(format!("{here}: {} mounts its token", doc.object.id()));
                }
            }
        }
        for p in pods::all(&build.docs) {
            if p.spec.automount_service_account_token != Some(false) {
                errors.push(format!("{here}: {}'s pods mount a token", p.owner));
            }
            let account = p.spec.service_account_name.clone();
            let exists = build.docs.iter().any(
                |d| matches!(&d.object, Object::ServiceAccount(sa) if sa.metadata.name == account),
            );
            if !exists {
                errors.push(format!(
                    "{here}: {}'s service account {account:?} is not made",
                    p.owner
                ));
            }
        }
    }
    assert_none("service accounts", errors);
}
