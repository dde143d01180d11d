//! What a sandbox can see of the host and of other sandboxes: nothing.

mod common;
use common::*;

use std::fs;
use std::net::TcpListener;
use std::time::Duration;

#[test]
fn pid1_and_hostname_are_the_sandboxs() {
    let r = husk_run(
        &["--hostname", "box-one"],
        &[
            "/bin/sh",
            "-c",
            "echo pid=$$; cat /proc/1/comm; hostname; cat /etc/hostname",
        ],
    );
    r.ok();
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(
        lines,
        ["pid=2", "husk", "box-one", "box-one"],
        "{}",
        r.stdout
    );
}

#[test]
fn host_files_are_invisible() {
    let name = format!("husk-marker-{:x}", rand());
    let root_marker = std::path::Path::new("/root").join(&name);
    let tmp_marker = std::path::Path::new("/tmp").join(&name);
    fs::write(&root_marker, "secret").unwrap();
    fs::write(&tmp_marker, "secret").unwrap();
    let script = format!(
        "for p in /root/{name} /tmp/{name} /etc/shadow /etc/ssh /var/lib /var/log /run/husk /sys/kernel; do \
           if [ -e \"$p\" ]; then echo VISIBLE $p; fi; done; ls -A /home; ls -A /var; echo end"
    );
    for user in ["user", "root"] {
        let r = husk_run(&["--user", user], &["/bin/sh", "-c", &script]);
        r.ok();
        assert!(!r.stdout.contains("VISIBLE"), "as {user}: {}", r.stdout);
        let lines: Vec<&str> = r.stdout.lines().collect();
        assert_eq!(lines, ["user", "tmp", "end"], "as {user}: {}", r.stdout);
    }
    fs::remove_file(&root_marker).unwrap();
    fs::remove_file(&tmp_marker).unwrap();
}

#[test]
fn host_processes_are_invisible() {
    let me = std::process::id();
    let r = husk_run(
        &[],
        &[
            "/bin/sh",
            "-c",
            "ls /proc | grep -E '^[0-9]+$' | tr '\\n' ' '; echo; cat /proc/timer_list | wc -c",
        ],
    );
    r.ok();
    let mut lines = r.stdout.lines();
    let pids: Vec<u32> = lines
        .next()
        .unwrap()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    // init (1), sh (2) and the pipeline's children; never the host's pids.
    assert!(pids.iter().all(|&p| p < 10), "pids {pids:?}");
    assert!(!pids.contains(&me) || me < 10);
    assert_eq!(
        lines.next(),
        Some("0"),
        "/proc/timer_list leaks host timers"
    );
}

#[test]
fn host_loopback_server_is_unreachable() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let code = format!(
        "import socket,errno\n\
         s=socket.socket(); s.settimeout(3)\n\
         try:\n  s.connect(('127.0.0.1',{port})); print('CONNECTED')\n\
         except OSError as e: print(errno.errorcode.get(e.errno, e))\n"
    );
    let r = husk_run(&[], &strs(&py(&code)));
    r.ok();
    assert_eq!(r.stdout.trim(), "ECONNREFUSED", "{}", r.stderr);
    assert!(
        listener.accept().is_err(),
        "the host listener got a connection"
    );
    // The sandbox's loopback itself works.
    let r = husk_run(
        &[],
        &strs(&py(
            "import socket\nl=socket.socket(); l.bind(('127.0.0.1',0)); l.listen(1)\n\
                  c=socket.create_connection(l.getsockname()); print('ok')",
        )),
    );
    assert_eq!(r.ok().stdout.trim(), "ok");
}

