//! The sandbox's first process: it builds the sandbox from the inside, then stays on as PID 1
//! (husk's init, the seed of the in-sandbox agent): it starts the command, reaps every zombie,
//! forwards signals to the command and reports the command's exit to the spawner. When it dies,
//! the kernel kills every other process of the sandbox's PID namespace.
//!
//! It is a fork of the spawner (the same binary image, nothing from the template is executed),
//! so it runs before `pivot_root` with the spawner's code and no dependency on the sandbox's
//! libc. Everything here runs in a single-threaded process.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::control::{self, FromInit, ToInit};
use crate::exec::{self, ExecPlan, Stdio};
use crate::fences::Fences;
use crate::host_template::HostTemplate;
use crate::rootfs::{self, RootfsPlan};
use crate::spec::SandboxSpec;
use crate::sys;

/// What the first process needs; all of it prepared by the spawner before the fork.
pub(crate) struct ChildArgs<'a> {
    pub spec: &'a SandboxSpec,
    pub template: &'a HostTemplate,
    pub staging: &'a Path,
    pub base: u32,
    pub fences: &'a Fences,
    pub control: RawFd,
    pub stdio: Option<[RawFd; 3]>,
    /// For agent sandboxes: the entry point and PID 1's end of the stream socket to the creator.
    pub agent: Option<(crate::agent::AgentEntry, RawFd)>,
    /// husk's `sudo` layer (agent sandboxes).
    pub usr_layer: Option<&'a Path>,
    /// Where the template image is mounted on the host (image templates).
    pub image: Option<&'a Path>,
    /// The user namespace with this sandbox's id mapping, for id-mapped layers.
    pub idmap: Option<RawFd>,
    /// Per mount of the spec: the user namespace of its owner mapping
    /// ([`crate::MountIds::Owner`]).
    pub mount_maps: &'a [Option<RawFd>],
    /// The spawner's argument area (the same addresses in this fork), to hide its contents.
    pub arg_area: Option<sys::ArgArea>,
    /// For a sandbox that outlives its spawner (see [`crate::keep`]): what PID 1 holds for
    /// the next one.
    pub keep: Option<KeptFds>,
}

/// The descriptors PID 1 of a kept sandbox holds for a spawner to come (by number: the
/// spawner made them before the fork, so it knows them, and records them in the registry).
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeptFds {
    /// The rendezvous' sending end: a new spawner takes a copy (`pidfd_getfd`) and sends the
    /// agent a new connection through it.
    pub send: RawFd,
    /// Its receiving end: the agent's.
    pub recv: RawFd,
    /// Where init puts its copy of the writable layer (a placeholder until then): a new
    /// spawner takes it to pause or snapshot the sandbox.
    pub layer: RawFd,
}

/// Signals PID 1 forwards to the command.
const FORWARDED: &[libc::c_int] = &[
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
];

/// Entry point of the forked first process. Never returns.
pub(crate) fn child_main(args: ChildArgs<'_>) -> ! {
    // SAFETY: the control fd was inherited from the spawner (valid at fork time) and nothing
    // else in this process owns it from here on.
    let control = unsafe { OwnedFd::from_raw_fd(args.control) };
    // A panic must end this process here: unwinding would run the spawner's code (and
    // destructors) on the copy of its stack this forked child still has.
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        match setup(&args, control.as_fd()) {
            Ok(_) if args.agent.is_some() => match control.try_clone() {
                Ok(c) => enter_agent(&args, c),
                Err(e) => fail(control.as_fd(), format!("agent control socket: {e}")),
            },
            Ok(pty) => run(&args, control.as_fd(), pty),
            Err(e) => {
                let msg = FromInit::SetupFailed(e.to_string());
                let _ = control::send_from_init(control.as_fd(), &msg);
                sys::exit_now(125)
            }
        }
    }));
    let _ = outcome;
    let _ = control::send_from_init(
        control.as_fd(),
        &FromInit::SetupFailed("husk's init panicked".into()),
    );
    sys::exit_now(125)
}

