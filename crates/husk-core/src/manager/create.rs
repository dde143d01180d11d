//! Creating a sandbox: checks, the quota reservation, the spawner, the agent's hello, the
//! template's start command and code contexts, then registration and supervision.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use husk_proto::{Hello, User, VERSION};
use husk_runtime::service::Created;
use husk_runtime::{Limits, SandboxSpec};
use time::OffsetDateTime;
use tokio::sync::Notify;

use super::limits::Reservation;
use super::{write, CoreError, CreateFailure, CreateRequest, CreateSource, LiveSandbox, Manager};
use crate::agent::AgentClient;
use crate::store::{Principal, SandboxRecord};
use crate::template::Resolved;

fn random_string(alphabet: &[u8], len: usize) -> Result<String, CoreError> {
    let mut bytes = vec![0u8; len];
    getrandom::fill(&mut bytes)
        .map_err(|e| CoreError::internal("the kernel's random number generator", e.to_string()))?;
    Ok(bytes
        .iter()
        .map(|b| alphabet[*b as usize % alphabet.len()] as char)
        .collect())
}

/// The variables that name a CA bundle for OpenSSL (and what reads `SSL_CERT_FILE`, such as
/// httpx), Python's requests and Node.
const CA_ENV: [&str; 3] = ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"];

/// A new sandbox id: 20 characters of `[a-z0-9]` (what clients' routing expects).
pub fn new_sandbox_id() -> Result<String, CoreError> {
    random_string(b"abcdefghijklmnopqrstuvwxyz0123456789", ID_LEN)
}

/// Sandbox ids' length, E2B's.
const ID_LEN: usize = 20;

impl Manager {
    /// A new sandbox id: this server's prefix (a cluster node's code), then random
    /// characters, 20 in all.
    pub fn new_id(&self) -> Result<String, CoreError> {
        let prefix = &self.config.id_prefix;
        let tail = random_string(
            b"abcdefghijklmnopqrstuvwxyz0123456789",
            ID_LEN.saturating_sub(prefix.len()).max(16),
        )?;
        Ok(format!("{prefix}{tail}"))
    }
}

/// Who a sandbox that is booted again is (a resume from disk): its id, credentials, start and
/// the saved layer it boots on.
pub struct Identity {
    pub id: String,
    pub access_token: String,
    pub traffic_access_token: String,
    pub started_at: OffsetDateTime,
    pub layer: String,
}

impl Manager {
    /// Creates a sandbox for `who`'s team.
    pub async fn create(
        self: &Arc<Self>,
        who: &Principal,
        req: CreateRequest,
    ) -> Result<Arc<LiveSandbox>, CoreError> {
        self.create_as(who, req, None, None).await
    }

    /// Creates a sandbox, new or (`identity`) booted again on its saved files; `pin` names
    /// the snapshot it stands on whatever the request's template says (a fork, a resume).
    pub(super) async fn create_as(
        self: &Arc<Self>,
        who: &Principal,
        req: CreateRequest,
        identity: Option<Identity>,
        pin: Option<String>,
    ) -> Result<Arc<LiveSandbox>, CoreError> {
        let started = std::time::Instant::now();
        let result = self.create_sourced(who, req, identity, pin).await;
        let outcome = match &result {
            Ok((_, source)) => Ok(*source),
            Err(e) => Err(CreateFailure::of(e)),
        };
        self.counters.record(outcome, started.elapsed());
        result.map(|(sb, _)| sb)
    }

