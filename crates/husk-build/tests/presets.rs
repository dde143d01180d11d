//! The preset templates in `templates/` parse, and hold what E2B's templates of the same names
//! promise. Fast: nothing is built (scripts/build-templates builds them).

use std::path::PathBuf;

use husk_build::plan::{Base, BuildPlan, Command, StepKind};
use husk_build::spec::load;

fn preset(name: &str) -> BuildPlan {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../templates")
        .join(name);
    load(&dir, &[]).unwrap_or_else(|e| panic!("templates/{name}: {e}"))
}

/// The package specs of the `packages.<tool>` step, as written (`numpy==2.4.6`).
fn tool_packages(plan: &BuildPlan, tool: &str) -> Vec<String> {
    let origin = format!("husk.toml: packages.{tool}");
    let step = plan
        .steps
        .iter()
        .find(|s| s.origin == origin)
        .unwrap_or_else(|| panic!("no {origin} step in {:#?}", plan.steps));
    let StepKind::Run {
        command: Command::Shell(cmd),
        ..
    } = &step.kind
    else {
        panic!("{origin} is not a shell command: {:?}", step.kind);
    };
    // The parser single-quotes each package; none of the presets' contain a quote.
    cmd.split('\'')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// A package spec's name: what comes before a version or extras.
fn package_name(spec: &str) -> &str {
    spec.split(['=', '<', '>', '!', '~', '[', ' '])
        .next()
        .unwrap_or(spec)
}

fn env<'a>(plan: &'a BuildPlan, name: &str) -> Option<&'a str> {
    plan.defaults
        .env
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

#[test]
fn base_is_bookworm_with_the_e2b_tools() {
    let plan = preset("base");
    assert_eq!(plan.name.as_deref(), Some("base"));
    let Base::Debian {
        suite, packages, ..
    } = &plan.base
    else {
        panic!("base should be a Debian base, is {:?}", plan.base);
    };
    assert_eq!(suite, "bookworm");
    for pkg in [
        "bash",
        "coreutils",
        "python3",
        "python3-pip",
        "python3-venv",
        "nodejs",
        "npm",
        "git",
        "curl",
        "ca-certificates",
    ] {
        assert!(
            packages.iter().any(|p| p == pkg),
            "base lacks {pkg}: {packages:?}"
        );
    }
    assert_eq!(plan.defaults.user.as_deref(), Some("user"));
    assert_eq!(plan.defaults.workdir.as_deref(), Some("/home/user"));
    assert_eq!(env(&plan, "LANG"), Some("C.UTF-8"));
    // Without it, bookworm's pip refuses `pip install` (PEP 668), which works in E2B's base.
    assert_eq!(env(&plan, "PIP_BREAK_SYSTEM_PACKAGES"), Some("1"));
    let path = env(&plan, "PATH").expect("base sets PATH");
    assert!(path.split(':').any(|d| d == "/usr/bin"), "{path}");
    assert!(
        path.split(':').any(|d| d == "/home/user/.local/bin"),
        "{path}"
    );
}

#[test]
fn code_interpreter_is_base_with_a_kernel_and_pinned_data_libraries() {
    let plan = preset("code-interpreter");
    assert_eq!(plan.name.as_deref(), Some("code-interpreter"));
    assert_eq!(plan.base, Base::Image("base".into()));
    let pip = tool_packages(&plan, "pip");
    for pkg in ["ipykernel", "numpy", "pandas", "matplotlib"] {
        assert!(
            pip.iter().any(|p| package_name(p) == pkg),
            "code-interpreter lacks {pkg}: {pip:?}"
        );
    }
    // Rebuilds must get the same versions of what the kernel's users import.
    for spec in &pip {
        assert!(spec.contains("=="), "{spec:?} is not pinned");
    }
}