#[test]
fn concurrent_sandboxes_cannot_see_or_signal_each_other() {
    let dir = TempDir::new("pair");
    let (mut a, id_a) = husk_spawn(&["--user", "root"], &["/bin/sleep", "30"], &dir);
    let a_pids = wait_for(Duration::from_secs(5), || {
        let p = sandbox_pids(&id_a);
        (p.len() >= 2).then_some(p)
    })
    .expect("sandbox A's processes not found");
    // B, as its root, tries to kill everything it can and lists what it sees.
    let r = husk_run(
        &["--user", "root"],
        &["/bin/sh", "-c", "kill -9 -1 2>/dev/null; ls /proc | grep -cE '^[0-9]+$'; cat /proc/[0-9]*/cmdline | tr '\\0' ' '"],
    );
    assert!(!r.stdout.contains("sleep 30"), "B sees A: {}", r.stdout);
    // A survived B's kill -1.
    assert!(a.try_wait().unwrap().is_none(), "sandbox A died");
    let still = sandbox_pids(&id_a);
    assert_eq!(
        still.len(),
        a_pids.len(),
        "A's processes changed: {a_pids:?} -> {still:?}"
    );
    // Different host uid ranges.
    assert_ne!(slot_of(&id_a), slot_of(&r.id));
    let base_a = husk_runtime::uidrange::base_of(slot_of(&id_a));
    assert!(a_pids
        .iter()
        .all(|(_, uid)| (base_a..base_a + 65536).contains(uid)));
    a.kill().unwrap();
    a.wait().unwrap();
    wait_for(Duration::from_secs(5), || {
        sandbox_pids(&id_a).is_empty().then_some(())
    })
    .expect("A's processes outlived husk");
}

#[test]
fn sandbox_user_maps_to_an_unprivileged_host_uid() {
    let dir = TempDir::new("uid");
    let (mut child, id) = husk_spawn(
        &[],
        &[
            "/bin/sh",
            "-c",
            "id -u; id -g; cat /proc/self/uid_map; exec sleep 30",
        ],
        &dir,
    );
    let pids = wait_for(Duration::from_secs(5), || {
        sandbox_runs(&id, "sleep").then(|| sandbox_pids(&id))
    })
    .expect("no sandbox process found");
    let base = husk_runtime::uidrange::base_of(slot_of(&id));
    assert!(base >= 0x4000_0000);
    assert!(pids.iter().any(|(_, uid)| *uid == base + 1000), "{pids:?}");
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "1000");
    assert_eq!(lines[1], "1000");
    let map: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(map, ["0", &base.to_string(), "65536"]);
    wait_for(Duration::from_secs(5), || {
        sandbox_pids(&id).is_empty().then_some(())
    })
    .expect("sandbox outlived husk");
}

#[test]
fn read_only_mounts_refuse_writes_and_rw_mounts_write_through() {
    let host = TempDir::new("mnt");
    fs::write(host.path().join("in.txt"), "input").unwrap();
    // The sandbox's user is an unprivileged host uid: it writes where the host lets others write.
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(host.path(), fs::Permissions::from_mode(0o777)).unwrap();
    let spec = format!("{}:/data", host.path().display());
    let r = husk_run(
        &["--mount", &spec, "--user", "root"],
        &[
            "/bin/sh",
            "-c",
            "exec 2>&1; cat /data/in.txt; echo; \
             touch /data/new || echo FAIL1; (echo x > /data/in.txt) || echo FAIL2; \
             mount -o remount,rw /data >/dev/null 2>&1 || echo FAIL3; touch /usr/evil || echo FAIL4",
        ],
    );
    r.ok();
    assert!(r.stdout.starts_with("input\n"), "{}", r.stdout);
    for f in ["FAIL1", "FAIL2", "FAIL3", "FAIL4"] {
        assert!(r.stdout.contains(f), "{f} missing: {}", r.stdout);
    }
    assert_eq!(
        r.stdout.matches("Read-only file system").count(),
        3,
        "{}",
        r.stdout
    );
    assert!(!host.path().join("new").exists());
    assert_eq!(
        fs::read_to_string(host.path().join("in.txt")).unwrap(),
        "input"
    );
    assert!(!std::path::Path::new("/usr/evil").exists());

    let spec = format!("{}:/data:rw", host.path().display());
    let r = husk_run(
        &["--mount", &spec],
        &["/bin/sh", "-c", "echo out > /data/out.txt"],
    );
    r.ok();
    assert_eq!(
        fs::read_to_string(host.path().join("out.txt")).unwrap(),
        "out\n"
    );
    // Stored as the directory's owner's (root made the test's directory).
    use std::os::unix::fs::MetadataExt;
    let uid = fs::metadata(host.path().join("out.txt")).unwrap().uid();
    assert_eq!(uid, 0);
}

