//! A real, private PostgreSQL server for unit tests.
//!
//! [`TestPostgres::start`] makes a fresh temporary directory (`husk-pg-test-<pid>-<n>-<nanos>`
//! under [`std::env::temp_dir`]), runs `initdb` into `<dir>/data` with a trust-authenticated
//! superuser `husk`, and starts `postgres` on a free loopback port (never a fixed one: other
//! workloads listen on this machine's loopback) with its socket and log (`<dir>/log`) in the
//! same directory. [`TestPostgres::shared`] is one such server for the whole test process;
//! [`TestPostgres::fresh_database`] gives each test its own empty database on it.
//!
//! **Binaries**: `$HUSK_TEST_PG_BIN` if set, else the highest-versioned
//! `/usr/lib/postgresql/*/bin` with `initdb` (Debian's layout), else `PATH`.
//!
//! **Running as root.** PostgreSQL refuses to run as root, so when the tests are root (as
//! `scripts/test` runs them) `initdb` and `postgres` run as the `postgres` user: std's
//! `Command::uid`/`gid`, which also clears the supplementary groups when root sets a uid. The
//! client tools (`psql`, `pg_isready`) run as the test process. No `unsafe` here: husk-core
//! forbids it, so the user is looked up with `getent` and signals go through
//! `husk_runtime::sys::kill`.
//!
//! **Cleanup**, in three layers, so that after `cargo test` exits no server is left running and,
//! at the latest after the next run, no directory either:
//! - [`Drop`] (also while a failing test unwinds) stops the server (SIGINT, the fast shutdown;
//!   SIGKILL after 10 s) and removes the directory.
//! - Every server has `PR_SET_PDEATHSIG` = SIGQUIT (PostgreSQL's immediate shutdown), so it
//!   dies with the test process however that ends, even by SIGKILL. It is set by
//!   `setpriv --pdeathsig` (util-linux), as `pre_exec` would need `unsafe`, and is kept by the
//!   `exec`s that follow (only set-uid binaries or file capabilities clear it). The order
//!   matters: the kernel clears the death signal when credentials change, so the switch to the
//!   `postgres` user happens before, in std (`Command::uid`/`gid` before exec of `setpriv`),
//!   never after. A `sh` between `setpriv` and `postgres` closes the race of a test process
//!   dying before the `prctl`: it checks that its parent is still the test process (else no
//!   signal will ever come) and only then `exec`s the server. And as the signal fires when the
//!   *thread* that forked the child exits, while libtest runs each test on a thread of its own,
//!   every server is forked by one spawner thread that lives as long as the process.
//! - The shared server is a static, never dropped: when the test process exits, the death
//!   signal stops it, but its directory stays behind. The first [`TestPostgres::start`] of the
//!   next test process removes every `husk-pg-test-<pid>-*` directory whose `<pid>` and whose
//!   postmaster are no longer alive (the same sweep cleans up after killed runs).

use std::fs::{self, DirBuilder, OpenOptions};
use std::io;
#[cfg(test)]
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Mutex, Once, OnceLock, PoisonError};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use husk_runtime::{libc, sys};

/// The superuser `initdb -U` creates; trust authentication, so URLs carry no password.
const SUPERUSER: &str = "husk";
/// Prefix of the servers' temporary directories, also what the stale-directory sweep matches.
const DIR_PREFIX: &str = "husk-pg-test-";
/// How long a starting server may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a fast shutdown may take before the server is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Interval of every poll here (readiness, shutdown, process death).
const POLL: Duration = Duration::from_millis(20);
/// Fresh ports tried when another process binds the picked one before `postgres` does.
const PORT_ATTEMPTS: u32 = 5;

/// A private PostgreSQL server in a temporary directory, stopped and removed on drop.
pub struct TestPostgres {
    /// The directory with `initdb`, `postgres`, `psql` and `pg_isready`.
    bin: PathBuf,
    /// util-linux's `setpriv`, which sets the servers' death signal.
    setpriv: PathBuf,
    /// The temporary directory: `data/` (the cluster), `log`, and the server's socket.
    dir: PathBuf,
    /// The loopback TCP port; kept across [`TestPostgres::restart`].
    port: u16,
    /// The uid and gid the server runs as (`postgres`'s when the tests are root), or `None` to
    /// run it as the test process.
    owner: Option<(libc::uid_t, libc::gid_t)>,
    /// The running postmaster; `None` while stopped.
    server: Mutex<Option<Child>>,
}

