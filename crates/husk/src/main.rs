//! `husk`: disposable Linux sandboxes for AI-generated code.
//!
//! This binary only orchestrates: `cli` turns flags into validated configuration, `run` drives
//! one sandbox through the runtime (`husk-runtime`), `bench` measures.
#![forbid(unsafe_code)]

mod batch;
mod bench;
mod bench_net;
mod bench_oci;
mod bench_rules;
mod cli;
mod client;
mod cluster;
mod cluster_admin;
mod database;
mod doctor;
mod egress;
mod keys;
mod relay;
mod report;
mod run;
mod sandbox;
mod secret;
mod serve;
mod server_user;
mod state_lock;
mod sudo;
mod template;
mod template_progress;
mod units;
mod workspace;

use clap::Parser;

fn main() {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // Inside a server sandbox this binary is also /usr/local/bin/sudo.
    let argv0 = argv.first().map(std::path::Path::new);
    if argv0.and_then(|p| p.file_name()) == Some("sudo".as_ref()) {
        let args: Vec<String> = argv
            .iter()
            .skip(1)
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        std::process::exit(sudo::main(&args));
    }
    // The holder of the scope husk processes share on a systemd host (started by husk itself,
    // never by hand: husk_runtime::shared_scope).
    if argv
        .get(1)
        .is_some_and(|a| a == husk_runtime::shared_scope::HOLD_ARG)
    {
        std::process::exit(husk_runtime::shared_scope::hold_main(&argv[2..]));
    }
    if let Some(args) = cli::RunCli::parse_if_run(&argv) {
        std::process::exit(run::main(args));
    }
    let cli = cli::Cli::parse_from(argv);
    let code = match cli.command {
        cli::Command::Run(args) => run::main(*args),
        cli::Command::Batch(args) => batch::main(*args),
        cli::Command::Serve(args) => serve::main(*args),
        cli::Command::Node(args) => cluster::node_main(*args),
        cli::Command::Gateway(args) => cluster::gateway_main(*args),
        cli::Command::Cluster(args) => cluster_admin::main(args),
        cli::Command::Key(args) => keys::main(args),
        cli::Command::Secret(args) => secret::main(args),
        cli::Command::Workspace(args) => workspace::main(args),
        cli::Command::Sandbox(args) => sandbox::main(args),
        cli::Command::Template(args) => template::main(args),
        cli::Command::Bench(args) => bench::main(args),
        cli::Command::Doctor(args) => doctor::main(args),
        cli::Command::BenchWorker(args) => bench::worker(args),
    };
    std::process::exit(code);
}