/// Builds the sandbox from the inside; returns the PTY pair when one was asked for.
fn setup(args: &ChildArgs<'_>, control: BorrowedFd<'_>) -> io::Result<Option<(OwnedFd, OwnedFd)>> {
    let ctx =
        |what: &'static str| move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
    sys::reset_signals()?;
    // Out of husk's session and process group: a Ctrl-C typed at husk's terminal reaches husk,
    // which forwards it once, not init as well.
    sys::setsid()?;
    // What the sandbox sees in /proc/1/cmdline: not husk's host command line (host paths,
    // --env values).
    if let Some(area) = args.arg_area {
        sys::overwrite_cmdline(area, "husk-init");
    }
    if args.spec.die_with_parent {
        sys::set_parent_death_signal(libc::SIGKILL)?;
    }
    if let Some(fds) = args.stdio {
        for (i, fd) in fds.iter().enumerate() {
            sys::dup2(*fd, i as RawFd)?;
        }
    }
    let agent_fd = args.agent.map_or(args.control, |(_, fd)| fd);
    let idmap_fd = args.idmap.unwrap_or(args.control);
    let kept: Vec<RawFd> = args
        .keep
        .iter()
        .flat_map(|k| [k.send, k.recv, k.layer])
        .collect();
    let mut keep = vec![args.control, agent_fd, idmap_fd];
    keep.extend(&kept);
    keep.extend(args.mount_maps.iter().flatten());
    sys::close_fds_from(3, &keep);
    {
        // SAFETY: the spawner keeps the fd open for the sandbox's lifetime; this child has its
        // own copy of the descriptor table, and the fd is closed below, after the build.
        let idmap = args.idmap.map(|fd| unsafe { BorrowedFd::borrow_raw(fd) });
        // SAFETY: the spawner holds these fds until this process is forked; this copy of the
        // descriptor table keeps them (not closed just above) until after the build.
        let mount_maps: Vec<Option<BorrowedFd<'_>>> = args
            .mount_maps
            .iter()
            .map(|fd| fd.map(|fd| unsafe { BorrowedFd::borrow_raw(fd) }))
            .collect();
        let upper = rootfs::build(&RootfsPlan {
            spec: args.spec,
            template: args.template,
            usr_layer: args.usr_layer,
            staging: args.staging,
            base: args.base,
            image: args.image,
            idmap,
            mount_maps: &mount_maps,
        })?;
        // The writable layer goes to the spawner now, while this is husk's own code, and is
        // closed here: nothing of the sandbox ever holds a descriptor of it, but PID 1 of a
        // kept sandbox, for the spawner that takes it up after this one (husk's code, which
        // never hands it on; the sandbox's commands run in Landlock domains that cannot
        // reach PID 1's descriptors).
        // Only an agent's sandbox can be paused or snapshotted: for others (`husk run`'s) the
        // spawner would hold it for nothing, one descriptor per live sandbox.
        if let Some(upper) = upper.filter(|_| args.agent.is_some()) {
            if let Some(k) = &args.keep {
                sys::dup2(upper.as_raw_fd(), k.layer)?;
            }
            control::send_from_init(control, &FromInit::Layer { upper })?;
        }
    }
    if args.idmap.is_some() || args.mount_maps.iter().any(Option::is_some) {
        // The id map is only needed for the mounts just made.
        let mut keep = vec![args.control, agent_fd];
        keep.extend(&kept);
        sys::close_fds_from(3, &keep);
    }
    if let Some(ca) = &args.spec.trust_ca {
        // In the sandbox's tree (pivoted into), with the host's privileges still (the
        // template's /etc may belong to ids the sandbox does not map), before anything of the
        // sandbox runs.
        crate::trust::add_ca_under(std::path::Path::new("/"), ca, (args.base, args.base))
            .map_err(ctx("add the sandbox's CA to its trust store"))?;
    }
    if args.spec.network.isolated() {
        // The network namespace was created by the spawner in parallel with the work above
        // (or prepared by the caller, with a link out).
        match control::recv_to_init(control)? {
            Some(ToInit::NetNs { netns }) => sys::setns(netns.as_fd(), libc::CLONE_NEWNET)
                .map_err(ctx("enter network namespace"))?,
            _ => return Err(io::Error::other("spawner sent no network namespace")),
        }
        rootfs::network()?;
    }
    // Enter the user namespace last: the mount, network, UTS and IPC namespaces stay owned by
    // the host's user namespace, so sandbox root holds no capability over them.
    //
    // Owned by the slot's root (host uid `base`, the effective uid that creates it), not by
    // host root: a user namespace's per-user counts (inotify instances and watches, user
    // namespaces, ...) are charged, at each level up, to the namespace's owner, under the
    // host's limits there. Owned by root, every sandbox's inotify instances came out of host
    // root's 128 (`fs.inotify.max_user_instances`), shared with the host's own services and
    // every other sandbox: one sandbox could take them all, and an idle agent each capped the
    // host at about a hundred sandboxes. Owned by the slot's uid, each sandbox has its own.
    // Only the effective ids change: the real and saved ones stay root, so the permitted
    // capabilities stay, and CAP_SYS_ADMIN is effective again for the unshare (LSMs such as
    // Ubuntu's AppArmor restrict user namespaces made without it).
    sys::set_effective_ids(args.base, args.base).map_err(ctx("become the slot's root"))?;
    crate::fences::raise_effective()
        .map_err(|e| io::Error::other(format!("capabilities for the user namespace: {e}")))?;
    sys::unshare(libc::CLONE_NEWUSER).map_err(ctx("user namespace"))?;
    control::send_from_init(control, &FromInit::NeedIdMap)?;
    let tasks = match control::recv_to_init(control)? {
        Some(ToInit::IdMapDone { cgroup_tasks }) => cgroup_tasks,
        _ => return Err(io::Error::other("spawner did not map ids")),
    };
    // Join the v1 hierarchies (v2 membership came with clone3), then make this the root of
    // the sandbox's cgroup namespace. Nothing of the sandbox has run yet.
    for f in tasks {
        sys::write_all(f.as_fd(), b"0").map_err(ctx("join cgroup"))?;
    }
    sys::unshare(libc::CLONE_NEWCGROUP).map_err(ctx("cgroup namespace"))?;
    sys::become_user(0, 0).map_err(ctx("become sandbox root"))?;
    let pty = if args.spec.tty {
        let (master, slave) = crate::pty::open_pair().map_err(ctx("open pty"))?;
        if let Some((rows, cols)) = args.spec.tty_size {
            crate::pty::set_window_size(master.as_fd(), rows, cols)?;
        }
        Some((master, slave))
    } else {
        None
    };
    args.fences
        .apply_to_init()
        .map_err(|e| io::Error::other(format!("fences: {e}")))?;
    Ok(pty)
}