impl TestPostgres {
    /// Starts a new private server; panics (with PostgreSQL's own output) if it cannot.
    pub fn start() -> TestPostgres {
        static SWEEP: Once = Once::new();
        SWEEP.call_once(remove_stale_dirs);

        let bin = find_bin_dir();
        let setpriv = find_setpriv();
        let owner = server_owner();
        let dir = make_dir(owner);
        // Built before anything else can fail, so that its Drop removes the directory when a
        // step below panics.
        let mut pg = TestPostgres {
            bin,
            setpriv,
            dir,
            port: 0,
            owner,
            server: Mutex::new(None),
        };
        pg.initdb();
        for attempt in 1..=PORT_ATTEMPTS {
            pg.port = free_port();
            match pg.launch() {
                Ok(child) => {
                    *pg.server.get_mut().unwrap_or_else(PoisonError::into_inner) = Some(child);
                    return pg;
                }
                // Another process bound the port between our probe and postgres's bind.
                Err(e) if e.port_taken && attempt < PORT_ATTEMPTS => continue,
                Err(e) => panic!("test PostgreSQL: {}", e.message),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// The server of the whole test process, started on first use. Tests sharing it should
    /// each take a [`TestPostgres::fresh_database`].
    pub fn shared() -> &'static TestPostgres {
        static SHARED: OnceLock<TestPostgres> = OnceLock::new();
        SHARED.get_or_init(TestPostgres::start)
    }

    /// `postgres://husk@127.0.0.1:<port>/<database>`.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://{SUPERUSER}@127.0.0.1:{}/{database}", self.port)
    }

    /// Creates a new empty database (`t_<n>_<pid>`) and returns its URL. Safe to call from
    /// many threads at once.
    pub fn fresh_database(&self) -> String {
        static N: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "t_{}_{}",
            N.fetch_add(1, Ordering::Relaxed),
            std::process::id()
        );
        // template0, not the default template1: copying a template fails while anyone else is
        // connected to it ("source database is being accessed by other users"), which
        // concurrent tests would be; nobody can connect to template0.
        self.psql(
            &self.url("postgres"),
            &format!("CREATE DATABASE {name} TEMPLATE template0"),
        );
        self.url(&name)
    }

