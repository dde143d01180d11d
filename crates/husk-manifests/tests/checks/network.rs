//! The NetworkPolicies admit the cluster's traffic and nothing else, evaluated as the API
//! defines them (a pod no policy selects for a direction is open in it; a selected one admits
//! what any rule of any of its policies admits) on the connections that matter: gateways to
//! nodes, nodes to nodes (template images), clients to gateways, PostgreSQL, DNS, sandboxes'
//! internet, Prometheus to the nodes' metrics (components/metrics), and what must stay out.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::assert_none;
use crate::support::kustomize::roots;
use crate::support::pods::{self, container_port, selects, Pods};
use crate::support::{husk, husk_containers, kubernetes_dir, running, shown, Object};

/// The other end of a connection.
#[derive(Clone, Copy)]
enum Peer<'a> {
    Pod(&'a Pods<'a>),
    /// A pod none of the manifests makes (another application of the cluster).
    Stranger,
    /// Prometheus's pod (labelled as kube-prometheus's and the Prometheus Operator's are), in
    /// a namespace of its own.
    Scraper,
    Ip(Ipv4Addr),
}

/// The namespace of the manifests' pods and policies (and of the stranger).
const NAMESPACE: &str = "husk";

impl Peer<'_> {
    fn labels(&self) -> Option<BTreeMap<String, String>> {
        match self {
            Peer::Pod(p) => Some(p.labels.clone()),
            Peer::Stranger => Some(BTreeMap::from([("app".into(), "stranger".into())])),
            Peer::Scraper => Some(BTreeMap::from([(
                "app.kubernetes.io/name".into(),
                "prometheus".into(),
            )])),
            Peer::Ip(_) => None,
        }
    }

    /// The labels of its namespace (the API server sets `kubernetes.io/metadata.name`).
    fn namespace_labels(&self) -> Option<BTreeMap<String, String>> {
        let name = match self {
            Peer::Pod(_) | Peer::Stranger => NAMESPACE,
            Peer::Scraper => "monitoring",
            Peer::Ip(_) => return None,
        };
        Some(BTreeMap::from([(
            "kubernetes.io/metadata.name".into(),
            name.into(),
        )]))
    }

    fn spec(&self) -> Option<&PodSpec> {
        match self {
            Peer::Pod(p) => Some(p.spec),
            _ => None,
        }
    }
}

fn in_cidr(ip: Ipv4Addr, cidr: &str) -> bool {
    let Some((net, len)) = cidr.split_once('/') else {
        return false;
    };
    let (Ok(net), Ok(len)) = (net.parse::<Ipv4Addr>(), len.parse::<u32>()) else {
        return false;
    };
    let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
    u32::from(ip) & mask == u32::from(net) & mask
}

fn peer_admitted(peers: Option<&Vec<NetworkPolicyPeer>>, peer: Peer<'_>) -> bool {
    let Some(peers) = peers.filter(|p| !p.is_empty()) else {
        return true;
    };
    peers.iter().any(|np| match (peer, &np.ip_block) {
        (Peer::Ip(ip), Some(block)) => {
            in_cidr(ip, &block.cidr) && !block.except.iter().flatten().any(|e| in_cidr(ip, e))
        }
        (Peer::Ip(_), None) | (Peer::Pod(_) | Peer::Stranger | Peer::Scraper, Some(_)) => false,
        (Peer::Pod(_) | Peer::Stranger | Peer::Scraper, None) => {
            let (Some(labels), Some(namespace)) = (peer.labels(), peer.namespace_labels()) else {
                return false;
            };
            // No namespace selector: the policy's own namespace; no pod selector: every pod
            // of the namespaces selected (the API requires one of the two).
            let in_namespace = match &np.namespace_selector {
                None => {
                    namespace
                        .get("kubernetes.io/metadata.name")
                        .map(String::as_str)
                        == Some(NAMESPACE)
                }
                Some(s) => selects(s, &namespace),
            };
            let pod = match &np.pod_selector {
                None => np.namespace_selector.is_some(),
                Some(s) => selects(s, &labels),
            };
            in_namespace && pod
        }
    })
}

/// Whether `ports` admit `port`/`protocol` on the destination (whose spec names named ports).
fn port_admitted(
    ports: Option<&Vec<NetworkPolicyPort>>,
    port: i32,
    protocol: &str,
    dest: Option<&PodSpec>,
) -> bool {
    let Some(ports) = ports.filter(|p| !p.is_empty()) else {
        return true;
    };
    ports.iter().any(|p| {
        p.protocol.as_deref().unwrap_or("TCP") == protocol
            && match &p.port {
                None => true,
                Some(IntOrString::Int(n)) => (*n..=p.end_port.unwrap_or(*n)).contains(&port),
                Some(named) => dest.and_then(|s| pods::pod_port(s, named)) == Some(port),
            }
    })
}

