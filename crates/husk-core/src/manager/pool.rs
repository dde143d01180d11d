//! Warm pools: per template, sandboxes made ahead of demand, booted as far as a create would
//! boot them (the agent greeted, the template's start command run, its code contexts' kernels
//! started and ready), and handed to the creates that ask for that template.
//!
//! A warm sandbox is no one's: no team, no record in the store, not in the API's map, never
//! given user code. It boots with everything that is the same for every create of its
//! template (the server's limits and default network policy, the template's environment) under
//! a placeholder name. The create that claims it gives it the rest, as a fresh create would
//! have had it from the start:
//! - its id: the kernel's hostname (set by the spawner) and the files init wrote it in
//!   (`Request::Assign`, the agent);
//! - its limits, when the create asks for lower ones than the server's: the spawner lowers
//!   its cgroups' limits and resizes its writable layer, and refuses where the sandbox
//!   already uses more (the claim then fails, see below);
//! - its workspaces: the spawner mounts them into the running sandbox, id-mapped and
//!   read-only unless asked otherwise, on mount points made as a create makes them;
//! - its environment: the agent's, for every process started from then on, and, set by
//!   silent code that leaves nothing in their namespace, the running kernels' (the create's
//!   variables and its secrets' values, redacted in their output from then on);
//! - its network policy (the router's rules for its link), when it differs from the default;
//! - its team, metadata, timeout, lifecycle, tokens and start time (the server's own record).
//!
//! A create whose sandbox a warm one cannot be made into is served by a fresh create, as is
//! every create while the pool is empty: one with header rules (the router's CA is written
//! into a sandbox's trust store only when it is made with rules), with variables for a
//! template with a start command (that command already runs, with the template's environment)
//! or with kernels in a language husk cannot set variables in, a snapshot or a resume. A claim
//! that fails destroys the warm sandbox and falls back to a fresh create too. A claimed sandbox
//! is never given back.
//!
//! The pool refills in the background, one sandbox at a time, and only while no create is
//! under way: it never competes with a client for the spawner. It stops filling while the
//! host's available memory is below [`Config::warm_memory_floor`] and gives its warm sandboxes
//! back, one per pass, while it stays below. A warm sandbox's agent has a deadline in the past:
//! when the server goes (a crash, an orderly stop that keeps sandboxes), it ends at once rather
//! than waiting for a next server that would not know it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use super::create::{new_sandbox_id, sandbox_env, Booted, Given, Undo};
use super::{CoreError, CreateRequest, LiveSandbox, Manager};
use crate::store::Principal;
use crate::template::Resolved;

/// How often the refill looks again when nothing woke it (a template that failed to fill, a
/// host short of memory).
const PASS: Duration = Duration::from_secs(2);
/// Longest wait after a failed fill (it doubles from [`PASS`] on each failure in a row).
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// Most warm sandboxes one template's pool may hold.
pub const MAX_WARM: u32 = 1000;

/// A pool the server keeps: `template` (a template's name), `size` warm sandboxes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmTarget {
    pub template: String,
    pub size: u32,
}

impl std::str::FromStr for WarmTarget {
    type Err = String;

    /// `TEMPLATE=N` (`husk serve --warm code-interpreter=8`).
    fn from_str(s: &str) -> Result<WarmTarget, String> {
        let (template, size) = s
            .rsplit_once('=')
            .ok_or_else(|| format!("{s:?}: expected TEMPLATE=COUNT, e.g. code-interpreter=8"))?;
        let size: u32 = size
            .parse()
            .map_err(|_| format!("{s:?}: the count must be a whole number"))?;
        if template.is_empty() {
            return Err(format!("{s:?}: no template named"));
        }
        if size > MAX_WARM {
            return Err(format!(
                "{s:?}: at most {MAX_WARM} warm sandboxes per template"
            ));
        }
        Ok(WarmTarget {
            template: template.to_owned(),
            size,
        })
    }
}

/// What a pool did, as the API and the logs show it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct PoolStats {
    pub template: String,
    /// Warm sandboxes it keeps.
    pub target: u32,
    /// Warm sandboxes ready now.
    pub ready: u32,
    /// Being made now.
    pub filling: u32,
    /// Creates it served.
    pub claimed: u64,
    /// Claims that failed (the warm sandbox destroyed, the create made fresh).
    pub claim_failed: u64,
    /// Creates of its template it could not serve (empty, or a create it cannot fit).
    pub missed: u64,
    /// Warm sandboxes made.
    pub made: u64,
    /// Fills that failed.
    pub failed: u64,
    /// Warm sandboxes destroyed unclaimed (template rebuilt, pool shrunk, memory short).
    pub discarded: u64,
    /// Why the last fill failed, while the pool has not filled since.
    pub last_error: Option<String>,
}

