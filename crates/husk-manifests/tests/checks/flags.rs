//! What each husk container asks of the binary: only flags and `HUSK_*` variables that
//! `husk <subcommand> --help` lists (the real binary, not a copy of its flags), and everything
//! the subcommand needs to run in a cluster, each secret from a Secret.

use super::assert_none;
use crate::support::husk::{self, env_name, Setting};
use crate::support::kustomize::roots;
use crate::support::{husk_containers, kubernetes_dir, pods, running, shown};

/// What a cluster's `husk node` and `husk gateway` must be given (flag or variable), by the
/// cluster's contract.
const NEEDS: [(&str, &[&str]); 2] = [
    (
        "node",
        &[
            "listen",
            "state-dir",
            "master-key",
            "database-url",
            "node-name",
            "cluster-token-file",
            "advertise-url",
            "capacity",
        ],
    ),
    ("gateway", &["listen", "database-url", "cluster-token-file"]),
];

/// Settings that carry a password or key: never a flag's value (it shows in the process
/// list); a variable from a Secret, or a file.
const FROM_SECRETS: [&str; 2] = ["database-url", "cluster-token"];

#[test]
fn husk_containers_pass_only_flags_and_variables_the_binary_accepts() {
    let mut helps = std::collections::BTreeMap::new();
    let mut errors = Vec::new();
    for (root, build) in roots(&kubernetes_dir()) {
        let all = pods::all(&build.docs);
        for h in husk_containers(&all) {
            let at = h.at(&root);
            let sub = h.inv.subcommand.clone();
            let help = match helps.entry(sub.clone()).or_insert_with(|| husk::help(&sub)) {
                Ok(help) => help,
                Err(e) => {
                    errors.push(e.clone());
                    continue;
                }
            };
            for (flag, _) in &h.inv.flags {
                if !help.flags.contains(flag) {
                    errors.push(format!("{at}: `husk {sub}` has no --{flag}"));
                }
            }
            for env in h.container.env.iter().flatten() {
                if env.name.starts_with("HUSK_") && !help.env.contains(&env.name) {
                    errors.push(format!("{at}: `husk {sub}` reads no {}", env.name));
                }
            }
        }
    }
    assert_none(
        "flags and variables the real husk does not accept (its --help lists them)",
        errors,
    );
}

#[test]
fn husk_containers_set_what_their_subcommand_needs() {
    let mut errors = Vec::new();
    for (root, build) in roots(&kubernetes_dir()) {
        let all = pods::all(&build.docs);
        for h in husk_containers(&all) {
            let at = h.at(&root);
            let Some((_, needs)) = NEEDS.iter().find(|(s, _)| *s == h.inv.subcommand) else {
                errors.push(format!(
                    "{at}: runs `husk {}`; a cluster runs `node` and `gateway`",
                    h.inv.subcommand
                ));
                continue;
            };
            for need in *needs {
                if husk::setting(h.container, &h.inv, need).is_none() {
                    errors.push(format!(
                        "{at}: sets neither --{need} nor {}",
                        env_name(need)
                    ));
                }
            }
            for (flag, _) in &h.inv.flags {
                if h.container
                    .env
                    .iter()
                    .flatten()
                    .any(|e| e.name == env_name(flag))
                {
                    errors.push(format!("{at}: sets both --{flag} and {}", env_name(flag)));
                }
            }
            for secret in FROM_SECRETS {
                match husk::setting(h.container, &h.inv, secret) {
                    Some(Setting::Flag(_)) => errors.push(format!(
                        "{at}: --{secret} on the command line shows in the process list"
                    )),
                    Some(Setting::Env(e))
                        if e.value_from
                            .as_ref()
                            .and_then(|v| v.secret_key_ref.as_ref())
                            .is_none() =>
                    {
                        errors.push(format!("{at}: {} is not from a Secret", e.name));
                    }
                    _ => {}
                }
            }
            match husk::setting(h.container, &h.inv, "listen")
                .and_then(|s| s.literal().map(str::to_owned))
            {
                Some(listen) if listen.starts_with("0.0.0.0:") => {}
                other => errors.push(format!(
                    "{at}: listens on {other:?}; only 0.0.0.0:PORT is reachable from other pods \
                     and the kubelet's probes"
                )),
            }
        }
    }
    assert_none("what the cluster's contract needs", errors);
}

#[test]
fn node_advertises_its_listen_port_at_the_pod_address_under_the_machines_name() {
    let mut errors = Vec::new();
    for (root, build) in roots(&kubernetes_dir()) {
        let all = pods::all(&build.docs);
        let all = husk_containers(&all);
        for h in running(&all, "node") {
            let at = format!("{}: {}", shown(&root), h.pods.owner);
            let env = h.container.env.as_deref().unwrap_or_default();
            let field = |name: &str| {
                env.iter()
                    .find(|e| e.name == name)
                    .and_then(|e| e.value_from.as_ref()?.field_ref.as_ref())
                    .map(|f| f.field_path.clone())
            };
            // The replaced pod on a machine must have the name its sandboxes were recorded
            // under.
            if field("HUSK_NODE_NAME").as_deref() != Some("spec.nodeName") {
                errors.push(format!(
                    "{at}: HUSK_NODE_NAME is not the machine's (spec.nodeName)"
                ));
            }
            let port = h.inv.value("listen").and_then(husk::listen_port);
            let url = husk::setting(h.container, &h.inv, "advertise-url")
                .and_then(|s| s.literal().map(str::to_owned))
                .unwrap_or_default();
            // The URL says how gateways connect, so it must be what the listener speaks: husk
            // refuses an https:// URL without --tls-cert, and the reverse.
            let tls = husk::setting(h.container, &h.inv, "tls-cert").is_some();
            let scheme = if tls { "https://" } else { "http://" };
            let Some((host, url_port)) =
                url.strip_prefix(scheme).and_then(|hp| hp.rsplit_once(':'))
            else {
                errors.push(format!(
                    "{at}: advertise URL {url:?} is not {scheme}HOST:PORT ({})",
                    if tls {
                        "the listener serves HTTPS: --tls-cert is set"
                    } else {
                        "the listener serves plain HTTP: no --tls-cert"
                    }
                ));
                continue;
            };
            if url_port.parse::<i32>().ok() != port {
                errors.push(format!(
                    "{at}: advertises port {url_port}, listens on {port:?}"
                ));
            }
            // `$(VAR)` is expanded only from variables defined before it.
            let var = host.strip_prefix("$(").and_then(|v| v.strip_suffix(')'));
            let url_at = env.iter().position(|e| e.name == "HUSK_ADVERTISE_URL");
            let var_at = var.and_then(|v| env.iter().position(|e| e.name == v));
            match (var, var_at, url_at) {
                (Some(v), Some(i), Some(j)) if i < j => {
                    if field(v).as_deref() != Some("status.podIP") {
                        errors.push(format!("{at}: {v} is not the pod's address (status.podIP)"));
                    }
                }
                _ => errors.push(format!(
                    "{at}: advertise URL host {host:?} is not $(VAR) of a variable set before it"
                )),
            }
        }
    }
    assert_none("how gateways reach nodes", errors);
}
