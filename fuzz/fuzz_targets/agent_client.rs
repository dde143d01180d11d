//! The server's side of a hostile agent (`husk_core::agent::AgentClient`): the input is what
//! the agent writes on its socket, while the server has a call, a process (its output
//! redacted of secrets), a watch and a kernel under way.
//!
//! Checks: every call and stream ends once the agent's stream ends (no hang: libFuzzer's
//! timeout); the connection is then closed; unredacted output chunks stay within `CHUNK`;
//! nothing follows a process's `End` or a kernel's `Dead`; and no secret reaches any of the
//! process's outputs (stdout, stderr, terminal), however the agent cut them.
#![no_main]

use std::io::Write;
use std::net::Shutdown;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;

use husk_core::agent::AgentClient;
use husk_fuzz::{byte, field, runtime, Unstructured};
use husk_proto::{
    FromAgent, Hello, KernelEvent, KernelStart, ProcEvent, Request, StartProc, User, CHUNK, VERSION,
};
use libfuzzer_sys::fuzz_target;
use zeroize::Zeroizing;

fn hello() -> Hello {
    Hello {
        version: VERSION,
        env: Vec::new(),
        default_user: User::User,
        default_workdir: None,
    }
}

fn start() -> StartProc {
    StartProc::new("/bin/true", Vec::new())
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let mode = byte(&mut u);
    // Secrets without `*`: the mask is `****`, so a value made of stars would "appear".
    let secrets: Vec<Vec<u8>> = (0..byte(&mut u) % 3)
        .map(|_| {
            field(&mut u, 12)
                .iter()
                .map(|b| if *b == b'*' { b'+' } else { *b })
                .collect()
        })
        .filter(|s: &Vec<u8>| !s.is_empty())
        .collect();
    let stream = u.take_rest();
    // More than a socket buffer would block the writer (this thread).
    if stream.len() > 100 << 10 {
        return;
    }
    let (ours, mut theirs) = UnixStream::pair().expect("a socket pair");
    if mode & 1 == 0 {
        // Mostly the agent answers the hello properly and the input is what follows.
        let frame = husk_proto::encode(&FromAgent::Hello { version: VERSION }).unwrap();
        theirs.write_all(&frame).unwrap();
    }
    theirs.write_all(stream).unwrap();
    theirs.shutdown(Shutdown::Write).unwrap();

    runtime().block_on(async {
        let Ok(client) = AgentClient::connect(OwnedFd::from(ours), hello()).await else {
            return;
        };
        // Call ids are given in the order the futures are first polled: 1 to 4.
        let call = client.call(Request::List);
        let process = async {
            let Ok((_, stream)) = client.start(start()).await else {
                return (Default::default(), false);
            };
            let values = secrets.iter().map(|s| Zeroizing::new(s.clone())).collect();
            let mut stream = stream.redacted(values);
            // Stdout, stderr and terminal output: each is redacted (and read) on its own.
            let mut out = [Vec::new(), Vec::new(), Vec::new()];
            let mut ended = false;
            while let Some(ev) = stream.next().await {
                assert!(!ended, "an event after the process's end");
                let (i, b) = match ev {
                    ProcEvent::Stdout(b) => (0, b),
                    ProcEvent::Stderr(b) => (1, b),
                    ProcEvent::Pty(b) => (2, b),
                    ProcEvent::End(_) => {
                        ended = true;
                        continue;
                    }
                };
                // Masks may make redacted output longer than what the agent sent.
                assert!(
                    !secrets.is_empty() || b.len() <= CHUNK,
                    "a chunk over CHUNK"
                );
                out[i].extend_from_slice(&b);
            }
            (out, ended)
        };
        let watch = async {
            if let Ok(mut w) = client.watch("/w".into(), false, User::User).await {
                while w.next().await.is_some() {}
            }
        };
        let kernel = async {
            let k = KernelStart {
                kernel: 7,
                spec: "python3".into(),
                cwd: None,
                user: User::User,
                envs: Vec::new(),
                secret_envs: Vec::new(),
            };
            if let Ok(mut events) = client.kernel_start(k).await {
                let mut dead = false;
                while let Some(ev) = events.next().await {
                    assert!(!dead, "an event after the kernel's death");
                    dead = matches!(ev, KernelEvent::Dead { .. });
                }
            }
        };
        let (_, (out, ended), (), ()) = tokio::join!(call, process, watch, kernel);
        for (s, o) in secrets.iter().flat_map(|s| out.iter().map(move |o| (s, o))) {
            // Output cut off without an `End` may lose what was held back; it never leaks.
            assert!(
                !o.windows(s.len()).any(|w| w == &s[..]),
                "secret {s:?} in the output {o:?} (ended: {ended})"
            );
        }
        tokio::time::timeout(std::time::Duration::from_secs(5), client.closed())
            .await
            .expect("the connection did not close at the end of the agent's stream");
        assert!(client.is_closed());
    });
});