/// One warm sandbox.
pub(super) struct Warm {
    /// The pool it is of.
    pool: String,
    booted: Booted,
    /// What it was made of: a create of a rebuilt template does not get it.
    template: Resolved,
    /// Its placeholder name until claimed.
    hostname: String,
    policy: husk_net::NetPolicy,
}

#[derive(Default)]
struct Pool {
    ready: VecDeque<Warm>,
    stats: PoolStats,
    /// No fill before this (after failures).
    next_try: Option<tokio::time::Instant>,
    failures: u32,
}

/// Host memory available, in bytes (`None`: unknown). A seam: tests give the pool a host
/// short of memory.
pub type MemoryProbe = Arc<dyn Fn() -> Option<u64> + Send + Sync>;

/// Every pool of the server.
pub(super) struct Pools {
    pools: Mutex<HashMap<String, Pool>>,
    /// Creates under way (claims and fresh ones): the refill waits for none.
    creating: AtomicUsize,
    /// A refill pass found creates under way and put its work off: the last of them to end
    /// wakes the refill. Only then: a pass after every create would list the templates and
    /// read the host's memory for nothing, once per create.
    deferred: std::sync::atomic::AtomicBool,
    /// Told when a create ends after a pass was put off, or a sandbox is claimed.
    wake: Arc<Notify>,
    memory: Mutex<MemoryProbe>,
    started: std::sync::atomic::AtomicBool,
    /// Set at the server's stop: the refill makes nothing more.
    stopped: std::sync::atomic::AtomicBool,
}

impl Default for Pools {
    fn default() -> Self {
        Pools {
            pools: Mutex::new(HashMap::new()),
            creating: AtomicUsize::new(0),
            deferred: std::sync::atomic::AtomicBool::new(false),
            wake: Arc::new(Notify::new()),
            memory: Mutex::new(Arc::new(super::host_memory_available)),
            started: std::sync::atomic::AtomicBool::new(false),
            stopped: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Counts a create under way for as long as it lives.
pub(super) struct Creating<'a>(&'a Pools);

impl Drop for Creating<'_> {
    fn drop(&mut self) {
        // SeqCst with `Pools::put_off`: either that pass sees this create gone, or this sees
        // the pass put off (see there).
        if self.0.creating.fetch_sub(1, Ordering::SeqCst) == 1
            && self.0.deferred.swap(false, Ordering::SeqCst)
        {
            self.0.wake.notify_one();
        }
    }
}

impl Pools {
    pub(super) fn creating(&self) -> Creating<'_> {
        self.creating.fetch_add(1, Ordering::AcqRel);
        Creating(self)
    }

    /// Whether a refill pass must wait for creates under way; if so, the last of them wakes
    /// it when it ends. The mark is set before the count is read and the create's end lowers
    /// the count before it reads the mark (all SeqCst), so a create that ends while the pass
    /// looks is either not counted or sees the mark: never a pass put off with nobody left
    /// to wake it.
    fn put_off(&self) -> bool {
        self.deferred.store(true, Ordering::SeqCst);
        if self.creating.load(Ordering::SeqCst) > 0 {
            return true;
        }
        self.deferred.store(false, Ordering::SeqCst);
        false
    }

    fn memory_available(&self) -> Option<u64> {
        let probe = lock(&self.memory).clone();
        probe()
    }
}

/// Why a create cannot have a warm sandbox of its template, or `None` if it can. Its limits
/// (never above the server's, which warm sandboxes have), workspaces and network policy are
/// given at the claim.
pub(super) fn misfit(req: &CreateRequest, template: &Resolved) -> Option<&'static str> {
    if template.snapshot.is_some() || !template.layers.is_empty() {
        return Some("a snapshot");
    }
    // Header rules need the router's CA in the sandbox's trust store, which is written only
    // when a sandbox is made with rules (a sandbox made without never trusts it).
    if req.rules.as_ref().is_some_and(|r| !r.is_empty()) {
        return Some("header rules");
    }
    if !req.env.as_slice().is_empty() {
        if template.defaults.start_cmd.is_some() {
            return Some("variables, and a template with a start command");
        }
        let settable = |lang: &String| {
            let lang = crate::contexts::normalize_language(lang);
            crate::contexts::envcode_assign(&lang, req.env.as_slice()).is_some()
        };
        if !template.defaults.contexts.iter().all(settable) {
            return Some("variables a kernel of the template cannot be given");
        }
    }
    None
}

