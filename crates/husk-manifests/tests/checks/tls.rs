//! TLS on the node API. Where a kustomization uses components/node-tls (its `pods/` part, which
//! the component brings, or alone with a Secret made otherwise), every node serves HTTPS with the
//! certificate and key of the Secret husk-node-tls and advertises an `https://` URL, and every
//! node and gateway verifies the nodes against that Secret's CA and the one name the certificate
//! carries; the Secret is cert-manager's layout (`kubernetes.io/tls`: tls.crt, tls.key, ca.crt)
//! and keeps one name, and it is mounted whole-directory, so a renewal reaches running pods; no
//! pod but a node ever receives the private key. Everywhere else, the base first, nobody is given
//! a certificate, a CA or a name to verify. The probes' scheme and the advertised URL's, which
//! follow `--tls-cert` wherever it is, are checked with the other probes (`wiring`) and URLs
//! (`flags`).

use k8s_openapi::api::core::v1::{Volume, VolumeMount};

use super::assert_none;
use crate::support::husk::{self, Setting};
use crate::support::kustomize::{roots, Build};
use crate::support::pods::{self, Pods};
use crate::support::{
    husk_containers, kubernetes_dir, running, shown, uses_component, HuskContainer,
};

/// The component that makes the Secret from files, and the part that sets up the pods.
const COMPONENT: &str = "components/node-tls";
const PODS: &str = "components/node-tls/pods";

/// The Secret every node's certificate is in, its type and keys (cert-manager's, for a
/// Certificate), and the name the certificate carries.
const SECRET: &str = "husk-node-tls";
const SECRET_TYPE: &str = "kubernetes.io/tls";
const CERT: &str = "tls.crt";
const KEY: &str = "tls.key";
const CA: &str = "ca.crt";
const NAME: &str = "husk-node";

/// husk's settings of TLS: the listener's pair, and how the nodes are verified.
const SETTINGS: [&str; 4] = ["tls-cert", "tls-key", "cluster-ca", "cluster-tls-name"];

/// The Secret volume a mount of a pod mounts, if it is one.
fn secret_volume<'a>(pods: &'a Pods<'a>, mount: &VolumeMount) -> Option<&'a Volume> {
    pods.spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name && v.secret.is_some())
}

/// The Secret's name a volume mounts.
fn secret_name(volume: &Volume) -> Option<&str> {
    volume.secret.as_ref()?.secret_name.as_deref()
}

/// The keys of its Secret a volume puts in the pod: its `items`, else every key `build` gives
/// the Secret.
fn keys_given(build: &Build, volume: &Volume) -> Vec<String> {
    let Some(secret) = &volume.secret else {
        return Vec::new();
    };
    match &secret.items {
        Some(items) => items.iter().map(|i| i.key.clone()).collect(),
        None => build
            .secrets
            .get(secret.secret_name.as_deref().unwrap_or_default())
            .map(|k| k.iter().cloned().collect())
            .unwrap_or_default(),
    }
}

/// Which Secret and key the file at `path` of the container is, as the kubelet lays out a
/// mounted Secret (its items' paths, else its keys as file names; a subPath mount is the one
/// file it names).
fn file_source(build: &Build, h: &HuskContainer<'_>, path: &str) -> Option<(String, String)> {
    for m in h.container.volume_mounts.iter().flatten() {
        let Some(volume) = secret_volume(h.pods, m) else {
            continue;
        };
        let secret = volume.secret.as_ref().expect("a Secret volume");
        let name = secret_name(volume).unwrap_or_default().to_owned();
        let mount = m.mount_path.trim_end_matches('/');
        let file = match m.sub_path.as_deref() {
            Some(sub) if mount == path => sub,
            Some(_) => continue,
            None => match path.strip_prefix(mount).and_then(|r| r.strip_prefix('/')) {
                Some(file) => file,
                None => continue,
            },
        };
        let key = match &secret.items {
            Some(items) => items.iter().find(|i| i.path == file).map(|i| i.key.clone()),
            None => build
                .secrets
                .get(&name)
                .filter(|keys| keys.contains(file))
                .map(|_| file.to_owned()),
        };
        if let Some(key) = key {
            return Some((name, key));
        }
    }
    None
}

