//! The one door for processes, against a fake host whose agents print the environment they
//! got: secrets reach a process's environment only, come back masked (also to whoever
//! attaches later), are audited, and masking can be switched off per process.

use std::sync::Arc;
use std::time::Duration;

use crate::calls::{ProcessSpec, Selector};

use super::*;
use crate::manager::{Config, CreateRequest};
use crate::secrets::{MasterKeys, Secrets, MASTER_KEY_FILE};
use crate::store::{Principal, Store};
use crate::testing::FakeHost;

const VALUE: &str = "sk-live-0123456789-fake-secret";

/// A directory removed on drop (the master key lives in it).
struct Dir(std::path::PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn manager(with_secrets: bool) -> (Arc<Manager>, Arc<FakeHost>, Dir) {
    let mut r = [0u8; 8];
    getrandom::fill(&mut r).unwrap();
    let dir = Dir(std::env::temp_dir().join(format!("husk-process-{}", hex::encode(r))));
    std::fs::create_dir_all(&dir.0).unwrap();
    let store = Arc::new(Store::open_in_memory().unwrap());
    let host = FakeHost::new();
    let config = Config {
        memory_reserve: 0,
        ..Config::default()
    };
    let m = Manager::new(store.clone(), host.clone(), config).unwrap();
    if with_secrets {
        let keys = MasterKeys::load(&dir.0.join(MASTER_KEY_FILE)).unwrap();
        let secrets = Arc::new(Secrets::new(store, keys));
        secrets.set("a", "API", VALUE.as_bytes()).unwrap();
        m.set_secrets(secrets);
    }
    (m, host, dir)
}

fn who() -> Principal {
    Principal {
        team: "a".into(),
        key_id: "k".into(),
        admin: false,
    }
}

async fn sandbox(m: &Arc<Manager>, env: &[(&str, &str)]) -> Arc<LiveSandbox> {
    let req = CreateRequest {
        template: "host".into(),
        timeout: Duration::from_secs(300),
        env: crate::manager::EnvVars::new(
            env.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
        .unwrap(),
        ..CreateRequest::default()
    };
    m.create(&who(), req).await.unwrap()
}

fn start(envs: &[(&str, &str)]) -> ProcessSpec {
    spec(&["-l", "-c", "printenv"], envs)
}

fn spec(args: &[&str], envs: &[(&str, &str)]) -> ProcessSpec {
    let envs = envs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    ProcessSpec::new("/bin/bash", args.iter().map(|a| a.to_string()).collect())
        .unwrap()
        .env(crate::manager::EnvVars::new(envs).unwrap())
}

use crate::testing::stdout_of as output;

#[tokio::test]
async fn a_secret_reaches_one_process_masked_audited_and_stays_masked_on_attach() {
    let (m, host, _dir) = manager(true);
    let sb = sandbox(&m, &[("FROM_SANDBOX", "husk-secret://API")]).await;
    let (pid, events) = m
        .start_process(&sb, start(&[("K", "husk-secret://API"), ("PLAIN", "x")]))
        .await
        .unwrap();
    // The agent got the value only in the process's secret environment; the request's
    // environment (what a process list shows) keeps the reference.
    let got = &host.started()[0];
    let value = VALUE.to_string();
    assert!(got.secret_envs.contains(&("K".into(), value.clone())));
    assert!(got
        .secret_envs
        .contains(&("FROM_SANDBOX".into(), value.clone())));
    assert!(got.envs.contains(&("K".into(), "husk-secret://API".into())));
    assert!(!got.envs.iter().any(|(_, v)| v.contains(VALUE)));
    // What comes back is masked.
    let printed = output(events).await;
    assert!(
        printed.contains("K=****") && printed.contains("PLAIN=x"),
        "{printed}"
    );
    assert!(!printed.contains(VALUE), "{printed}");
    // And still masked for whoever attaches to the process later.
    let (again, events) = m.attach_process(&sb, Selector::Pid(pid)).await.unwrap();
    assert_eq!(again, pid);
    let printed = output(events).await;
    assert!(
        printed.contains("K=****") && !printed.contains(VALUE),
        "{printed}"
    );
    // The audit names the secret, the sandbox and the command line, never the value.
    let uses = m.secrets().unwrap().uses("a", 10).unwrap();
    assert_eq!(uses.len(), 1);
    assert_eq!(
        (uses[0].secret.as_str(), uses[0].sandbox.as_str()),
        ("API", sb.id.as_str())
    );
    assert_eq!(uses[0].command, "/bin/bash -l -c printenv");
}

#[tokio::test]
async fn masking_can_be_turned_off_and_its_switch_never_reaches_the_process() {
    let (m, host, _dir) = manager(true);
    let sb = sandbox(&m, &[]).await;
    let (_, events) = m
        .start_process(
            &sb,
            start(&[("K", "husk-secret://API"), ("HUSK_REDACT", "0")]),
        )
        .await
        .unwrap();
    let printed = output(events).await;
    assert!(printed.contains(&format!("K={VALUE}")), "{printed}");
    // A process without secrets does not get the switch either.
    m.start_process(&sb, start(&[("HUSK_REDACT", "1")]))
        .await
        .unwrap();
    for p in host.started() {
        assert!(!p.envs.iter().any(|(k, _)| k == "HUSK_REDACT"), "{p:?}");
    }
}

#[tokio::test]
async fn unknown_secrets_and_a_server_without_secrets_are_refused_before_the_agent() {
    let (m, host, _dir) = manager(true);
    let sb = sandbox(&m, &[]).await;
    let err = m
        .start_process(&sb, start(&[("K", "husk-secret://NOPE")]))
        .await
        .err()
        .expect("refused");
    assert!(
        matches!(&err, ProcessError::Secret(SecretError::NotFound(n)) if n == "NOPE"),
        "{err:?}"
    );
    let (m2, host2, _dir2) = manager(false);
    let sb2 = sandbox(&m2, &[]).await;
    let err = m2
        .start_process(&sb2, start(&[("K", "husk-secret://API")]))
        .await
        .err()
        .expect("refused");
    assert!(matches!(err, ProcessError::SecretsDisabled), "{err:?}");
    assert!(host.started().is_empty() && host2.started().is_empty());
}

#[tokio::test]
async fn the_audit_never_keeps_a_value_the_command_names_even_unmasked() {
    let (m, _host, _dir) = manager(true);
    let sb = sandbox(&m, &[]).await;
    let test = format!("test \"$K\" = \"{VALUE}\" && echo match");
    let p = spec(
        &["-c", &test],
        &[("K", "husk-secret://API"), ("HUSK_REDACT", "0")],
    );
    m.start_process(&sb, p).await.unwrap();
    let uses = m.secrets().unwrap().uses("a", 10).unwrap();
    assert_eq!(
        uses[0].command,
        "/bin/bash -c test \"$K\" = \"****\" && echo match"
    );
}

#[test]
fn masking_a_command_line_takes_longer_values_first() {
    let env = vec![
        ("A".to_string(), "abc".to_string()),
        ("B".to_string(), "abcdef".to_string()),
    ];
    assert_eq!(masked("x abcdef y abc z", &env), "x **** y **** z");
    assert_eq!(masked("nothing", &[("E".into(), String::new())]), "nothing");
}

#[test]
fn the_audit_keeps_a_bounded_command_line() {
    let p = start(&[]);
    assert_eq!(command_line(&p), "/bin/bash -l -c printenv");
    let long = "é".repeat(MAX_AUDIT_COMMAND);
    let cut = bounded(&long);
    assert!(cut.len() <= MAX_AUDIT_COMMAND && cut.len() >= MAX_AUDIT_COMMAND - 1);
    assert!(long.starts_with(cut));
}
