//! `husk`: disposable Linux sandboxes for AI-generated code.
//!
//! This binary only orchestrates: `cli` turns flags into validated configuration, `run` drives
//! one sandbox through the runtime (`husk-runtime`), `bench` measures.
#![forbid(unsafe_code)]

mod bench;
mod cli;
mod keys;
mod relay;
mod run;
mod serve;
mod units;

use clap::Parser;

fn main() {
    let cli = cli::Cli::parse();
    let code = match cli.command {
        cli::Command::Run(args) => run::main(*args),
        cli::Command::Serve(args) => serve::main(*args),
        cli::Command::Key(args) => keys::main(args),
        cli::Command::Bench(args) => bench::main(args),
        cli::Command::BenchWorker(args) => bench::worker(args),
    };
    std::process::exit(code);
}