    /// [`Manager::create_as`], saying where the sandbox came from.
    async fn create_sourced(
        self: &Arc<Self>,
        who: &Principal,
        req: CreateRequest,
        identity: Option<Identity>,
        pin: Option<String>,
    ) -> Result<(Arc<LiveSandbox>, CreateSource), CoreError> {
        // The pools refill only while no create is under way.
        let _creating = self.pools.creating();
        // The environment was checked when the request was made (EnvVars).
        // `husk-secret://NAME` values must name secrets of the team (resolved per process).
        if req
            .env
            .as_slice()
            .iter()
            .any(|(_, v)| v.starts_with(crate::secrets::SECRET_PREFIX))
        {
            let Some(secrets) = self.secrets() else {
                return Err(CoreError::InvalidArgument(
                    "secrets are not enabled on this server".into(),
                ));
            };
            secrets
                .check_refs(&who.team, req.env.as_slice())
                .map_err(|e| match e {
                    crate::secrets::SecretError::Store(e) => CoreError::Store(e),
                    other => CoreError::InvalidArgument(other.to_string()),
                })?;
        }
        let mounts = self.workspace_mounts(&who.team, &req.workspaces)?;
        let limits = self.request_limits(req.limits.as_ref())?;
        let rules = self.request_rules(&who.team, &req)?;
        self.check_memory_reserve()?;
        // May hash the image the first time this process uses it. A snapshot stays pinned
        // until the sandbox is registered (nothing removes its files meanwhile).
        let (template, pin) = self
            .resolve_for(&who.team, &req.template, pin.as_deref())
            .await?;
        template_user(&template)?;
        let reservation = self.reserve(&who.team)?;
        // In a task of its own: a client that goes away mid-create must not abandon a
        // half-made sandbox (it is finished, registered and later ends at its timeout).
        let this = self.clone();
        let who = who.clone();
        // A new sandbox of a template with a pool is a warm one, if the pool has one the
        // request fits.
        // (A claim that succeeds is counted as the pool's instead.)
        let (warm, source) = match (&identity, &pin) {
            (None, None) => (self.take_warm(&req, &template), CreateSource::New),
            (Some(_), _) => (None, CreateSource::Resume),
            (None, Some(_)) => (None, CreateSource::Snapshot),
        };
        tokio::spawn(async move {
            let result = match warm {
                Some(w) => match this
                    .claim(
                        &who,
                        req.clone(),
                        w,
                        &template,
                        Given {
                            limits: limits.clone(),
                            mounts: mounts.clone(),
                            rules: rules.clone(),
                        },
                    )
                    .await
                {
                    Ok(sb) => Ok((sb, CreateSource::Pool)),
                    Err(e) => {
                        tracing::warn!(
                            template = %template.name,
                            error = %crate::error_chain(&e),
                            "claiming a warm sandbox failed; creating a fresh one"
                        );
                        let given = Given {
                            limits,
                            mounts,
                            rules,
                        };
                        this.create_reserved(&who, req, template, given, None)
                            .await
                            .map(|sb| (sb, source))
                    }
                },
                None => {
                    let given = Given {
                        limits,
                        mounts,
                        rules,
                    };
                    this.create_reserved(&who, req, template, given, identity)
                        .await
                        .map(|sb| (sb, source))
                }
            };
            // On failure the reservation is dropped, giving its place back.
            let result = result.map(|(sb, source)| (this.go_live(sb, reservation), source));
            drop(pin);
            result
        })
        .await
        .map_err(|e| CoreError::internal("the creation task", e))?
    }

    pub(super) async fn create_reserved(
        self: &Arc<Self>,
        who: &Principal,
        req: CreateRequest,
        template: Resolved,
        given: Given,
        identity: Option<Identity>,
    ) -> Result<Arc<LiveSandbox>, CoreError> {
        let Given {
            limits,
            mounts,
            rules,
        } = given;
        let id = match &identity {
            Some(i) => i.id.clone(),
            None => self.new_id()?,
        };
        let policy = self.request_policy(req.network.as_ref())?;
        let own = identity.as_ref().map(|i| crate::saved_layers::LayerRef {
            home: crate::saved_layers::Home::Paused,
            owner: i.id.clone(),
            layer: i.layer.clone(),
        });
        let started = std::time::Instant::now();
        let (created, net) = self
            .spawn(&id, &template, own, mounts, &limits, policy, rules)
            .await?;
        let spawned = std::time::Instant::now();
        // From here on the sandbox exists: every failure undoes it, in one place.
        let mut undo = Undo {
            runtime_id: created.id.clone(),
            agent: None,
        };
        let booted = match self
            .boot(
                &who.team,
                &id,
                req.env.as_slice(),
                &template,
                created,
                net,
                &mut undo,
            )
            .await
        {
            Ok(b) => b,
            Err(e) => {
                undo.run(self).await;
                return Err(e);
            }
        };
        let booted_at = std::time::Instant::now();
        match self
            .register(who, id, req, &template, limits, booted, identity)
            .await
        {
            Ok(sb) => {
                let _ = sb.phases.set(super::CreatePhases {
                    spawn: spawned - started,
                    boot: booted_at - spawned,
                    register: booted_at.elapsed(),
                });
                Ok(sb)
            }
            Err(e) => {
                undo.run(self).await;
                Err(e)
            }
        }
    }