fn types(p: &NetworkPolicy) -> (bool, bool) {
    let spec = p.spec.as_ref().expect("a NetworkPolicy has a spec");
    match &spec.policy_types {
        Some(t) => (
            t.iter().any(|t| t == "Ingress"),
            t.iter().any(|t| t == "Egress"),
        ),
        None => (true, spec.egress.is_some()),
    }
}

/// Whether a connection from `from` to `to` on `port`/`protocol` is admitted.
fn admitted(
    policies: &[&NetworkPolicy],
    from: Peer<'_>,
    to: Peer<'_>,
    port: i32,
    protocol: &str,
) -> bool {
    let selecting = |peer: Peer<'_>, egress: bool| -> Vec<&NetworkPolicy> {
        let Some(labels) = peer.labels() else {
            return Vec::new();
        };
        policies
            .iter()
            .copied()
            .filter(|p| {
                let (i, e) = types(p);
                (if egress { e } else { i })
                    && selects(
                        &p.spec
                            .as_ref()
                            .expect("spec")
                            .pod_selector
                            .clone()
                            .unwrap_or_default(),
                        &labels,
                    )
            })
            .collect()
    };
    let out = selecting(from, true);
    let egress_ok = out.is_empty()
        || out.iter().any(|p| {
            p.spec
                .as_ref()
                .expect("spec")
                .egress
                .iter()
                .flatten()
                .any(|r| {
                    peer_admitted(r.to.as_ref(), to)
                        && port_admitted(r.ports.as_ref(), port, protocol, to.spec())
                })
        });
    let inbound = selecting(to, false);
    let ingress_ok = inbound.is_empty()
        || inbound.iter().any(|p| {
            p.spec
                .as_ref()
                .expect("spec")
                .ingress
                .iter()
                .flatten()
                .any(|r| {
                    peer_admitted(r.from.as_ref(), from)
                        && port_admitted(r.ports.as_ref(), port, protocol, to.spec())
                })
        });
    egress_ok && ingress_ok
}