    /// Runs `sql` with `psql` against `url` and returns its unaligned, tuples-only output
    /// without the final newline; panics with psql's errors if a statement fails.
    pub fn psql(&self, url: &str, sql: &str) -> String {
        let output = client_command(&self.bin.join("psql"))
            // -X: no ~/.psqlrc; -q: no command tags; -tA: bare values.
            .args([
                "-X",
                "-q",
                "-tA",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                url,
                "-c",
                sql,
            ])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("test PostgreSQL: cannot run psql: {e}"));
        if !output.status.success() {
            panic!(
                "test PostgreSQL: psql {sql:?} on {url} failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim_end()
            );
        }
        let mut out = String::from_utf8_lossy(&output.stdout).into_owned();
        if out.ends_with('\n') {
            out.pop();
        }
        out
    }

    /// Turns TLS on with this certificate and key (PEM): written beside the data directory,
    /// owned by the server's user (PostgreSQL refuses a key others can read), set with
    /// `ALTER SYSTEM` and a reload, which is all `ssl` needs.
    pub fn enable_tls(&self, cert_pem: &str, key_pem: &str) {
        use std::os::unix::fs::PermissionsExt;
        for (name, pem, mode) in [
            ("server.crt", cert_pem, 0o644),
            ("server.key", key_pem, 0o600),
        ] {
            let path = self.dir.join(name);
            std::fs::write(&path, pem).unwrap_or_else(|e| panic!("write {path:?}: {e}"));
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .unwrap_or_else(|e| panic!("chmod {path:?}: {e}"));
            if let Some((uid, gid)) = self.owner {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid))
                    .unwrap_or_else(|e| panic!("chown {path:?}: {e}"));
            }
        }
        let url = self.url("postgres");
        for sql in [
            format!(
                "ALTER SYSTEM SET ssl_cert_file = '{}'",
                self.dir.join("server.crt").display()
            ),
            format!(
                "ALTER SYSTEM SET ssl_key_file = '{}'",
                self.dir.join("server.key").display()
            ),
            "ALTER SYSTEM SET ssl = on".to_owned(),
            "SELECT pg_reload_conf()".to_owned(),
        ] {
            self.psql(&url, &sql);
        }
        // The reload is asynchronous: wait until new sessions see it.
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.psql(&url, "SHOW ssl") != "on" {
            assert!(
                Instant::now() < deadline,
                "test PostgreSQL: ssl not on after a reload"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the server with a fast shutdown (SIGINT; open sessions are ended) and waits for
    /// it. Does nothing if it is stopped; panics if it had to be killed.
    pub fn stop(&self) {
        let mut server = self.server.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(mut child) = server.take() {
            if !shut_down(&mut child) {
                panic!("test PostgreSQL: no fast shutdown within {STOP_TIMEOUT:?}; killed it");
            }
        }
    }

    /// Starts the server again on the same port and data directory (stopping it first if it
    /// runs), for "database restarted mid-test" tests.
    pub fn restart(&self) {
        let mut server = self.server.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(mut child) = server.take() {
            if !shut_down(&mut child) {
                panic!("test PostgreSQL: no fast shutdown within {STOP_TIMEOUT:?}; killed it");
            }
        }
        match self.launch() {
            Ok(child) => *server = Some(child),
            Err(e) if e.port_taken => panic!(
                "test PostgreSQL: port {} was taken while the server was stopped: {}",
                self.port, e.message
            ),
            Err(e) => panic!("test PostgreSQL: restart failed: {}", e.message),
        }
    }

    /// The postmaster's pid while the server runs.
    #[cfg(test)]
    fn pid(&self) -> Option<u32> {
        self.server
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(Child::id)
    }

    /// The temporary directory.
    #[cfg(test)]
    fn dir(&self) -> &Path {
        &self.dir
    }

    /// `initdb` into `<dir>/data`.
    fn initdb(&self) {
        let mut cmd = self.server_command("initdb", Some("SIGKILL"));
        cmd.arg("-D").arg(self.dir.join("data"));
        // C locale: the host's locale may not be installed (initdb would refuse it), and the
        // server's messages (matched below) stay English.
        cmd.args([
            "-U",
            SUPERUSER,
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ]);
        let help = self.server_command("initdb", None).arg("--help").output();
        if help.is_ok_and(|h| String::from_utf8_lossy(&h.stdout).contains("--no-instructions")) {
            cmd.arg("--no-instructions");
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let output = spawn_from_lasting_thread(cmd)
            .and_then(Child::wait_with_output)
            .unwrap_or_else(|e| panic!("test PostgreSQL: cannot run initdb: {e}"));
        if !output.status.success() {
            panic!(
                "test PostgreSQL: initdb in {:?} failed ({}):\n{}{}",
                self.dir,
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }

    /// Starts `postgres` on `self.port` and waits until it accepts connections.
    fn launch(&self) -> Result<Child, LaunchError> {
        let log_path = self.dir.join("log");
        let fail = |message: String| LaunchError {
            port_taken: false,
            message,
        };
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| fail(format!("cannot open {log_path:?}: {e}")))?;
        // Only this attempt's lines count for the diagnosis and the panic message.
        let log_start = log.metadata().map_or(0, |m| m.len());
        let port = self.port.to_string();
        let mut cmd = self.server_command("postgres", Some("SIGQUIT"));
        cmd.arg("-D").arg(self.dir.join("data"));
        cmd.args(["-h", "127.0.0.1", "-p", &port, "-k"])
            .arg(&self.dir);
        // Durability is worthless for a test cluster; speed is not.
        for setting in [
            "fsync=off",
            "synchronous_commit=off",
            "full_page_writes=off",
            "max_connections=200",
            "listen_addresses=127.0.0.1",
        ] {
            cmd.args(["-c", setting]);
        }
        let log_err = log
            .try_clone()
            .map_err(|e| fail(format!("cannot dup the log: {e}")))?;
        cmd.stdin(Stdio::null()).stdout(log).stderr(log_err);
        let mut child = spawn_from_lasting_thread(cmd)
            .map_err(|e| fail(format!("cannot run postgres from {:?}: {e}", self.bin)))?;

        let log_tail = || {
            let log = fs::read(&log_path).unwrap_or_default();
            let from = usize::try_from(log_start).unwrap_or(0).min(log.len());
            String::from_utf8_lossy(&log[from..]).into_owned()
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    let log = log_tail();
                    return Err(LaunchError {
                        port_taken: log.contains("Address already in use"),
                        message: format!(
                            "postgres on port {port} exited at start ({status}); {log_path:?}:\n{}",
                            last_lines(&log, 30)
                        ),
                    });
                }
                Ok(None) => {}
                Err(e) => return Err(fail(format!("cannot wait for postgres: {e}"))),
            }
            if self.is_ready(child.id()) {
                return Ok(child);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(fail(format!(
                    "postgres on port {port} not ready within {READY_TIMEOUT:?}; {log_path:?}:\n{}",
                    last_lines(&log_tail(), 30)
                )));
            }
            thread::sleep(POLL);
        }
    }

    /// Whether the postmaster `pid` has finished starting and answers on our port.
    fn is_ready(&self, pid: u32) -> bool {
        // The postmaster's own word first (what pg_ctl waits for): line 1 of postmaster.pid
        // is its pid, line 8 its status. A bare connect or pg_isready could be answered by
        // another process that took the port, while ours is about to fail to bind.
        let Ok(lock) = fs::read_to_string(self.dir.join("data/postmaster.pid")) else {
            return false;
        };
        let lines: Vec<&str> = lock.lines().collect();
        if lines.first().map(|l| l.trim()) != Some(pid.to_string().as_str())
            || lines.get(7).is_some_and(|status| status.trim() != "ready")
        {
            return false;
        }
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        if TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err() {
            return false;
        }
        client_command(&self.bin.join("pg_isready"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                SUPERUSER,
            ])
            .args(["-d", "postgres", "-t", "5"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// A command for a server program (`initdb`, `postgres`): run as [`Self::owner`], in the
    /// server's directory (the test's working directory may be closed to the `postgres` user),
    /// and with `death_signal` (a signal name), when given, as its parent-death signal.
    fn server_command(&self, program: &str, death_signal: Option<&str>) -> Command {
        let program = self.bin.join(program);
        let mut cmd = match death_signal {
            None => client_command(&program),
            Some(signal) => {
                // setpriv sets the signal, then sh execs the program only if the test process
                // is still its parent: had it died before the prctl, no signal would come.
                let mut cmd = client_command(&self.setpriv);
                cmd.args(["--pdeathsig", signal, "/bin/sh", "-c"])
                    .arg(r#"[ "$PPID" = "$1" ] || exit 125; shift; exec "$@""#)
                    .arg("sh")
                    .arg(std::process::id().to_string())
                    .arg(program);
                cmd
            }
        };
        // Before the exec of setpriv, so that the credential change (which clears a death
        // signal) comes before the prctl.
        if let Some((uid, gid)) = self.owner {
            cmd.uid(uid).gid(gid);
        }
        cmd.current_dir(&self.dir).env("HOME", &self.dir);
        cmd
    }
}

impl Drop for TestPostgres {
    fn drop(&mut self) {
        if let Some(mut child) = self
            .server
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            shut_down(&mut child);
        }
        // Errors ignored: this may run while a test unwinds, where a panic would abort.
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Why [`TestPostgres::launch`] failed.
struct LaunchError {
    /// The server could not bind its port: worth another try on a fresh one.
    port_taken: bool,
    message: String,
}

/// SIGINT (fast shutdown), wait up to [`STOP_TIMEOUT`], then SIGKILL. Whether the server
/// stopped by itself.
fn shut_down(child: &mut Child) -> bool {
    if let Ok(Some(_)) = child.try_wait() {
        return true;
    }
    // `child` is not waited for yet, so its pid cannot have been reused.
    let pid = libc::pid_t::try_from(child.id()).expect("pid fits pid_t");
    let _ = sys::kill(pid, libc::SIGINT);
    let deadline = Instant::now() + STOP_TIMEOUT;
    while Instant::now() < deadline {
        match child.try_wait() {
            Ok(Some(_)) => return true,
            Ok(None) => thread::sleep(POLL),
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    false
}

/// Spawns `cmd` from a thread that lives as long as the process.
///
/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, and libtest runs each
/// test on a thread of its own: forked there, a server would die with its test's thread (or the
/// shared server with the first test that used it). Forked here, it dies with the process.
fn spawn_from_lasting_thread(cmd: Command) -> io::Result<Child> {
    type Request = (Command, mpsc::Sender<io::Result<Child>>);
    static SPAWNER: OnceLock<mpsc::Sender<Request>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (requests, incoming) = mpsc::channel::<Request>();
        thread::Builder::new()
            .name("test-postgres-spawner".into())
            .spawn(move || {
                // The static keeps a sender, so this loop never ends and the thread lives as
                // long as the process.
                for (mut cmd, reply) in incoming {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("spawn the test PostgreSQL spawner thread");
        requests
    });
    let (reply, result) = mpsc::channel();
    spawner
        .send((cmd, reply))
        .expect("the spawner thread lives as long as the process");
    result
        .recv()
        .expect("the spawner thread answers every request")
}

/// A command with no `PG*` variables of the caller's environment (`PGHOST`, `PGOPTIONS`, …
/// would redirect or change connections) and messages in English.
fn client_command(program: &Path) -> Command {
    let mut cmd = Command::new(program);
    for (key, _) in std::env::vars_os() {
        if key.as_encoded_bytes().starts_with(b"PG") {
            cmd.env_remove(key);
        }
    }
    cmd.env("LC_ALL", "C");
    cmd
}

/// `$HUSK_TEST_PG_BIN`, else the highest-versioned `/usr/lib/postgresql/*/bin` with `initdb`,
/// else the first `PATH` directory with `initdb` and `postgres`.
fn find_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("HUSK_TEST_PG_BIN") {
        let dir = PathBuf::from(dir);
        assert!(
            dir.join("initdb").is_file() && dir.join("postgres").is_file(),
            "test PostgreSQL: HUSK_TEST_PG_BIN={dir:?} has no initdb and postgres"
        );
        return dir;
    }
    let mut best: Option<(Vec<u64>, PathBuf)> = None;
    for entry in fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
    {
        let Some(version) = entry.file_name().to_str().and_then(|v| {
            v.split('.')
                .map(|n| n.parse().ok())
                .collect::<Option<Vec<u64>>>()
        }) else {
            continue;
        };
        let bin = entry.path().join("bin");
        if bin.join("initdb").is_file() && best.as_ref().is_none_or(|(b, _)| version > *b) {
            best = Some((version, bin));
        }
    }
    if let Some((_, bin)) = best {
        return bin;
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .find(|dir| dir.join("initdb").is_file() && dir.join("postgres").is_file())
        .unwrap_or_else(|| {
            panic!(
                "test PostgreSQL: no initdb found (HUSK_TEST_PG_BIN, /usr/lib/postgresql/*/bin, \
                 PATH); install Debian's `postgresql` package (scripts/test does)"
            )
        })
}

/// The uid and gid of `postgres` when the tests are root (PostgreSQL refuses root), else
/// `None`: the server runs as the test process.
fn server_owner() -> Option<(libc::uid_t, libc::gid_t)> {
    // The effective uid, the second figure of `Uid:`.
    let status = fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .expect("/proc/self/status has a Uid line");
    if euid != "0" {
        return None;
    }
    // getent, not /etc/passwd: the user may come from NSS.
    let entry = Command::new("getent")
        .args(["passwd", "postgres"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .unwrap_or_default();
    // name:password:uid:gid:gecos:home:shell
    let mut fields = entry.trim_end().split(':').skip(2);
    match (
        fields.next().and_then(|uid| uid.parse().ok()),
        fields.next().and_then(|gid| gid.parse().ok()),
    ) {
        (Some(uid), Some(gid)) => Some((uid, gid)),
        _ => panic!(
            "test PostgreSQL: PostgreSQL refuses to run as root and there is no `postgres` user \
             to run it as (`getent passwd postgres`: {entry:?}); install Debian's `postgresql` \
             package, which creates it"
        ),
    }
}

/// util-linux's `setpriv` (Debian: always installed): `/usr/bin/setpriv`, else from `PATH`.
fn find_setpriv() -> PathBuf {
    let usual = PathBuf::from("/usr/bin/setpriv");
    if usual.is_file() {
        return usual;
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("setpriv"))
        .find(|path| path.is_file())
        .unwrap_or_else(|| {
            panic!("test PostgreSQL: no setpriv (util-linux) to give the server a death signal")
        })
}

/// Creates the server's directory, private (0700) and owned by the server's user.
fn make_dir(owner: Option<(libc::uid_t, libc::gid_t)>) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!(
        "{DIR_PREFIX}{}-{}-{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    // create, not create_all: a name clash must fail rather than share a directory.
    DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .unwrap_or_else(|e| panic!("test PostgreSQL: cannot create {dir:?}: {e}"));
    if let Some((uid, gid)) = owner {
        if let Err(e) = std::os::unix::fs::chown(&dir, Some(uid), Some(gid)) {
            let _ = fs::remove_dir(&dir);
            panic!("test PostgreSQL: cannot give {dir:?} to the postgres user: {e}");
        }
    }
    dir
}

/// A loopback port nobody listens on right now (the kernel's pick). It may be taken again
/// before postgres binds it; [`TestPostgres::start`] then tries another.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .unwrap_or_else(|e| panic!("test PostgreSQL: cannot pick a loopback port: {e}"))
}

/// Removes the directories that killed test processes left behind: `husk-pg-test-<pid>-*` in
/// the temp dir whose `<pid>` is dead and whose postmaster (if any) has exited too.
fn remove_stale_dirs() {
    let Ok(entries) = fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(DIR_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || process_alive(pid) {
            continue;
        }
        // The postmaster gets SIGQUIT when its test process dies; it may still be finishing.
        let lock = fs::read_to_string(entry.path().join("data/postmaster.pid")).unwrap_or_default();
        if lock
            .lines()
            .next()
            .and_then(|l| l.trim().parse().ok())
            .is_some_and(process_alive)
        {
            continue;
        }
        // Errors ignored: another user's directory, or another process sweeping at once.
        let _ = fs::remove_dir_all(entry.path());
    }
}

/// Whether process `pid` exists and is not a zombie (in a container whose init does not reap,
/// a dead orphan stays a zombie).
fn process_alive(pid: u32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the parenthesised command name, which may itself contain ") ".
    let state = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next());
    !matches!(state, Some('Z' | 'X') | None)
}

/// The last `n` lines of `text`.
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls until process `pid` is gone; whether it went within `timeout`.
    fn wait_gone(pid: u32, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while process_alive(pid) {
            if Instant::now() >= deadline {
                return false;
            }
            thread::sleep(POLL);
        }
        true
    }

    #[test]
    fn fresh_database_accepts_connections_and_queries() {
        let pg = TestPostgres::start();
        let url = pg.fresh_database();
        assert!(url.starts_with("postgres://husk@127.0.0.1:"), "{url}");
        assert_eq!(pg.psql(&url, "select 1"), "1");
        let name = url.rsplit('/').next().unwrap();
        assert_eq!(pg.psql(&url, "select current_database()"), name);
    }

    #[test]
    fn fresh_databases_differ() {
        let pg = TestPostgres::shared();
        let (a, b) = (pg.fresh_database(), pg.fresh_database());
        assert_ne!(a, b);
        // Really two databases: a table made in one is not in the other.
        pg.psql(&a, "create table only_in_a (x int)");
        assert_eq!(
            pg.psql(
                &a,
                "select count(*) from pg_tables where tablename = 'only_in_a'"
            ),
            "1"
        );
        assert_eq!(
            pg.psql(
                &b,
                "select count(*) from pg_tables where tablename = 'only_in_a'"
            ),
            "0"
        );
    }

    #[test]
    fn fresh_database_from_many_threads_at_once() {
        let pg = TestPostgres::shared();
        let urls: Vec<String> = thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        let url = pg.fresh_database();
                        assert_eq!(pg.psql(&url, "select 1"), "1");
                        url
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut unique = urls.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), urls.len(), "{urls:?}");
    }

    #[test]
    fn drop_stops_the_server_and_removes_its_directory() {
        let pg = TestPostgres::start();
        let pid = pg.pid().expect("running");
        let dir = pg.dir().to_path_buf();
        assert!(dir.join("data/PG_VERSION").is_file());
        drop(pg);
        assert!(
            wait_gone(pid, Duration::from_secs(5)),
            "postmaster {pid} still runs"
        );
        // Signal 0: only whether the pid exists (a zombie would still).
        let probe = sys::kill(libc::pid_t::try_from(pid).unwrap(), 0);
        assert_eq!(
            probe.map_err(|e| e.raw_os_error()),
            Err(Some(libc::ESRCH)),
            "postmaster {pid} was reaped"
        );
        assert!(!dir.exists(), "{dir:?} is left behind");
    }

    #[test]
    fn restart_keeps_data_and_port() {
        let pg = TestPostgres::start();
        let url = pg.fresh_database();
        pg.psql(
            &url,
            "create table kept (x int); insert into kept values (42)",
        );
        let old_pid = pg.pid().expect("running");
        pg.stop();
        assert_eq!(pg.pid(), None);
        assert!(!process_alive(old_pid));
        pg.restart();
        assert_ne!(pg.pid(), Some(old_pid));
        assert_eq!(pg.psql(&url, "select x from kept"), "42");
        // restart() of a running server stops it first.
        pg.restart();
        assert_eq!(pg.psql(&url, "select x from kept"), "42");
    }

    /// A child process killed and reaped when the test ends, failing or not.
    struct KilledOnDrop(Child);

    impl Drop for KilledOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// Set in the child test process of [`server_dies_with_a_killed_test_process`].
    const HELPER_ENV: &str = "HUSK_TEST_PG_DEATH_HELPER";

    /// Not a test of its own: the child process of
    /// [`server_dies_with_a_killed_test_process`], a no-op otherwise. Starts the shared server,
    /// reports its postmaster and directory, and waits to be killed. Ignored, so that a normal
    /// run neither runs nor counts it; its parent runs it with `--ignored`.
    #[test]
    #[ignore = "the child process of server_dies_with_a_killed_test_process"]
    fn death_helper() {
        if std::env::var_os(HELPER_ENV).is_none() {
            return;
        }
        let pg = TestPostgres::shared();
        println!(
            "helper-ready {} {}",
            pg.pid().expect("running"),
            pg.dir().display()
        );
        // Bounded, should the parent die without killing us.
        thread::sleep(Duration::from_secs(120));
    }

    #[test]
    fn server_dies_with_a_killed_test_process() {
        if std::env::var_os(HELPER_ENV).is_some() {
            return;
        }
        let module = module_path!().split_once("::").expect("crate::path").1;
        let mut helper = KilledOnDrop(
            Command::new(std::env::current_exe().unwrap())
                .args([
                    &format!("{module}::death_helper"),
                    "--exact",
                    "--ignored",
                    "--nocapture",
                ])
                .env(HELPER_ENV, "1")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let stdout = BufReader::new(helper.0.stdout.take().unwrap());
        let line = stdout
            .lines()
            .map(Result::unwrap)
            .find(|l| l.starts_with("helper-ready "))
            .expect("the helper reports its server");
        let mut words = line.split(' ').skip(1);
        let pid: u32 = words.next().unwrap().parse().unwrap();
        let dir = PathBuf::from(words.next().unwrap());
        assert!(process_alive(pid));

        // SIGKILL: no Drop, no atexit; only the death signal can stop the server.
        helper.0.kill().unwrap();
        helper.0.wait().unwrap();
        assert!(
            wait_gone(pid, Duration::from_secs(10)),
            "postmaster {pid} outlived its test"
        );

        // What the next test process's first start() does with the directory left behind (not
        // asserted to exist first: this process's own first start() may be sweeping right now).
        remove_stale_dirs();
        assert!(!dir.exists(), "{dir:?} survived the sweep");
    }
}