    /// The header rules a create asks for, resolved (its team's secrets named in them).
    fn request_rules(
        &self,
        team: &str,
        req: &CreateRequest,
    ) -> Result<Option<husk_net::rules::HeaderRules>, CoreError> {
        match &req.rules {
            Some(r) if !r.is_empty() => {
                if self.egress().is_none() {
                    return Err(CoreError::Unsupported(
                        "network.rules need sandboxes with a network (start husk serve with --egress)"
                            .into(),
                    ));
                }
                Ok(Some(self.resolve_rules(team, r)?))
            }
            _ => Ok(None),
        }
    }

    /// Has the host make a sandbox of `template` named `hostname` (with `own`, its paused
    /// layer, over the template's), linked to the router with `policy` when sandboxes have a
    /// network.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn spawn(
        &self,
        hostname: &str,
        template: &Resolved,
        own: Option<crate::saved_layers::LayerRef>,
        mounts: Vec<husk_runtime::MountSpec>,
        limits: &Limits,
        policy: husk_net::NetPolicy,
        rules: Option<husk_net::rules::HeaderRules>,
    ) -> Result<(Created, Option<husk_net::helper::Link>), CoreError> {
        let mut spec = SandboxSpec::idle();
        // Its own paused layer, then its snapshot's layers.
        for l in own.iter().chain(template.layers.iter()) {
            spec.layers.push(self.layer_path(l)?);
        }
        if spec.layers.len() > husk_runtime::spec::MAX_SAVED_LAYERS {
            return Err(CoreError::TemplateBroken(format!(
                "template '{}' stands on {} layers, more than a sandbox can mount",
                template.name,
                spec.layers.len()
            )));
        }
        spec.agent = true;
        // It outlives the server unless the operator said otherwise (husk_runtime::keep).
        spec.die_with_parent = !self.config.keep;
        spec.hostname = hostname.to_owned();
        spec.limits = limits.clone();
        spec.mounts = mounts;
        spec.rootfs = template.rootfs.clone();
        let host = self.host.clone();
        let helper = self.egress().map(|n| n.helper.clone());
        tokio::task::spawn_blocking(move || {
            // A link out from the router's pool, joined by the sandbox (with the router's
            // resolver as its name server).
            let net = match helper {
                Some(h) => Some(
                    h.attach(policy, rules)
                        .map_err(|e| CoreError::internal("linking the sandbox to the router", e))?,
                ),
                None => None,
            };
            if let Some(n) = &net {
                spec.network = husk_runtime::NetworkMode::Joined {
                    nameserver: n.gateway(),
                };
                spec.trust_ca = n.ca_pem().map(str::to_owned);
            }
            let created = host.create(&spec, net.as_ref().map(|n| n.netns.fd()))?;
            Ok::<_, CoreError>((created, net))
        })
        .await
        .map_err(|e| CoreError::internal("the creation task", e))?
    }

    /// Makes a sandbox the host created ready: its network namespace, the agent's hello (with
    /// the template's environment and `req_env` over it), the template's start command and
    /// code contexts. The caller undoes the sandbox if this fails.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn boot(
        &self,
        team: &str,
        hostname: &str,
        req_env: &[(String, String)],
        template: &Resolved,
        created: Created,
        net: Option<husk_net::helper::Link>,
        undo: &mut Undo,
    ) -> Result<Booted, CoreError> {
        // The sandbox's namespace as the spawner opened it, kept: ingress never resolves it
        // by pid.
        let netns = husk_net::netns::NetNs::from_fd(created.netns)
            .map_err(|e| CoreError::internal("the sandbox's network namespace", e))?;
        let has_ca = net.as_ref().is_some_and(|n| n.ca_pem().is_some());
        let default_user = template_user(template)?;
        let hello = Hello {
            version: VERSION,
            env: sandbox_env(&template.defaults.env, has_ca, req_env),
            default_user,
            default_workdir: template.defaults.workdir.clone(),
        };
        let agent = AgentClient::connect(created.agent, hello)
            .await
            .map_err(|e| CoreError::internal("the sandbox's agent did not start", e))?;
        undo.agent = Some(agent.clone());
        crate::start_cmd::run(&agent, template, default_user)
            .await
            .map_err(CoreError::TemplateBroken)?;
        let contexts = self
            .start_contexts(&agent, team, hostname, req_env, template, default_user)
            .await?;
        Ok(Booted {
            runtime_id: created.id,
            init_pid: created.init_pid,
            cgroup: created.cgroup,
            netns,
            net,
            agent,
            contexts,
            default_user,
        })
    }

    /// Gives a booted sandbox its tenant's identity and its backstop, and records it in the
    /// store; the caller makes it live ([`Self::go_live`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn register(
        self: &Arc<Self>,
        who: &Principal,
        id: String,
        req: CreateRequest,
        template: &Resolved,
        limits: Limits,
        booted: Booted,
        identity: Option<Identity>,
    ) -> Result<Arc<LiveSandbox>, CoreError> {
        let now = OffsetDateTime::now_utc();
        let timeout = self.clamp_timeout(req.timeout);
        let (access_token, traffic_access_token, started_at, base_layer) = match identity {
            Some(i) => (
                i.access_token,
                i.traffic_access_token,
                i.started_at,
                Some(i.layer),
            ),
            None => (
                random_string(b"0123456789abcdef", 40)?,
                random_string(b"0123456789abcdef", 40)?,
                now,
                None,
            ),
        };
        let Booted {
            runtime_id,
            init_pid,
            cgroup,
            netns,
            net,
            agent,
            contexts,
            default_user,
        } = booted;
        let contexts_changed = contexts.changed();
        let sb = Arc::new(LiveSandbox {
            id: id.clone(),
            team: who.team.clone(),
            template: req.template,
            runtime_id,
            agent,
            access_token,
            traffic_access_token,
            public_traffic: req.allow_public_traffic != Some(false),
            mask_request_host: req.mask_request_host.clone(),
            net_rules: Mutex::new(req.rules.unwrap_or_default()),
            env: req.env.into_vec(),
            metadata: req.metadata,
            allow_internet_access: req.allow_internet_access,
            started_at,
            limits,
            workspaces: req.workspaces,
            default_user,
            default_workdir: template.defaults.workdir.clone(),
            contexts,
            init_pid,
            netns,
            net,
            end_at: Mutex::new(now + timeout),
            timeout_changed: Notify::new(),
            cgroup,
            metrics: Mutex::new(super::metrics::MetricsLog::new()),
            redactions: Mutex::new(HashMap::new()),
            redacted_names: Mutex::new(HashMap::new()),
            kept: Mutex::new(super::kept::KeptState::default()),
            changed: contexts_changed,
            lifecycle: req.lifecycle,
            timeout,
            base_layer,
            origin: template.clone(),
            paused: std::sync::atomic::AtomicBool::new(false),
            paused_at: Mutex::new(None),
            transition: tokio::sync::Mutex::new(()),
            phases: std::sync::OnceLock::new(),
        });
        let description = super::kept::Running::of(&sb).to_json().ok();
        let record = SandboxRecord {
            id: id.clone(),
            team: sb.team.clone(),
            template: sb.template.clone(),
            runtime_id: sb.runtime_id.clone(),
            created_at: started_at,
            end_at: sb.end_at(),
            metadata: sb.metadata.clone(),
            description: description.clone(),
        };
        let inserted = self
            .arm_backstop(&sb, || self.store.insert_sandbox(&record))
            .await;
        match inserted {
            // Its supervisor writes it again only once something changed.
            Ok(()) => sb.kept_as_saved(description.unwrap_or_default()),
            Err(e) => tracing::warn!(sandbox = %id, error = %e, "could not record sandbox"),
        }
        Ok(sb)
    }

    /// Makes a registered sandbox live: from here on the API finds it, it counts among its
    /// team's running sandboxes in the place `reservation` held, and its supervisor enforces
    /// its timeout.
    pub(super) fn go_live(
        self: &Arc<Self>,
        sb: Arc<LiveSandbox>,
        reservation: Reservation,
    ) -> Arc<LiveSandbox> {
        reservation.settle(|| write(&self.sandboxes).insert(sb.id.clone(), sb.clone()));
        tokio::spawn(self.clone().supervise(sb.clone()));
        sb
    }

    /// The sandbox's code contexts, with the template's default ones started and ready.
    pub(super) async fn start_contexts(
        &self,
        agent: &AgentClient,
        team: &str,
        sandbox: &str,
        req_env: &[(String, String)],
        template: &Resolved,
        user: User,
    ) -> Result<Arc<crate::contexts::Contexts>, CoreError> {
        let defaults = &template.defaults;
        // Kernels get the sandbox's secrets in their process environment, as commands do,
        // and their use is audited as a command's is.
        let secrets = self
            .resolve_secrets(team, req_env, &mut Vec::new())
            .map_err(|e| CoreError::InvalidArgument(crate::error_chain(&e)))?;
        if !defaults.contexts.is_empty() {
            let what = format!("{} kernel", defaults.contexts.join(", "));
            self.audit_secrets(team, sandbox, &what, &secrets.names);
        }
        let (secret_envs, redact) = (secrets.env, Arc::new(secrets.redact));
        let cwd = defaults
            .workdir
            .clone()
            .unwrap_or_else(|| user.home().to_owned());
        let contexts = Arc::new(crate::contexts::Contexts::new(
            agent.clone(),
            crate::contexts::KernelEnv {
                user,
                secret_envs,
                redact,
            },
            cwd,
        ));
        for lang in &defaults.contexts {
            contexts.default_for(lang).await.map_err(|e| {
                CoreError::TemplateBroken(format!(
                    "template '{}': its {lang} context did not start: {e}",
                    template.name
                ))
            })?;
        }
        Ok(contexts)
    }
}