/// Reports ready, then hands PID 1 to the agent for good.
fn enter_agent(args: &ChildArgs<'_>, control: OwnedFd) -> ! {
    let Some((entry, fd)) = args.agent else {
        sys::exit_now(125)
    };
    // SAFETY: the agent's socket end was inherited from the spawner (kept open by
    // close_fds_from above) and nothing else in this process owns it.
    let conn = unsafe { OwnedFd::from_raw_fd(fd) };
    if control::send_from_init(control.as_fd(), &FromInit::Ready { pty_master: None }).is_err() {
        sys::exit_now(1);
    }
    let (rendezvous, kept) = match args.keep {
        // SAFETY: these were inherited from the spawner (kept open by close_fds_from above)
        // and nothing else in this process owns them.
        Some(k) => unsafe {
            (
                Some(OwnedFd::from_raw_fd(k.recv)),
                vec![OwnedFd::from_raw_fd(k.send), OwnedFd::from_raw_fd(k.layer)],
            )
        },
        None => (None, Vec::new()),
    };
    entry(crate::agent::AgentContext {
        conn: Some(conn),
        rendezvous,
        _kept: kept,
        control,
        fences: args.fences,
        limits: args.spec.limits.clone(),
        hostname: args.spec.hostname.clone(),
    })
}

fn run(args: &ChildArgs<'_>, control: BorrowedFd<'_>, pty: Option<(OwnedFd, OwnedFd)>) -> ! {
    let sigfd = match sys::signalfd(&[FORWARDED, &[libc::SIGCHLD]].concat()) {
        Ok(fd) => fd,
        Err(e) => fail(control, format!("signalfd: {e}")),
    };
    let (master, slave) = match pty {
        Some((m, s)) => (Some(m), Some(s)),
        None => (None, None),
    };
    let ready = FromInit::Ready { pty_master: master };
    if control::send_from_init(control, &ready).is_err() {
        sys::exit_now(1);
    }
    drop(ready);
    let mut job = Job {
        started: false,
        pid: None,
        slave,
        deadline: None,
    };
    if args.spec.autostart {
        job.start(args, control);
    }
    loop {
        let mut fds = [
            libc::pollfd {
                fd: sigfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: control.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let timeout = match job.deadline {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    // The creator did not end the sandbox in time (stopped, stuck): end it
                    // here. From PID 1, kill(-1) reaches every other process of the namespace.
                    let _ = sys::kill(-1, libc::SIGKILL);
                    let _ = control::send_from_init(control, &FromInit::TimedOut);
                    job.deadline = None;
                    continue;
                }
                left.as_millis().min(i32::MAX as u128) as i32 + 1
            }
            None => -1,
        };
        if sys::poll(&mut fds, timeout).is_err() {
            continue;
        }
        if fds[0].revents != 0 {
            while let Ok(Some(sig)) = sys::read_signalfd(sigfd.as_fd()) {
                if sig == libc::SIGCHLD {
                    job.reap(control);
                } else {
                    job.signal(sig);
                }
            }
        }
        if fds[1].revents != 0 {
            match control::recv_to_init(control) {
                Ok(Some(ToInit::Signal(sig))) => job.signal(sig),
                Ok(Some(ToInit::Start)) => job.start(args, control),
                Ok(Some(ToInit::IdMapDone { .. } | ToInit::NetNs { .. })) => {}
                // The spawner is gone: the sandbox ends with its init.
                Ok(None) | Err(_) => sys::exit_now(0),
            }
        }
    }
}