#[test]
fn a_mounted_directorys_owner_is_the_sandboxs_user_and_gets_what_it_writes() {
    use std::os::unix::fs::{chown, MetadataExt, PermissionsExt};
    // An operator's directory: owned by host uid 1234, not writable by anyone else.
    let host = TempDir::new("owner");
    let dir = host.path().join("project");
    fs::create_dir(&dir).unwrap();
    fs::write(dir.join("mine.txt"), "mine").unwrap();
    fs::write(dir.join("theirs.txt"), "theirs").unwrap();
    chown(&dir, Some(1234), Some(1234)).unwrap();
    chown(dir.join("mine.txt"), Some(1234), Some(1234)).unwrap();
    chown(dir.join("theirs.txt"), Some(4321), Some(4321)).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(dir.join("theirs.txt"), fs::Permissions::from_mode(0o644)).unwrap();
    let spec = format!("{}:/work:rw", dir.display());
    for user in ["user", "root"] {
        let r = husk_run(
            &["--mount", &spec, "--user", user],
            &[
                "/bin/sh",
                "-c",
                "exec 2>&1; id -un; stat -c '%U:%G %n' /work /work/mine.txt /work/theirs.txt; echo new > /work/new-$(id -un).txt && echo WROTE; echo x >> /work/mine.txt && echo APPENDED; (echo x >> /work/theirs.txt) || echo REFUSED",
            ],
        );
        r.ok();
        let me = if user == "user" {
            "user:user"
        } else {
            "root:root"
        };
        let lines: Vec<&str> = r.stdout.lines().collect();
        assert_eq!(lines[0], user, "{}", r.stdout);
        assert_eq!(lines[1], format!("{me} /work"), "{}", r.stdout);
        assert_eq!(lines[2], format!("{me} /work/mine.txt"), "{}", r.stdout);
        assert_eq!(lines[3], "nobody:nogroup /work/theirs.txt", "{}", r.stdout);
        for want in ["WROTE", "APPENDED", "REFUSED"] {
            assert!(
                lines.contains(&want),
                "{want} missing as {user}: {}",
                r.stdout
            );
        }
        let new = fs::metadata(dir.join(format!("new-{user}.txt"))).unwrap();
        assert_eq!((new.uid(), new.gid()), (1234, 1234), "as {user}");
    }
    assert_eq!(
        fs::read_to_string(dir.join("mine.txt")).unwrap(),
        "minex\nx\n"
    );
    assert_eq!(
        fs::read_to_string(dir.join("theirs.txt")).unwrap(),
        "theirs"
    );
}

#[test]
fn mount_points_never_follow_the_sandboxs_symlinks() {
    let host = TempDir::new("mntlink");
    let spec = format!("{}:/bin/husk-mount-test", host.path().display());
    let r = husk_run(&["--mount", &spec], &["/bin/true"]);
    assert_eq!(r.code, 125, "{}", r.stderr);
    assert!(
        r.stderr.contains("refusing to follow symlink"),
        "{}",
        r.stderr
    );
    assert!(!std::path::Path::new("/usr/bin/husk-mount-test").exists());
}