/// A sandbox the host made and [`Manager::boot`] made ready (its agent greeted, the
/// template's start command and default contexts running), not yet anyone's.
pub(super) struct Booted {
    pub(super) runtime_id: String,
    pub(super) init_pid: i32,
    pub(super) cgroup: husk_runtime::cgroup::SandboxCgroup,
    pub(super) netns: husk_net::netns::NetNs,
    pub(super) net: Option<husk_net::helper::Link>,
    pub(super) agent: AgentClient,
    pub(super) contexts: Arc<crate::contexts::Contexts>,
    pub(super) default_user: User,
}

/// What a create gives its sandbox beyond the template, checked and resolved: its limits,
/// its workspaces' mounts, its header rules.
#[derive(Clone)]
pub(super) struct Given {
    pub(super) limits: Limits,
    pub(super) mounts: Vec<husk_runtime::MountSpec>,
    pub(super) rules: Option<husk_net::rules::HeaderRules>,
}

/// A sandbox's environment: the template's, then the request's (which wins). With header
/// rules (`has_ca`), the TLS libraries' bundle variables name the bundle that holds the
/// sandbox's CA (over the template's, which would leave it out).
pub(super) fn sandbox_env(
    template_env: &[(String, String)],
    has_ca: bool,
    req_env: &[(String, String)],
) -> Vec<(String, String)> {
    let set_by_request = |k: &str| req_env.iter().any(|(rk, _)| rk == k);
    let mut env: Vec<(String, String)> = template_env
        .iter()
        .filter(|(k, _)| {
            let replaced = has_ca && CA_ENV.contains(&k.as_str());
            !set_by_request(k) && !replaced
        })
        .cloned()
        .collect();
    if has_ca {
        env.extend(
            CA_ENV
                .iter()
                .filter(|k| !set_by_request(k))
                .map(|k| (k.to_string(), husk_runtime::trust::BUNDLE.to_string())),
        );
    }
    env.extend(req_env.iter().cloned());
    env
}