/// The one command init runs, and what supervising it takes.
struct Job {
    started: bool,
    /// Its pid while it runs.
    pid: Option<libc::pid_t>,
    /// The PTY's slave end, until the command has it.
    slave: Option<OwnedFd>,
    /// PID 1's backstop for the timeout: a little after the creator's, which normally acts.
    deadline: Option<Instant>,
}

impl Job {
    /// Starts the command unless it was started already (or there is none).
    fn start(&mut self, args: &ChildArgs<'_>, control: BorrowedFd<'_>) {
        let (Some(argv), false) = (&args.spec.command, self.started) else {
            return;
        };
        self.started = true;
        self.deadline = args
            .spec
            .timeout
            .map(|t| Instant::now() + t + Duration::from_millis(500));
        match spawn_command(args, argv, self.slave.as_ref().map(|s| s.as_fd())) {
            Ok(pid) => self.pid = Some(pid),
            Err(errno) => {
                let _ = control::send_from_init(control, &FromInit::ExecFailed { errno });
            }
        }
        // Only the command holds the terminal's slave end.
        self.slave = None;
    }

    /// Forwards `sig` to the command while it runs.
    fn signal(&self, sig: libc::c_int) {
        if let Some(pid) = self.pid {
            let _ = sys::kill(pid, sig);
        }
    }

    /// Reaps every exited child; reports the command's exit (which ends the backstop).
    fn reap(&mut self, control: BorrowedFd<'_>) {
        while let Ok(Some((pid, status))) = sys::waitpid(-1, libc::WNOHANG) {
            if Some(pid) == self.pid {
                self.pid = None;
                self.deadline = None;
                let _ = control::send_from_init(control, &FromInit::Exited(status));
            }
        }
    }
}

fn fail(control: BorrowedFd<'_>, msg: String) -> ! {
    let _ = control::send_from_init(control, &FromInit::SetupFailed(msg));
    sys::exit_now(125)
}

/// The command's environment: defaults for a login, then the spec's variables.
fn command_env(spec: &SandboxSpec) -> Vec<(String, String)> {
    let user = spec.user;
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), crate::exec::DEFAULT_PATH.into()),
        ("HOME".into(), user.home().into()),
        ("USER".into(), user.name().into()),
        ("LOGNAME".into(), user.name().into()),
        ("SHELL".into(), "/bin/bash".into()),
        ("HOSTNAME".into(), spec.hostname.clone()),
        ("LANG".into(), "C.UTF-8".into()),
    ];
    if spec.tty {
        env.push(("TERM".into(), "xterm-256color".into()));
    }
    for (k, v) in &spec.env {
        env.retain(|(ek, _)| ek != k);
        env.push((k.clone(), v.clone()));
    }
    env
}

/// Forks the command; returns its pid, or the errno that kept it from executing.
fn spawn_command(
    args: &ChildArgs<'_>,
    argv: &[String],
    tty: Option<BorrowedFd<'_>>,
) -> Result<libc::pid_t, i32> {
    let errno = |e: io::Error| e.raw_os_error().unwrap_or(libc::EIO);
    let spec = args.spec;
    let workdir = spec
        .workdir
        .as_ref()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|| spec.user.home().into());
    let plan = ExecPlan::new(argv, &command_env(spec), &workdir, spec.user, &spec.limits)
        .map_err(errno)?;
    let stdio = match tty {
        Some(t) => Stdio::Tty(t.as_raw_fd()),
        None => Stdio::Inherit,
    };
    exec::spawn(args.fences, &plan, stdio).map_err(errno)
}
