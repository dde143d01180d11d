//! Team file systems on the real kernel (as root): the quota holds for every kind of write,
//! per team; images are sparse and give freed space back; opening again adopts mounts and
//! grows images; without a quota, and for workspaces from before quotas, nothing is mounted.

use super::tests::{mounts_beneath, State};
use super::*;

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn quota(bytes: u64) -> WorkspaceQuota {
    WorkspaceQuota::from_bytes(bytes).unwrap()
}

fn zeroes(n: u64) -> impl Read {
    io::repeat(0).take(n)
}

/// A tar stream of one file of `size` zero bytes, never held in memory.
fn big_tar(name: &str, size: u64) -> impl Read {
    let mut h = tar::Header::new_ustar();
    h.set_path(name).unwrap();
    h.set_size(size);
    h.set_mode(0o644);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    let pad = (512 - size % 512) % 512;
    io::Cursor::new(h.as_bytes().to_vec())
        .chain(zeroes(size + pad))
        .chain(io::Cursor::new(vec![0u8; 1024]))
}

fn team_dir(state: &State, team: &str) -> PathBuf {
    state.0.join(WORKSPACES_DIR).join(team)
}

fn image(state: &State, team: &str) -> PathBuf {
    state.0.join(IMAGES_DIR).join(format!("{team}.ext4"))
}

/// Bytes the image takes on the host's disk.
fn allocated(path: &Path) -> u64 {
    fs::metadata(path).unwrap().blocks() * 512
}

fn is_mount(dir: &Path) -> bool {
    let parent = dir.parent().unwrap();
    fs::metadata(dir).unwrap().dev() != fs::metadata(parent).unwrap().dev()
}

/// Writes out what is cached for the file system `dir` is on.
fn sync(dir: &Path) {
    let d = File::open(dir).unwrap();
    husk_runtime::sys::syncfs(d.as_fd()).unwrap();
}