/// A created sandbox that did not become ready: destroyed, its agent connection closed.
pub(super) struct Undo {
    pub(super) runtime_id: String,
    pub(super) agent: Option<AgentClient>,
}

impl Undo {
    pub(super) async fn run(self, manager: &Manager) {
        if let Some(agent) = self.agent {
            agent.close().await;
        }
        manager.destroy_runtime(self.runtime_id).await;
    }
}

/// The user a template's commands run as: one of the two sandbox users; anything else is a
/// broken template, never silently the unprivileged one.
fn template_user(template: &Resolved) -> Result<User, CoreError> {
    match template.defaults.user.as_deref() {
        None => Ok(User::User),
        Some(name) => User::from_name(name).ok_or_else(|| {
            CoreError::TemplateBroken(format!(
                "template '{}' names user {name:?}, which is neither user nor root; rebuild \
                 the template",
                template.name
            ))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::TemplateDefaults;

    fn with_user(user: Option<&str>) -> Resolved {
        Resolved {
            name: "t".into(),
            rootfs: husk_runtime::RootSource::Host,
            defaults: TemplateDefaults {
                user: user.map(str::to_owned),
                ..TemplateDefaults::default()
            },
            ..Resolved::default()
        }
    }

    #[test]
    fn a_template_names_one_of_the_two_users_or_is_broken() {
        assert_eq!(template_user(&with_user(None)).unwrap(), User::User);
        assert_eq!(template_user(&with_user(Some("user"))).unwrap(), User::User);
        assert_eq!(template_user(&with_user(Some("root"))).unwrap(), User::Root);
        for bad in ["Root", "nobody", "0", ""] {
            assert!(
                matches!(
                    template_user(&with_user(Some(bad))),
                    Err(CoreError::TemplateBroken(_))
                ),
                "{bad:?}"
            );
        }
    }
}
