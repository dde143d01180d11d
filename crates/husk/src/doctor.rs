//! `husk doctor`: whether this host can run husk, and what to do where it cannot. One line per
//! check of the runtime's probes (`husk_runtime::probe`) and the network's
//! (`husk_net::probe`); exit code 0 when husk can run (warnings allowed), 1 when something it
//! needs is missing.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use husk_runtime::probe::{self, Report, Status};

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Print the report as JSON (`{"kernel", "checks": [{"name", "status", "detail",
    /// "remedy"}], "usable", "elapsed_ms"}`).
    #[arg(long)]
    pub json: bool,
    /// The state directory husk would use (templates, workspaces).
    #[arg(long, value_name = "DIR", default_value = husk_core::store::DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
}

/// What `husk run` and `husk serve` add when the runtime cannot start.
pub const HINT: &str = "run `husk doctor` for what this host lacks";

/// Exit code when something husk needs is missing.
const EXIT_MISSING: i32 = 1;

pub fn main(args: DoctorArgs) -> i32 {
    let report = report(&args.state_dir);
    if args.json {
        let mut v = match serde_json::to_value(&report) {
            Ok(v) => v,
            Err(e) => {
                crate::report::say(&crate::report::chain(&e));
                return EXIT_MISSING;
            }
        };
        v["usable"] = report.usable().into();
        println!("{v:#}");
    } else {
        print!("{}", render(&report));
    }
    if report.usable() {
        0
    } else {
        EXIT_MISSING
    }
}

/// Every check: the runtime's first (they fork, so before any thread exists), then the
/// network's.
fn report(state_dir: &Path) -> Report {
    let start = Instant::now();
    let mut report = probe::run(&probe::Options {
        state_dir: state_dir.to_owned(),
    });
    let root = report.get("root").is_some_and(|c| c.status == Status::Ok);
    report.checks.extend(husk_net::probe::checks(root));
    report.elapsed_ms = start.elapsed().as_secs_f64() * 1000.0;
    report
}

/// Width of the name column.
const NAME_WIDTH: usize = 24;

/// The report for people: one line per check, the remedy under warnings and missing
/// features, a summary.
fn render(report: &Report) -> String {
    let mut out = format!("husk doctor: Linux {}\n", report.kernel);
    for c in &report.checks {
        out.push_str(&format!(
            "{:<8} {:<NAME_WIDTH$} {}\n",
            c.status.as_str(),
            c.name,
            c.detail
        ));
        if let (Some(r), Status::Warning | Status::Missing) = (&c.remedy, c.status) {
            out.push_str(&format!("{:<8} {:<NAME_WIDTH$} -> {r}\n", "", ""));
        }
    }
    let plural =
        |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let counts = format!(
        "{} ok, {}, {} missing, {} skipped",
        report.count(Status::Ok),
        plural(report.count(Status::Warning), "warning", "warnings"),
        report.count(Status::Missing),
        report.count(Status::Skipped),
    );
    let verdict = if report.usable() {
        "husk can run on this host"
    } else {
        "husk cannot run on this host: fix what is missing above"
    };
    out.push_str(&format!(
        "\n{verdict} ({counts}; probed in {:.0} ms)\n",
        report.elapsed_ms
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use husk_runtime::probe::Check;

    fn sample(checks: Vec<Check>) -> Report {
        Report {
            kernel: "6.1.0-48-amd64".into(),
            checks,
            elapsed_ms: 41.6,
        }
    }

    #[test]
    fn each_check_is_one_line_and_remedies_follow_what_is_not_ok() {
        let text = render(&sample(vec![
            Check::ok("namespace.user", "available"),
            Check::warning(
                "landlock",
                "ABI 2: not enforced here: ...",
                "boot a kernel >= 6.12",
            ),
            Check::missing("fs.erofs", "no erofs", "load the module: modprobe erofs"),
            Check::skipped("net.veth", "not probed: needs root"),
        ]));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "husk doctor: Linux 6.1.0-48-amd64");
        assert!(lines[1].starts_with("ok       namespace.user "), "{text}");
        assert!(lines[2].starts_with("warning  landlock "), "{text}");
        assert!(
            lines[3]
                .trim_start()
                .starts_with("-> boot a kernel >= 6.12"),
            "{text}"
        );
        assert!(lines[4].starts_with("missing  fs.erofs "), "{text}");
        assert!(
            lines[5].ends_with("-> load the module: modprobe erofs"),
            "{text}"
        );
        assert!(lines[6].starts_with("skipped  net.veth "), "{text}");
        assert!(
            text.trim_end().ends_with(
                "husk cannot run on this host: fix what is missing above \
                 (1 ok, 1 warning, 1 missing, 1 skipped; probed in 42 ms)"
            ),
            "{text}"
        );
    }

    #[test]
    fn warnings_alone_leave_the_host_usable() {
        let text = render(&sample(vec![Check::warning("landlock", "ABI 2", "boot")]));
        assert!(
            text.contains("husk can run on this host (0 ok, 1 warning,"),
            "{text}"
        );
    }
}