#[test]
fn the_sandbox_tree_belongs_to_the_sandbox() {
    let r = husk_run(
        &["--user", "root"],
        &[
            "/usr/bin/stat",
            "-c",
            "%U %a %n",
            "/",
            "/tmp",
            "/root",
            "/home/user",
            "/etc/passwd",
            "/dev/null",
        ],
    );
    r.ok();
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "root 755 /",
            "root 1777 /tmp",
            "root 700 /root",
            "user 750 /home/user",
            "root 644 /etc/passwd",
            "root 666 /dev/null"
        ]
    );
}

/// `/dev` and `/dev/shm` are directories of the sandbox's tmpfs, bound (one file system fewer
/// each: every superblock costs each memory cgroup on the host): they keep their modes and
/// mount flags, and what they hold counts against the sandbox's disk.
#[test]
fn dev_and_dev_shm_are_on_the_sandboxs_disk() {
    let code = r#"
import errno, os, subprocess
def line(path):
    for l in open('/proc/self/mountinfo'):
        f = l.split()
        if f[4] == path:
            return set(f[5].split(','))
print('same fs', os.stat('/dev').st_dev == os.stat('/dev/shm').st_dev)
print('modes', oct(os.stat('/dev').st_mode & 0o7777), oct(os.stat('/dev/shm').st_mode & 0o7777))
print('dev flags', sorted(line('/dev') & {'noexec', 'nosuid', 'nodev'}))
print('shm flags', sorted(line('/dev/shm') & {'noexec', 'nosuid', 'nodev'}))
with open('/dev/null', 'w') as f:
    f.write('x')
print('null', len(open('/dev/zero', 'rb').read(4)))
chunk = b'x' * (1 << 20)
with open('/dev/shm/a', 'wb') as f:
    for _ in range(10):
        f.write(chunk)
try:
    with open('/tmp/b', 'wb') as f:
        for _ in range(10):
            f.write(chunk)
            f.flush()
    print('disk not shared')
except OSError as e:
    print('disk full', e.errno == errno.ENOSPC)
os.remove('/tmp/b')
with open('/dev/t', 'wb') as f:
    f.write(open('/bin/true', 'rb').read())
os.chmod('/dev/t', 0o755)
try:
    subprocess.run(['/dev/t'])
    print('exec in /dev')
except PermissionError:
    print('no exec in /dev')
"#;
    let r = husk_run(&["--user", "root", "--disk", "16M"], &strs(&py(code)));
    r.ok();
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "same fs True",
            "modes 0o755 0o1777",
            "dev flags ['noexec', 'nosuid']",
            "shm flags ['nodev', 'nosuid']",
            "null 4",
            "disk full True",
            "no exec in /dev",
        ],
        "{}",
        r.stderr
    );
}

#[test]
fn a_socket_given_as_stdio_does_not_reach_the_sandbox() {
    // A socket keeps the network namespace it was made in: passed as stdin, it would let the
    // sandbox send from the host's namespace.
    let listener = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let code = format!(
        "import socket\n\
         try:\n  socket.socket(fileno=0).sendto(b'x', ('127.0.0.1', {port})); print('SENT')\n\
         except OSError as e: print('refused', e.errno)"
    );
    let out = std::process::Command::new(HUSK)
        .args(["run", "--", "/usr/bin/python3", "-c", &code])
        .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(sock)))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("refused"), "{text}");
    let mut buf = [0u8; 8];
    assert!(
        listener.recv(&mut buf).is_err(),
        "the host listener got a datagram"
    );
}