#[test]
fn network_policies_admit_the_clusters_traffic_and_nothing_else() {
    let mut errors = Vec::new();
    for (root, build) in roots(&kubernetes_dir()) {
        let here = shown(&root);
        let policies: Vec<&NetworkPolicy> = build
            .docs
            .iter()
            .filter_map(|d| match &d.object {
                Object::NetworkPolicy(p) => Some(p),
                _ => None,
            })
            .collect();
        let all = pods::all(&build.docs);
        for p in &all {
            for (egress, direction) in [(false, "ingress"), (true, "egress")] {
                let covered = policies.iter().any(|n| {
                    let (i, e) = types(n);
                    (if egress { e } else { i })
                        && selects(
                            &n.spec
                                .as_ref()
                                .expect("spec")
                                .pod_selector
                                .clone()
                                .unwrap_or_default(),
                            &p.labels,
                        )
                });
                if !covered {
                    errors.push(format!(
                        "{here}: no NetworkPolicy limits {}'s {direction}",
                        p.owner
                    ));
                }
            }
        }
        let husk = husk_containers(&all);
        let node = running(&husk, "node")[0];
        let gateway = running(&husk, "gateway")[0];
        let port_of = |h: &crate::support::HuskContainer<'_>| {
            h.inv
                .value("listen")
                .and_then(husk::listen_port)
                .expect("a --listen port")
        };
        let (node_port, gateway_port) = (port_of(node), port_of(gateway));
        // components/metrics' port, where a node serves it (metrics.rs checks the rest).
        let metrics_port = husk::setting(node.container, &node.inv, "metrics-listen")
            .and_then(|s| s.literal().and_then(husk::listen_port));
        let (n, g) = (Peer::Pod(node.pods), Peer::Pod(gateway.pods));
        let world = Peer::Ip(Ipv4Addr::new(203, 0, 113, 9));
        let public = Peer::Ip(Ipv4Addr::new(1, 1, 1, 1));
        let private_db = Peer::Ip(Ipv4Addr::new(10, 0, 0, 5));
        let dns = Peer::Ip(Ipv4Addr::new(10, 96, 0, 10));
        let metadata = Peer::Ip(Ipv4Addr::new(169, 254, 169, 254));
        let lan = Peer::Ip(Ipv4Addr::new(192, 168, 1, 1));
        let mut cases = vec![
            ("a gateway to a node's API", g, n, node_port, "TCP", true),
            ("a gateway to a node's other ports", g, n, 22, "TCP", false),
            (
                "another pod to a node's API",
                Peer::Stranger,
                n,
                node_port,
                "TCP",
                false,
            ),
            // A node fetches a template's image from a node that holds it.
            ("a node to another node's API", n, n, node_port, "TCP", true),
            (
                "a node to another node's other ports",
                n,
                n,
                22,
                "TCP",
                false,
            ),
            (
                "the outside world to a node's API",
                world,
                n,
                node_port,
                "TCP",
                false,
            ),
            (
                "any pod to a gateway",
                Peer::Stranger,
                g,
                gateway_port,
                "TCP",
                true,
            ),
            (
                "the outside world to a gateway",
                world,
                g,
                gateway_port,
                "TCP",
                true,
            ),
            (
                "anyone to a gateway's other ports",
                Peer::Stranger,
                g,
                22,
                "TCP",
                false,
            ),
            ("a gateway to PostgreSQL", g, private_db, 5432, "TCP", true),
            ("a gateway to DNS", g, dns, 53, "UDP", true),
            ("a gateway to the internet", g, public, 443, "TCP", false),
            (
                "a gateway to another pod",
                g,
                Peer::Stranger,
                80,
                "TCP",
                false,
            ),
            ("a node to PostgreSQL", n, private_db, 5432, "TCP", true),
            ("a node to DNS", n, dns, 53, "UDP", true),
            ("a node to DNS over TCP", n, dns, 53, "TCP", true),
            (
                "a sandbox to the internet, https",
                n,
                public,
                443,
                "TCP",
                true,
            ),
            (
                "a sandbox to the internet, any port",
                n,
                public,
                22,
                "TCP",
                true,
            ),
            (
                "a sandbox to the cloud's metadata",
                n,
                metadata,
                80,
                "TCP",
                false,
            ),
            (
                "a sandbox to a private address",
                n,
                private_db,
                6379,
                "TCP",
                false,
            ),
            ("a sandbox to the LAN", n, lan, 80, "TCP", false),
            ("a node to another pod", n, Peer::Stranger, 80, "TCP", false),
        ];
        let scraper = Peer::Scraper;
        cases.push((
            "Prometheus to a node's API",
            scraper,
            n,
            node_port,
            "TCP",
            false,
        ));
        match metrics_port {
            Some(port) => cases.extend([
                (
                    "Prometheus to a node's metrics",
                    scraper,
                    n,
                    port,
                    "TCP",
                    true,
                ),
                (
                    "another pod to a node's metrics",
                    Peer::Stranger,
                    n,
                    port,
                    "TCP",
                    false,
                ),
                ("a gateway to a node's metrics", g, n, port, "TCP", false),
                (
                    "the outside world to a node's metrics",
                    world,
                    n,
                    port,
                    "TCP",
                    false,
                ),
                (
                    "Prometheus to a node's other ports",
                    scraper,
                    n,
                    22,
                    "TCP",
                    false,
                ),
            ]),
            // Without the component nothing listens there, and nothing may reach it either.
            None => cases.push((
                "Prometheus to a node's port 9464",
                scraper,
                n,
                9464,
                "TCP",
                false,
            )),
        }
        let husk_pods: Vec<&Pods<'_>> = all
            .iter()
            .filter(|p| p.spec.containers.iter().any(husk::is_husk))
            .collect();
        for p in all
            .iter()
            .filter(|p| !husk_pods.iter().any(|h| h.owner == p.owner))
        {
            // PostgreSQL of components/postgres: husk's pods in, nothing out.
            let port = p
                .spec
                .containers
                .iter()
                .find_map(|c| container_port(c, &IntOrString::String("postgres".into())));
            let Some(port) = port else {
                errors.push(format!(
                    "{here}: {} is neither husk's nor PostgreSQL",
                    p.owner
                ));
                continue;
            };
            let db = Peer::Pod(p);
            cases.extend([
                (
                    "a node to the in-cluster PostgreSQL",
                    n,
                    db,
                    port,
                    "TCP",
                    true,
                ),
                (
                    "a gateway to the in-cluster PostgreSQL",
                    g,
                    db,
                    port,
                    "TCP",
                    true,
                ),
                (
                    "another pod to the in-cluster PostgreSQL",
                    Peer::Stranger,
                    db,
                    port,
                    "TCP",
                    false,
                ),
                (
                    "the in-cluster PostgreSQL to the internet",
                    db,
                    public,
                    443,
                    "TCP",
                    false,
                ),
            ]);
        }
        for (what, from, to, port, protocol, expected) in cases {
            if admitted(&policies, from, to, port, protocol) != expected {
                let verb = if expected { "refused" } else { "admitted" };
                errors.push(format!("{here}: {what} (port {port}/{protocol}) is {verb}"));
            }
        }
    }
    assert_none("network policies", errors);
}