/// Checks that the container's `--flag` is a file of key `key` of the Secret, written out.
fn file_from_secret(
    build: &Build,
    h: &HuskContainer<'_>,
    flag: &str,
    key: &str,
    at: &str,
    errors: &mut Vec<String>,
) {
    let Some(setting) = husk::setting(h.container, &h.inv, flag) else {
        errors.push(format!(
            "{at}: sets neither --{flag} nor {}",
            husk::env_name(flag)
        ));
        return;
    };
    let Some(path) = setting.literal() else {
        errors.push(format!("{at}: --{flag} is not a path written out"));
        return;
    };
    match file_source(build, h, path) {
        Some((secret, k)) if secret == SECRET && k == key => {}
        other => errors.push(format!(
            "{at}: --{flag} {path} is {other:?}, not key {key} of Secret {SECRET}"
        )),
    }
}

/// Checks that the container verifies the nodes as every node's certificate allows: the CA of
/// the Secret, and the one name.
fn verifies_nodes(build: &Build, h: &HuskContainer<'_>, at: &str, errors: &mut Vec<String>) {
    file_from_secret(build, h, "cluster-ca", CA, at, errors);
    match husk::setting(h.container, &h.inv, "cluster-tls-name") {
        Some(s) if s.literal() == Some(NAME) => {}
        Some(Setting::Env(e)) if e.value_from.is_some() => errors.push(format!(
            "{at}: {} is not written out: it must be {NAME}, the certificate's name",
            e.name
        )),
        other => errors.push(format!(
            "{at}: --cluster-tls-name is {:?}, not {NAME}: every node is reached at a pod \
             address its certificate cannot name",
            other.and_then(|s| s.literal().map(str::to_owned))
        )),
    }
}

#[test]
fn nodes_serve_https_where_the_component_is_and_everyone_verifies_them_by_one_name() {
    let mut errors = Vec::new();
    let mut with_component = 0;
    for (root, build) in roots(&kubernetes_dir()) {
        if !uses_component(&build, PODS) {
            continue;
        }
        with_component += 1;
        let here = shown(&root);
        match build.secrets.get(SECRET) {
            Some(keys) => {
                for key in [CERT, KEY, CA] {
                    if !keys.contains(key) {
                        errors.push(format!("{here}: Secret {SECRET} has no key {key}"));
                    }
                }
            }
            None => errors.push(format!("{here}: Secret {SECRET} is not made")),
        }
        if uses_component(&build, COMPONENT) {
            // Made from files here: as cert-manager makes it, so that a Certificate can take
            // the component's place without the pods noticing.
            let made = build.generated_types.get(SECRET).map(String::as_str);
            if made != Some(SECRET_TYPE) {
                errors.push(format!(
                    "{here}: {COMPONENT} makes Secret {SECRET} of type {made:?}, not \
                     {SECRET_TYPE}"
                ));
            }
        }
        let all = pods::all(&build.docs);
        let husk = husk_containers(&all);
        for h in running(&husk, "node") {
            let at = format!("{here}: {}", h.pods.owner);
            file_from_secret(&build, h, "tls-cert", CERT, &at, &mut errors);
            file_from_secret(&build, h, "tls-key", KEY, &at, &mut errors);
            // A node fetches template images from its peers, over their TLS.
            verifies_nodes(&build, h, &at, &mut errors);
            let url = husk::setting(h.container, &h.inv, "advertise-url")
                .and_then(|s| s.literal().map(str::to_owned))
                .unwrap_or_default();
            if !url.starts_with("https://") {
                errors.push(format!(
                    "{at}: advertises {url:?}: gateways would speak plain HTTP to a listener \
                     that serves HTTPS only"
                ));
            }
            for (kind, probe) in [
                ("startup", &h.container.startup_probe),
                ("liveness", &h.container.liveness_probe),
                ("readiness", &h.container.readiness_probe),
            ] {
                let scheme = probe
                    .as_ref()
                    .and_then(|p| p.http_get.as_ref())
                    .map(|g| g.scheme.as_deref().unwrap_or("HTTP"));
                if scheme.is_some_and(|s| s != "HTTPS") {
                    errors.push(format!("{at}: the {kind} probe is not HTTPS"));
                }
            }
        }
        for h in running(&husk, "gateway") {
            let at = format!("{here}: {}", h.pods.owner);
            verifies_nodes(&build, h, &at, &mut errors);
        }
    }
    assert_none("TLS on the node API", errors);
    assert!(
        with_component > 0,
        "no kustomization uses {PODS}: nothing checks it (overlays/with-node-tls)"
    );
}