#[test]
fn no_set_id_file_can_be_left_in_a_writable_host_mount() {
    let host = TempDir::new("setid");
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(host.path(), fs::Permissions::from_mode(0o777)).unwrap();
    let spec = format!("{}:/data:rw", host.path().display());
    for user in ["user", "root"] {
        // Each sandbox has its own uid range, so each works on files of its own.
        let code = format!(
            "import os, shutil\n\
             shutil.copy('/usr/bin/id', '/data/id-{user}')\n\
             os.chmod('/data/id-{user}', 0o755); print('plain chmod ok')\n\
             for mode in (0o4755, 0o2755):\n\
             \x20   try: os.chmod('/data/id-{user}', mode); print('CHMOD', oct(mode))\n\
             \x20   except PermissionError: print('chmod refused')\n\
             \x20   try: os.close(os.open('/data/new-{user}-%o' % mode, os.O_CREAT | os.O_WRONLY, mode)); print('CREATED', oct(mode))\n\
             \x20   except PermissionError: print('create refused')\n"
        );
        let r = husk_run(&["--mount", &spec, "--user", user], &strs(&py(&code)));
        r.ok();
        assert_eq!(
            r.stdout.lines().collect::<Vec<_>>(),
            [
                "plain chmod ok",
                "chmod refused",
                "create refused",
                "chmod refused",
                "create refused"
            ],
            "as {user}"
        );
    }
    for e in fs::read_dir(host.path()).unwrap().flatten() {
        let mode = e.metadata().unwrap().permissions().mode();
        assert_eq!(mode & 0o6000, 0, "{} is set-id", e.path().display());
    }
}

#[test]
fn pid1_shows_nothing_of_husks_host_command_line() {
    let host = TempDir::new("argv");
    let spec = format!("{}:/data", host.path().display());
    let r = husk_run(
        &["--env", "TOKEN=not-in-cmdline", "--mount", &spec],
        &["/bin/sh", "-c", "tr '\\0' ' ' < /proc/1/cmdline"],
    );
    r.ok();
    assert_eq!(r.stdout.trim(), "husk-init");
    // PID 1 is a session of its own, not in husk's process group on the host.
    let r = husk_run(&[], &["/bin/sh", "-c", "cut -d' ' -f5,6 /proc/1/stat"]);
    assert_eq!(r.ok().stdout.trim(), "1 1");
}

/// Takes inotify instances until the kernel refuses one or `limit` are held, says how many
/// (`held N`), then holds them.
const TAKE_INOTIFY: &str = r#"import ctypes, sys, time
l = ctypes.CDLL(None)
fds = []
while len(fds) < int(sys.argv[1]):
    fd = l.inotify_init1(0o2000000)
    if fd < 0: break
    fds.append(fd)
print('held', len(fds), flush=True)
time.sleep(120)
"#;

#[test]
fn a_sandbox_cannot_take_the_hosts_or_other_sandboxes_inotify_instances() {
    use std::io::BufRead;
    // A user namespace's per-user counts are charged to its owner at each level up; the
    // sandbox's namespace is owned by its slot's uid, so it has the host's per-user limit to
    // itself, and host root's (systemd's, husk's) and other sandboxes' are untouched.
    let limit: usize = fs::read_to_string("/proc/sys/fs/inotify/max_user_instances")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let want = limit.min(512).to_string();
    let dir = TempDir::new("inotify-share");
    let (mut a, _id) = husk_spawn(&[], &["python3", "-c", TAKE_INOTIFY, &want], &dir);
    let mut line = String::new();
    std::io::BufReader::new(a.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    // While it holds them: host root can still make one, and so can another sandbox, as many.
    // SAFETY: inotify_init1 takes a flag and returns a new fd or -1.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
    let host_ok = fd >= 0;
    if host_ok {
        // SAFETY: `fd` is the inotify descriptor just made, closed once.
        unsafe { libc::close(fd) };
    }
    let b = husk_run(
        &[],
        &[
            "timeout",
            "-s",
            "KILL",
            "10",
            "python3",
            "-c",
            TAKE_INOTIFY,
            &want,
        ],
    );
    let _ = a.kill();
    let _ = a.wait();
    assert_eq!(line.trim(), format!("held {want}"), "sandbox a");
    assert!(host_ok, "host root could not make an inotify instance");
    assert!(
        b.stdout.starts_with(&format!("held {want}\n")),
        "sandbox b: {}",
        b.stdout
    );
}