fn wait_until(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let end = Instant::now() + timeout;
    while !ok() {
        assert!(Instant::now() < end, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn quota_exceeded(r: Result<impl std::fmt::Debug, WorkspaceError>, team: &str, q: u64) {
    match r {
        Err(WorkspaceError::QuotaExceeded { team: t, quota }) => {
            assert_eq!((t.as_str(), quota), (team, q));
        }
        other => panic!("expected the quota of {team} to be exceeded, got {other:?}"),
    }
}

#[test]
fn writes_past_a_teams_quota_fail_typed_while_other_teams_write_on() {
    let state = State::new("quota-full");
    let ws = Workspaces::open_with_quota(&state.0, quota(64 * MIB)).unwrap();
    assert_eq!(ws.quota_state(), &QuotaState::PerTeam(64 * MIB));
    assert!(ws.notices().is_empty(), "{:?}", ws.notices());
    ws.create("acme", "data").unwrap();
    ws.create("other", "data").unwrap();
    assert!(is_mount(&team_dir(&state, "acme")));
    assert!(is_mount(&team_dir(&state, "other")));

    // An upload larger than the quota: the typed error, and nothing left of it.
    let r = ws.write_file("acme", "data", "big", zeroes(80 * MIB), u64::MAX);
    quota_exceeded(r, "acme", 64 * MIB);
    let err = ws
        .write_file("acme", "data", "big", zeroes(80 * MIB), u64::MAX)
        .unwrap_err()
        .to_string();
    assert!(err.contains("'acme'") && err.contains("64 MiB"), "{err}");
    let left: Vec<_> = fs::read_dir(team_dir(&state, "acme").join("data"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "a failed upload left {left:?}");
    // An archive too.
    let r = ws.import_tar(
        "acme",
        "data",
        "",
        big_tar("big", 80 * MIB),
        ImportLimits::default(),
    );
    quota_exceeded(r, "acme", 64 * MIB);

    // Another team's file system is its own.
    ws.write_file("other", "data", "f", zeroes(40 * MIB), u64::MAX)
        .unwrap();
    // And the full team writes again once there is room.
    ws.write_file("acme", "data", "small", zeroes(MIB), u64::MAX)
        .unwrap();

    // Filled up by smaller writes: the one that does not fit fails typed.
    for i in 0.. {
        match ws.write_file("acme", "data", &format!("f{i}"), zeroes(8 * MIB), u64::MAX) {
            Ok(_) => assert!(i < 10, "64 MiB took more than 80 MiB"),
            Err(e) => {
                quota_exceeded(Err::<(), _>(e), "acme", 64 * MIB);
                break;
            }
        }
    }
    sync(&team_dir(&state, "acme"));
    let usage = ws.usage("acme").unwrap().unwrap();
    assert_eq!(usage.quota_bytes, 64 * MIB);
    // 49 MiB of files, and the file system's own overhead.
    assert!(
        usage.used_bytes > 49 * MIB && usage.used_bytes <= 64 * MIB,
        "{usage:?}"
    );
    // 40 MiB of files, and the overhead.
    let other = ws.usage("other").unwrap().unwrap();
    assert!(
        other.used_bytes > 40 * MIB && other.used_bytes < 52 * MIB,
        "{other:?}"
    );
}

#[test]
fn images_are_sparse_root_only_and_hold_only_workspaces() {
    let state = State::new("quota-sparse");
    let ws = Workspaces::open_with_quota(&state.0, quota(1 << 30)).unwrap();
    ws.create("acme", "data").unwrap();
    let img = image(&state, "acme");
    let meta = fs::symlink_metadata(&img).unwrap();
    assert_eq!(meta.len(), 1 << 30);
    assert_eq!((meta.uid(), meta.permissions().mode() & 0o7777), (0, 0o600));
    // A GiB of quota costs the disk a few MiB (the metadata mkfs wrote).
    assert!(
        allocated(&img) < 16 * MIB,
        "an empty 1 GiB image takes {} bytes",
        allocated(&img)
    );
    let dir = team_dir(&state, "acme");
    let meta = fs::metadata(&dir).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid(), meta.permissions().mode() & 0o7777),
        (0, 0, 0o700)
    );
    let names: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["data"], "lost+found or other leftovers");
    let ws_meta = fs::metadata(dir.join("data")).unwrap();
    assert_eq!((ws_meta.uid(), ws_meta.gid()), WORKSPACE_OWNER);
    let names: Vec<String> = ws
        .list("acme")
        .unwrap()
        .into_iter()
        .map(|i| i.name)
        .collect();
    assert_eq!(names, ["data"]);
}

#[test]
fn deleted_files_give_the_disk_back() {
    let state = State::new("quota-discard");
    let ws = Workspaces::open_with_quota(&state.0, quota(64 * MIB)).unwrap();
    ws.create("acme", "data").unwrap();
    let img = image(&state, "acme");
    let sync = || sync(&team_dir(&state, "acme"));
    for round in 0..3 {
        ws.write_file("acme", "data", "f", zeroes(40 * MIB), u64::MAX)
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        sync();
        assert!(allocated(&img) >= 40 * MIB, "round {round}");
        ws.remove("acme", "data", "f").unwrap();
        // Freed blocks are discarded at the journal's commit: holes in the image.
        wait_until("the image shrinks", Duration::from_secs(30), || {
            sync();
            allocated(&img) < 16 * MIB
        });
    }
    // Two of those would not fit at once.
    ws.write_file("acme", "data", "a", zeroes(40 * MIB), u64::MAX)
        .unwrap();
    quota_exceeded(
        ws.write_file("acme", "data", "b", zeroes(40 * MIB), u64::MAX),
        "acme",
        64 * MIB,
    );
}

#[test]
fn opening_again_adopts_mounts_grows_and_never_shrinks() {
    let state = State::new("quota-reopen");
    let dir = team_dir(&state, "acme");
    {
        let ws = Workspaces::open_with_quota(&state.0, quota(64 * MIB)).unwrap();
        ws.create("acme", "data").unwrap();
        ws.write_file("acme", "data", "keep", &b"kept"[..], 100)
            .unwrap();
    }
    // Adopted as it is: no second mount on top.
    let ws = Workspaces::open_with_quota(&state.0, quota(64 * MIB)).unwrap();
    assert_eq!(mounts_beneath(&state.0), [dir.as_path()]);
    drop(ws);

    // A larger quota grows the file system, online.
    let ws = Workspaces::open_with_quota(&state.0, quota(128 * MIB)).unwrap();
    assert!(ws.notices().is_empty(), "{:?}", ws.notices());
    assert_eq!(
        fs::metadata(image(&state, "acme")).unwrap().len(),
        128 * MIB
    );
    assert_eq!(ws.usage("acme").unwrap().unwrap().quota_bytes, 128 * MIB);
    ws.write_file("acme", "data", "big", zeroes(100 * MIB), u64::MAX)
        .unwrap();
    ws.remove("acme", "data", "big").unwrap();
    drop(ws);

    // A smaller one leaves it, and says so.
    let ws = Workspaces::open_with_quota(&state.0, quota(64 * MIB)).unwrap();
    assert!(
        ws.notices().iter().any(|n| n.contains("not shrunk")),
        "{:?}",
        ws.notices()
    );
    assert_eq!(
        fs::metadata(image(&state, "acme")).unwrap().len(),
        128 * MIB
    );
    drop(ws);

    // After a reboot (nothing mounted), the command-line tools' open mounts it again, with
    // the quota the last server recorded.
    super::tests::unmount_beneath(&state.0);
    wait_until("the team fs is unmounted", Duration::from_secs(10), || {
        mounts_beneath(&state.0).is_empty()
    });
    let ws = Workspaces::open(&state.0).unwrap();
    assert_eq!(ws.quota_state(), &QuotaState::PerTeam(64 * MIB));
    assert_eq!(mounts_beneath(&state.0), [dir.as_path()]);
    assert_eq!(
        read_all(ws.read_file("acme", "data", "keep").unwrap()),
        b"kept"
    );
}

fn read_all(mut f: File) -> Vec<u8> {
    let mut v = Vec::new();
    f.read_to_end(&mut v).unwrap();
    v
}

#[test]
fn without_a_quota_nothing_is_mounted() {
    let state = State::new("quota-off");
    let ws = Workspaces::open_with_quota(&state.0, WorkspaceQuota::Off).unwrap();
    assert_eq!(ws.quota_state(), &QuotaState::Off);
    ws.create("acme", "data").unwrap();
    ws.write_file("acme", "data", "f", zeroes(MIB), u64::MAX)
        .unwrap();
    assert!(mounts_beneath(&state.0).is_empty());
    assert!(!image(&state, "acme").exists());
    assert_eq!(ws.usage("acme").unwrap(), None);
    // The command-line tools follow the recorded setting.
    let ws = Workspaces::open(&state.0).unwrap();
    assert_eq!(ws.quota_state(), &QuotaState::Off);
}

#[test]
fn workspaces_from_before_quotas_stay_plain_and_new_teams_get_a_quota() {
    let state = State::new("quota-legacy");
    {
        // A state directory of a husk without quotas.
        let ws = Workspaces::open(&state.0).unwrap();
        ws.create("old", "data").unwrap();
        ws.write_file("old", "data", "f", &b"old data"[..], 100)
            .unwrap();
    }
    let ws = Workspaces::open_with_quota(&state.0, quota(64 * MIB)).unwrap();
    let notice = ws
        .notices()
        .iter()
        .find(|n| n.contains("'old'"))
        .unwrap_or_else(|| panic!("no notice about team old: {:?}", ws.notices()));
    assert!(
        notice.contains("NOT bounded") && notice.contains("husk workspace export"),
        "{notice}"
    );
    assert!(!is_mount(&team_dir(&state, "old")));
    assert_eq!(
        read_all(ws.read_file("old", "data", "f").unwrap()),
        b"old data"
    );
    ws.create("old", "more").unwrap();
    assert_eq!(ws.usage("old").unwrap(), None);
    ws.create("new", "data").unwrap();
    assert!(is_mount(&team_dir(&state, "new")));

    // Once a legacy team's workspaces are all gone, its next one is under the quota.
    ws.delete("old", "data").unwrap();
    ws.delete("old", "more").unwrap();
    ws.create("old", "data").unwrap();
    assert!(is_mount(&team_dir(&state, "old")));
}

#[test]
fn a_team_whose_image_would_hide_files_is_refused_not_hidden() {
    let state = State::new("quota-blocked");
    {
        let ws = Workspaces::open_with_quota(&state.0, quota(64 * MIB)).unwrap();
        ws.create("acme", "data").unwrap();
    }
    super::tests::unmount_beneath(&state.0);
    wait_until("the team fs is unmounted", Duration::from_secs(10), || {
        mounts_beneath(&state.0).is_empty()
    });
    // Something wrote into the bare mount point meanwhile.
    fs::write(team_dir(&state, "acme").join("stray"), b"x").unwrap();
    let ws = Workspaces::open_with_quota(&state.0, quota(64 * MIB)).unwrap();
    assert!(
        ws.notices().iter().any(|n| n.contains("hide")),
        "{:?}",
        ws.notices()
    );
    assert!(mounts_beneath(&state.0).is_empty());
    match ws.create("acme", "more") {
        Err(WorkspaceError::TeamUnavailable { team, reason }) => {
            assert_eq!(team, "acme");
            assert!(
                reason.contains("stray") || reason.contains("hide"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        fs::read(team_dir(&state, "acme").join("stray")).unwrap(),
        b"x"
    );
}