impl Manager {
    /// The pools' figures, by template.
    pub fn pool_stats(&self) -> Vec<PoolStats> {
        let pools = lock(&self.pools.pools);
        let mut v: Vec<PoolStats> = pools
            .iter()
            .map(|(name, p)| PoolStats {
                template: name.clone(),
                ready: p.ready.len() as u32,
                ..p.stats.clone()
            })
            .collect();
        v.sort_by(|a, b| a.template.cmp(&b.template));
        v
    }

    /// Replaces how the pools read the host's available memory (tests).
    pub fn set_pool_memory_probe(&self, probe: MemoryProbe) {
        *lock(&self.pools.memory) = probe;
        self.pools.wake.notify_one();
    }

    /// Starts keeping the pools full (once): those of `--warm`, and those templates' specs ask
    /// for (`sandbox.warm`), which the refill looks at on each pass.
    pub fn spawn_pools(self: &Arc<Self>) {
        if self.pools.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let Some(m) = weak.upgrade() else { return };
                let next = m.refill_pass().await;
                let wake = m.pools_wake();
                drop(m);
                // The manager is not kept alive while the loop waits.
                let _ = tokio::time::timeout(next, wake.notified_owned()).await;
            }
        });
    }

    fn pools_wake(&self) -> Arc<Notify> {
        self.pools.wake.clone()
    }

    /// One pass of the refill: drops what is stale, gives memory back, makes at most one
    /// warm sandbox; returns how long to wait for the next unless woken.
    async fn refill_pass(self: &Arc<Self>) -> Duration {
        if self.pools.stopped.load(Ordering::Acquire) {
            return MAX_BACKOFF;
        }
        // Never while a create is under way.
        if self.pools.put_off() {
            return PASS;
        }
        let floor = self.config.warm_memory_floor;
        let short = floor > 0
            && self
                .pools
                .memory_available()
                .is_some_and(|available| available < floor);
        if short {
            // One per pass, the fullest pool's oldest first; nothing is made.
            let victim = {
                let mut pools = lock(&self.pools.pools);
                let fullest = pools
                    .iter_mut()
                    .filter(|(_, p)| !p.ready.is_empty())
                    .max_by_key(|(_, p)| p.ready.len());
                fullest.and_then(|(_, p)| {
                    p.stats.discarded += 1;
                    p.ready.pop_front()
                })
            };
            return match victim {
                Some(w) => {
                    tracing::info!("host memory is short: a warm sandbox is given back");
                    self.discard(w).await;
                    // The next at once if memory is still short.
                    Duration::ZERO
                }
                None => PASS,
            };
        }
        let targets = self.pool_targets();
        let names: Vec<(String, u32)> = {
            let mut pools = lock(&self.pools.pools);
            for (name, p) in pools.iter_mut() {
                p.stats.target = targets.get(name).copied().unwrap_or(0);
            }
            for (name, n) in &targets {
                pools.entry(name.clone()).or_default().stats.target = *n;
            }
            pools
                .iter()
                .map(|(n, p)| (n.clone(), p.stats.target))
                .collect()
        };
        let now = tokio::time::Instant::now();
        for (name, target) in names {
            let template = match self.resolve_template(&name).await {
                Ok(t) => t,
                Err(e) => {
                    // Not built yet, or removed (its warm sandboxes go): said, and looked for
                    // again each pass.
                    let gone: Vec<Warm> = {
                        let mut pools = lock(&self.pools.pools);
                        let p = pools.entry(name.clone()).or_default();
                        p.stats.last_error = Some(e.to_string());
                        if matches!(e, CoreError::TemplateNotFound(_)) {
                            p.stats.discarded += p.ready.len() as u64;
                            p.ready.drain(..).collect()
                        } else {
                            Vec::new()
                        }
                    };
                    for w in gone {
                        self.discard(w).await;
                    }
                    continue;
                }
            };
            // Warm sandboxes of an older build of the template are of no use.
            let stale: Vec<Warm> = {
                let mut pools = lock(&self.pools.pools);
                let p = pools.entry(name.clone()).or_default();
                let (mut keep, mut stale): (VecDeque<Warm>, VecDeque<Warm>) = p
                    .ready
                    .drain(..)
                    .partition(|w| same_template(&w.template, &template));
                // A pool made smaller gives back its oldest.
                while keep.len() > target as usize {
                    stale.extend(keep.pop_front());
                }
                p.ready = keep;
                p.stats.discarded += stale.len() as u64;
                stale.into_iter().collect()
            };
            for w in stale {
                self.discard(w).await;
            }
            let due = {
                let pools = lock(&self.pools.pools);
                pools.get(&name).is_some_and(|p| {
                    (p.ready.len() as u32) < target && p.next_try.is_none_or(|t| t <= now)
                })
            };
            if !due {
                continue;
            }
            if let Err(e) = self.check_memory_reserve() {
                self.fill_failed(&name, &e.to_string());
                return PASS;
            }
            if let Some(p) = lock(&self.pools.pools).get_mut(&name) {
                p.stats.filling += 1;
            }
            let made = self.make_warm(&name, template).await;
            let made = match made {
                // Made while the server stopped: it would outlive the drain.
                Ok(w) if self.pools.stopped.load(Ordering::Acquire) => {
                    self.discard(w).await;
                    Err(CoreError::Unsupported("the server is stopping".into()))
                }
                other => other,
            };
            let mut pools = lock(&self.pools.pools);
            let p = pools.entry(name.clone()).or_default();
            p.stats.filling -= 1;
            match made {
                Ok(w) => {
                    p.stats.made += 1;
                    p.stats.last_error = None;
                    p.failures = 0;
                    p.next_try = None;
                    p.ready.push_back(w);
                }
                Err(e) => {
                    drop(pools);
                    tracing::warn!(template = %name, error = %e, "making a warm sandbox failed");
                    self.fill_failed(&name, &e.to_string());
                }
            }
            // One sandbox per pass: a create that came meanwhile goes first.
            return Duration::ZERO;
        }
        PASS
    }

    /// The pools to keep, by name: the templates whose spec asks for one, then `--warm`
    /// (which wins, and may set a template's to 0).
    pub(super) fn pool_targets(&self) -> std::collections::BTreeMap<String, u32> {
        let mut targets = std::collections::BTreeMap::new();
        match self.store.templates() {
            Ok(all) => {
                for t in all {
                    if let Some(n) = t.manifest.defaults.warm.filter(|n| *n > 0) {
                        targets.insert(t.name, n.min(MAX_WARM));
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "listing the templates for their pools failed"),
        }
        for t in &self.config.warm {
            targets.insert(t.template.clone(), t.size);
        }
        targets.retain(|_, n| *n > 0);
        targets
    }

    fn fill_failed(&self, name: &str, why: &str) {
        let mut pools = lock(&self.pools.pools);
        let p = pools.entry(name.to_owned()).or_default();
        p.stats.failed += 1;
        p.stats.last_error = Some(why.to_owned());
        p.failures = p.failures.saturating_add(1);
        let wait = PASS.saturating_mul(1 << p.failures.min(6)).min(MAX_BACKOFF);
        p.next_try = Some(tokio::time::Instant::now() + wait);
    }

    /// Makes one warm sandbox of `template`.
    async fn make_warm(
        self: &Arc<Self>,
        pool: &str,
        template: Resolved,
    ) -> Result<Warm, CoreError> {
        let hostname = new_sandbox_id()?;
        let policy = self.request_policy(None)?;
        let limits = self.config.limits.clone();
        let (created, net) = self
            .spawn(
                &hostname,
                &template,
                None,
                Vec::new(),
                &limits,
                policy.clone(),
                None,
            )
            .await?;
        let mut undo = Undo {
            runtime_id: created.id.clone(),
            agent: None,
        };
        let booted = match self
            .boot("", &hostname, &[], &template, created, net, &mut undo)
            .await
        {
            Ok(b) => b,
            Err(e) => {
                undo.run(self).await;
                return Err(e);
            }
        };
        // With no server connected it ends at once (see the module's notes).
        if let Err(e) = booted.agent.set_deadline(Some(std::time::UNIX_EPOCH)).await {
            undo.run(self).await;
            return Err(CoreError::internal("the warm sandbox's agent", e));
        }
        Ok(Warm {
            pool: pool.to_owned(),
            booted,
            template,
            hostname,
            policy,
        })
    }

    /// Server stop: no more fills, and every warm sandbox destroyed (none outlives the server
    /// whatever it does with its other sandboxes); returns how many.
    pub async fn drain_pools(&self) -> usize {
        self.pools.stopped.store(true, Ordering::Release);
        let all: Vec<Warm> = lock(&self.pools.pools)
            .values_mut()
            .flat_map(|p| p.ready.drain(..))
            .collect();
        let n = all.len();
        for w in all {
            self.discard(w).await;
        }
        n
    }

    async fn discard(&self, w: Warm) {
        let Warm { booted, .. } = w;
        booted.agent.close().await;
        self.destroy_runtime(booted.runtime_id).await;
    }

    /// Takes a warm sandbox for a create of `template`, if its pool has one it fits.
    pub(super) fn take_warm(&self, req: &CreateRequest, template: &Resolved) -> Option<Warm> {
        let mut pools = lock(&self.pools.pools);
        // The pool is named as the server was told (`base`), the template as registered.
        let key = [req.template.as_str(), template.name.as_str()]
            .into_iter()
            .find(|k| pools.contains_key(*k))?
            .to_owned();
        let p = pools.get_mut(&key)?;
        if let Some(why) = misfit(req, template) {
            tracing::debug!(template = %template.name, why, "a create a warm sandbox cannot serve");
            p.stats.missed += 1;
            return None;
        }
        let at = p
            .ready
            .iter()
            .position(|w| same_template(&w.template, template));
        match at.and_then(|i| p.ready.remove(i)) {
            Some(w) => {
                drop(pools);
                // Refill.
                self.pools.wake.notify_one();
                Some(w)
            }
            None => {
                p.stats.missed += 1;
                None
            }
        }
    }

    /// Gives a warm sandbox to `who` as the sandbox `req` asks for. On failure the warm
    /// sandbox is destroyed (the caller falls back to a fresh create).
    pub(super) async fn claim(
        self: &Arc<Self>,
        who: &Principal,
        req: CreateRequest,
        warm: Warm,
        template: &Resolved,
        given: Given,
    ) -> Result<Arc<LiveSandbox>, CoreError> {
        let undo = Undo {
            runtime_id: warm.booted.runtime_id.clone(),
            agent: Some(warm.booted.agent.clone()),
        };
        let pool = warm.pool.clone();
        let claimed = self.claim_inner(who, req, warm, template, given).await;
        {
            let mut pools = lock(&self.pools.pools);
            let p = pools.entry(pool).or_default();
            match &claimed {
                Ok(_) => p.stats.claimed += 1,
                Err(e) => {
                    p.stats.claim_failed += 1;
                    p.stats.last_error = Some(crate::error_chain(e));
                }
            }
        }
        if claimed.is_err() {
            undo.run(self).await;
        }
        claimed
    }

    async fn claim_inner(
        self: &Arc<Self>,
        who: &Principal,
        req: CreateRequest,
        warm: Warm,
        template: &Resolved,
        given: Given,
    ) -> Result<Arc<LiveSandbox>, CoreError> {
        let Warm {
            mut booted,
            hostname,
            policy: warm_policy,
            ..
        } = warm;
        let Given {
            limits,
            mounts,
            rules,
        } = given;
        let id = self.new_id()?;
        let policy = self.request_policy(req.network.as_ref())?;
        let agent = booted.agent.clone();
        // Until its supervisor sets its own backstop, it waits for a server like any other.
        agent
            .set_deadline(None)
            .await
            .map_err(|e| CoreError::internal("the warm sandbox's agent", e))?;
        // Its network policy and header rules (the router's rules for its link), then, from
        // the host: lower limits, its workspaces' mounts, the kernel's hostname (its root
        // cannot set it). Both block.
        let assignment = husk_runtime::Assignment {
            hostname: id.clone(),
            limits: (limits != self.config.limits).then(|| limits.clone()),
            mounts,
        };
        let change = policy != warm_policy || rules.is_some();
        // The link goes to the blocking task and back (on a failure it is dropped there, which
        // unlinks it; the sandbox is destroyed).
        let net = booted.net.take();
        let (host, runtime_id) = (self.host.clone(), booted.runtime_id.clone());
        booted.net = tokio::task::spawn_blocking(move || {
            if let Some(link) = net.as_ref().filter(|_| change) {
                link.set_policy(policy, rules.unwrap_or_default())
                    .map_err(|e| CoreError::internal("setting the sandbox's network policy", e))?;
            }
            host.assign(&runtime_id, &assignment)
                .map_err(|e| CoreError::internal("giving the warm sandbox its own", e))?;
            Ok::<_, CoreError>(net)
        })
        .await
        .map_err(|e| CoreError::internal("the claiming task", e))??;
        // The files that carry its name.
        let has_ca = booted.net.as_ref().is_some_and(|n| n.ca_pem().is_some());
        let env = sandbox_env(&template.defaults.env, has_ca, req.env.as_slice());
        match agent
            .call(husk_proto::Request::Assign {
                hostname: id.clone(),
                env,
            })
            .await
        {
            Ok(husk_proto::Reply::Done) => {}
            Ok(_) => {
                return Err(CoreError::internal(
                    "naming the warm sandbox",
                    "a wrong reply",
                ))
            }
            Err(e) => return Err(CoreError::internal("naming the warm sandbox", e)),
        }
        tracing::debug!(from = %hostname, to = %id, "a warm sandbox is claimed");
        // Its kernels get what they would have started with: the create's variables, its
        // secrets' values over them.
        let secrets = self
            .resolve_secrets(&who.team, req.env.as_slice(), &mut Vec::new())
            .map_err(|e| CoreError::InvalidArgument(crate::error_chain(&e)))?;
        if !template.defaults.contexts.is_empty() {
            let what = format!("{} kernel", template.defaults.contexts.join(", "));
            self.audit_secrets(&who.team, &id, &what, &secrets.names);
        }
        let mut vars = req.env.as_slice().to_vec();
        vars.extend(secrets.env.iter().cloned());
        let env = crate::contexts::KernelEnv {
            user: booted.default_user,
            secret_envs: secrets.env,
            redact: Arc::new(secrets.redact),
        };
        let contexts = booted
            .contexts
            .claimed(env, &vars)
            .await
            .map_err(|e| CoreError::internal("the warm sandbox's kernels", e))?;
        booted.contexts = Arc::new(contexts);
        self.register(who, id, req, template, limits, booted, None)
            .await
    }
}

/// Whether a warm sandbox made of `a` is what a create of `b` would make.
fn same_template(a: &Resolved, b: &Resolved) -> bool {
    a.name == b.name && a.rootfs == b.rootfs && a.defaults == b.defaults && a.layers == b.layers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warm_targets_parse_as_template_equals_count() {
        assert_eq!(
            "code-interpreter=8".parse::<WarmTarget>().unwrap(),
            WarmTarget {
                template: "code-interpreter".into(),
                size: 8
            }
        );
        assert_eq!("a=b=0".parse::<WarmTarget>().unwrap().template, "a=b");
        for bad in ["x", "=3", "x=-1", "x=many", "x=1001"] {
            assert!(bad.parse::<WarmTarget>().is_err(), "{bad}");
        }
    }

    /// Whether the refill has been woken (a permit is waiting), taking the permit.
    fn woken(p: &Pools) -> bool {
        let notified = p.wake.notified();
        tokio::pin!(notified);
        // `enable` takes a stored permit at once, without a runtime.
        notified.as_mut().enable()
    }

    #[test]
    fn a_create_wakes_the_refill_only_when_a_pass_was_put_off() {
        let p = Pools::default();
        // No pass put off: creates that end wake nothing (no pass per create).
        drop(p.creating());
        let (a, b) = (p.creating(), p.creating());
        drop(a);
        drop(b);
        assert!(!woken(&p));
        assert!(!p.put_off(), "no create under way");
        drop(p.creating());
        assert!(!woken(&p), "a pass that ran leaves no mark");

        // A pass put off by two creates: the first to end does not wake it, the last does,
        // once.
        let (a, b) = (p.creating(), p.creating());
        assert!(p.put_off());
        drop(a);
        assert!(!woken(&p));
        drop(b);
        assert!(woken(&p));
        drop(p.creating());
        assert!(!woken(&p), "the mark is spent");
    }
}