#[test]
fn without_the_component_nobody_is_given_a_certificate_a_ca_or_a_name() {
    let base = kubernetes_dir().join("base");
    let mut errors = Vec::new();
    let mut base_checked = false;
    for (root, build) in roots(&kubernetes_dir()) {
        if uses_component(&build, PODS) {
            continue;
        }
        base_checked |= root == base;
        let here = shown(&root);
        let all = pods::all(&build.docs);
        let husk = husk_containers(&all);
        for h in running(&husk, "node")
            .into_iter()
            .chain(running(&husk, "gateway"))
        {
            let at = format!("{here}: {}", h.pods.owner);
            for flag in SETTINGS {
                if husk::setting(h.container, &h.inv, flag).is_some() {
                    errors.push(format!(
                        "{at}: sets --{flag} or {} without {PODS}",
                        husk::env_name(flag)
                    ));
                }
            }
        }
        for p in &all {
            for v in p.spec.volumes.iter().flatten() {
                if v.secret.as_ref().and_then(|s| s.secret_name.as_deref()) == Some(SECRET) {
                    errors.push(format!(
                        "{here}: {} mounts Secret {SECRET} without {PODS}",
                        p.owner
                    ));
                }
            }
        }
        if build.secrets.contains_key(SECRET) {
            errors.push(format!("{here}: makes Secret {SECRET}, which nothing uses"));
        }
    }
    assert_none("TLS where the component is not", errors);
    assert!(
        base_checked,
        "{} was not among the kustomizations checked",
        shown(&base)
    );
}

/// The nodes' private key is in the Secret with the CA; a gateway needs the CA alone. Every
/// way a pod can be given a Secret's key is checked: a volume (its `items`, or every key
/// without them), a projected volume, a variable, all of a Secret's keys as variables.
#[test]
fn only_nodes_are_given_the_nodes_private_key() {
    let mut errors = Vec::new();
    let mut others_with_the_ca = 0;
    for (root, build) in roots(&kubernetes_dir()) {
        let here = shown(&root);
        let all = pods::all(&build.docs);
        let husk = husk_containers(&all);
        let nodes: Vec<&str> = husk
            .iter()
            .filter(|h| h.inv.subcommand == "node")
            .map(|h| h.pods.owner.as_str())
            .collect();
        for p in all.iter().filter(|p| !nodes.contains(&p.owner.as_str())) {
            for v in p.spec.volumes.iter().flatten() {
                if v.secret.as_ref().and_then(|s| s.secret_name.as_deref()) == Some(SECRET) {
                    let keys = keys_given(&build, v);
                    if keys.iter().any(|k| k == KEY) {
                        errors.push(format!(
                            "{here}: {} mounts key {KEY} of Secret {SECRET} (volume {}, {}): \
                             list the keys it needs with `items`",
                            p.owner,
                            v.name,
                            if v.secret.as_ref().is_some_and(|s| s.items.is_some()) {
                                "named in its items"
                            } else {
                                "which has no items"
                            }
                        ));
                    } else if keys.iter().any(|k| k == CA) {
                        others_with_the_ca += 1;
                    }
                }
                let projected = v.projected.iter().flat_map(|p| p.sources.iter().flatten());
                for source in projected.filter_map(|s| s.secret.as_ref()) {
                    let items = source.items.as_ref();
                    if source.name == SECRET && items.is_none_or(|i| i.iter().any(|i| i.key == KEY))
                    {
                        errors.push(format!(
                            "{here}: {} projects key {KEY} of Secret {SECRET} (volume {})",
                            p.owner, v.name
                        ));
                    }
                }
            }
            for c in pods::containers(p.spec) {
                for e in c.env.iter().flatten() {
                    let r = e
                        .value_from
                        .as_ref()
                        .and_then(|v| v.secret_key_ref.as_ref());
                    if r.is_some_and(|r| r.name == SECRET && r.key == KEY) {
                        errors.push(format!(
                            "{here}: {} container {} reads key {KEY} of Secret {SECRET} as {}",
                            p.owner, c.name, e.name
                        ));
                    }
                }
                for from in c.env_from.iter().flatten() {
                    if from.secret_ref.as_ref().is_some_and(|s| s.name == SECRET) {
                        errors.push(format!(
                            "{here}: {} container {} takes every key of Secret {SECRET} as \
                             variables",
                            p.owner, c.name
                        ));
                    }
                }
            }
        }
    }
    assert_none("the nodes' private key", errors);
    // The gateways of overlays/with-node-tls mount the CA: a check that saw none proved nothing.
    assert!(
        others_with_the_ca > 0,
        "no pod but a node mounts {CA} of Secret {SECRET}: nothing checked that the key stays \
         out of it"
    );
}

