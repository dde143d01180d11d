//! The runtime's own guards, for library users (a future server) as well as `husk run`.

use std::os::fd::AsFd;

use husk_runtime::{SandboxSpec, SpawnError, Spawner};

#[test]
fn create_refuses_unsafe_stdio_and_multithreaded_callers() {
    let spawner = Spawner::new().unwrap();
    let registry = std::path::Path::new(husk_runtime::spawner::DEFAULT_RUN_DIR).join("sandboxes");
    let entries = || std::fs::read_dir(&registry).unwrap().count();
    let before = entries();
    let spec = SandboxSpec::new(vec!["/bin/true".into()]);
    let devnull = std::fs::File::open("/dev/null").unwrap();
    // A socket would carry the host's network namespace into the sandbox.
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let err = spawner
        .create(
            &spec,
            Some([sock.as_fd(), devnull.as_fd(), devnull.as_fd()]),
        )
        .unwrap_err();
    assert!(matches!(err, SpawnError::InvalidSpec(_)), "{err}");
    assert!(err.to_string().contains("stdio fd 0"), "{err}");
    // The test harness runs tests on threads: forking here would be unsound, and is refused.
    let _other = std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_secs(2)));
    let err = spawner
        .create(
            &spec,
            Some([devnull.as_fd(), devnull.as_fd(), devnull.as_fd()]),
        )
        .unwrap_err();
    assert!(err.to_string().contains("single-threaded"), "{err}");
    // Neither refusal left anything behind (this test binary runs alone).
    assert_eq!(entries(), before, "a refused create left a registry entry");
}
