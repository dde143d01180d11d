//! Network namespaces: making them, and doing work inside one without moving the caller.
//!
//! A socket belongs to the namespace of the thread that created it, for its whole life, and
//! can be used from any thread afterwards. So "a socket inside namespace N" is made by a short
//! lived thread that enters N, creates the socket and ends; the caller's threads never change
//! namespace (a tokio worker that did would carry it into unrelated tasks).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use husk_runtime::sys;

/// A network namespace, held open by a file descriptor (the namespace lives while any holder,
/// process or descriptor, does).
#[derive(Debug, Clone)]
pub struct NetNs(Arc<OwnedFd>);

impl NetNs {
    /// A new, empty namespace (loopback down), owned by the caller's user namespace.
    pub fn create() -> io::Result<NetNs> {
        run_on_thread(|| {
            // It changes only this short-lived thread's namespace.
            sys::unshare(libc::CLONE_NEWNET)?;
            Ok(NetNs(Arc::new(
                File::open("/proc/thread-self/ns/net")?.into(),
            )))
        })
    }

    /// The namespace of the calling thread.
    pub fn current() -> io::Result<NetNs> {
        Ok(NetNs(Arc::new(
            File::open("/proc/thread-self/ns/net")?.into(),
        )))
    }

    /// The namespace at `path` (`/proc/PID/ns/net`, `/run/netns/NAME`).
    pub fn open(path: &std::path::Path) -> io::Result<NetNs> {
        let f = File::open(path)?;
        // Refuse anything that is not a network namespace (setns would, later and obscurely).
        if sys::namespace_type(f.as_fd()).ok() != Some(libc::CLONE_NEWNET) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a network namespace", path.display()),
            ));
        }
        Ok(NetNs(Arc::new(f.into())))
    }

    /// The namespace behind a descriptor someone passed in (refused unless it is a network
    /// namespace).
    pub fn from_fd(fd: OwnedFd) -> io::Result<NetNs> {
        if sys::namespace_type(fd.as_fd()).ok() != Some(libc::CLONE_NEWNET) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the descriptor is not a network namespace",
            ));
        }
        Ok(NetNs(Arc::new(fd)))
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }

    /// Runs `f` on a new thread that has entered this namespace, and returns its result.
    /// Sockets `f` creates belong to this namespace.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
        let fd = self.0.as_fd();
        run_on_thread(move || {
            // It changes only this short-lived thread's namespace.
            sys::setns(fd, libc::CLONE_NEWNET)?;
            f()
        })
    }

    /// Whether both name the same namespace.
    pub fn same_as(&self, other: &NetNs) -> bool {
        use std::os::unix::fs::MetadataExt;
        let meta = |n: &NetNs| File::from(n.0.try_clone().ok()?).metadata().ok();
        match (meta(self), meta(other)) {
            (Some(a), Some(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }
}

fn run_on_thread<T: Send>(f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("husk-netns".into())
            .spawn_scoped(s, f)?
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("namespace worker panicked")))
    })
}

/// A TCP socket created in `ns` and connected (non-blocking, for tokio) to `addr` from there.
pub async fn tcp_connect(
    ns: Option<&NetNs>,
    addr: std::net::SocketAddr,
) -> io::Result<tokio::net::TcpStream> {
    let socket = match ns {
        Some(ns) => ns.run(|| tcp_socket(addr))?,
        None => tcp_socket(addr)?,
    };
    socket.connect(addr).await
}

fn tcp_socket(addr: std::net::SocketAddr) -> io::Result<tokio::net::TcpSocket> {
    let s = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM.nonblocking().cloexec(),
        Some(socket2::Protocol::TCP),
    )?;
    s.set_tcp_nodelay(true)?;
    Ok(tokio::net::TcpSocket::from_std_stream(s.into()))
}

/// A TCP listener bound to `addr` in `ns` (for tokio; call inside a runtime).
pub fn tcp_listen(ns: &NetNs, addr: std::net::SocketAddr) -> io::Result<tokio::net::TcpListener> {
    let std = ns.run(|| {
        let s = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::STREAM.nonblocking().cloexec(),
            Some(socket2::Protocol::TCP),
        )?;
        s.set_reuse_address(true)?;
        s.bind(&addr.into())?;
        s.listen(1024)?;
        Ok(std::net::TcpListener::from(s))
    })?;
    tokio::net::TcpListener::from_std(std)
}

/// A UDP socket bound to `addr` in `ns` (None: the caller's namespace).
pub fn udp_bind(
    ns: Option<&NetNs>,
    addr: std::net::SocketAddr,
) -> io::Result<tokio::net::UdpSocket> {
    let make = || {
        let s = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::DGRAM.nonblocking().cloexec(),
            Some(socket2::Protocol::UDP),
        )?;
        s.bind(&addr.into())?;
        Ok(std::net::UdpSocket::from(s))
    };
    let std = match ns {
        Some(ns) => ns.run(make)?,
        None => make()?,
    };
    tokio::net::UdpSocket::from_std(std)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_namespace_is_another_and_run_enters_it() {
        let host = NetNs::current().unwrap();
        let ns = NetNs::create().unwrap();
        assert!(!ns.same_as(&host));
        assert!(host.same_as(&NetNs::current().unwrap()));
        // Inside, only a loopback that is down: binding 127.0.0.1 fails until it is up.
        let inside = ns
            .run(|| std::fs::read_to_string("/proc/thread-self/net/dev"))
            .unwrap();
        assert!(inside.contains("lo:"));
        assert!(!inside.contains("eth0"));
        // The caller stayed where it was.
        assert!(host.same_as(&NetNs::current().unwrap()));
    }

    #[test]
    fn open_refuses_what_is_not_a_network_namespace() {
        assert!(NetNs::open(std::path::Path::new("/proc/self/ns/mnt")).is_err());
        assert!(NetNs::open(std::path::Path::new("/proc/self/ns/net")).is_ok());
    }
}