/// husk reads its certificate and key again every 2 s, so a renewal needs no restart, if the
/// renewed Secret reaches the running pods: the Secret keeps its name (no hash suffix, which
/// would make a new Secret and roll the pods) and is mounted as a directory (the kubelet never
/// refreshes a `subPath` mount).
#[test]
fn a_renewed_node_certificate_reaches_running_pods() {
    let mut errors = Vec::new();
    let mut mounted = 0;
    for (root, build) in roots(&kubernetes_dir()) {
        let here = shown(&root);
        if build.generated_types.contains_key(SECRET) && !build.fixed_names.contains(SECRET) {
            errors.push(format!(
                "{here}: Secret {SECRET} gets a hash suffix: a renewal rolls the pods (and a \
                 Certificate would renew a Secret nothing mounts)"
            ));
        }
        for p in pods::all(&build.docs) {
            for c in pods::containers(p.spec) {
                for m in c.volume_mounts.iter().flatten() {
                    let Some(volume) = secret_volume(&p, m) else {
                        continue;
                    };
                    if secret_name(volume) != Some(SECRET) {
                        continue;
                    }
                    mounted += 1;
                    if m.sub_path.is_some() || m.sub_path_expr.is_some() {
                        errors.push(format!(
                            "{here}: {} container {} mounts Secret {SECRET} with subPath: \
                             never refreshed",
                            p.owner, c.name
                        ));
                    }
                    if m.read_only != Some(true) {
                        errors.push(format!(
                            "{here}: {} container {} mounts Secret {SECRET} without readOnly",
                            p.owner, c.name
                        ));
                    }
                }
            }
        }
    }
    assert_none("the node certificate's renewal", errors);
    assert!(
        mounted > 0,
        "no pod mounts Secret {SECRET}: nothing checked"
    );
}

/// A certificate comes with its key (husk refuses one without the other), and a name to verify
/// comes with the CA that signs it: the host's CAs do not sign a cluster's own certificates.
#[test]
fn certificates_come_with_their_keys_and_names_with_their_ca() {
    let mut errors = Vec::new();
    for (root, build) in roots(&kubernetes_dir()) {
        let all = pods::all(&build.docs);
        for h in husk_containers(&all) {
            let at = h.at(&root);
            let has = |flag| husk::setting(h.container, &h.inv, flag).is_some();
            if has("tls-cert") != has("tls-key") {
                errors.push(format!(
                    "{at}: --tls-cert and --tls-key go together (husk refuses one alone)"
                ));
            }
            if has("cluster-tls-name") && !has("cluster-ca") {
                errors.push(format!(
                    "{at}: --cluster-tls-name without --cluster-ca: the nodes' certificate would \
                     be checked against the image's public CAs"
                ));
            }
        }
    }
    assert_none("certificates and names", errors);
}
