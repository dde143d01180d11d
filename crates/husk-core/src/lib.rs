//! husk's core: the sandbox manager (lifecycle, tenancy, quotas, timeouts), the server's side
//! of the agent protocol, API keys and the SQLite store. It never sees HTTP types; the
//! adapters in `husk-server` turn requests into calls here.
#![forbid(unsafe_code)]

pub mod agent;
pub mod calls;
pub mod contexts;
pub mod files;
pub mod host;
pub mod ids;
pub mod keys;
pub mod manager;
pub mod net_rules;
pub mod operator_files;
pub mod process;
pub mod runs;
pub mod saved_layers;
pub mod secrets;
mod start_cmd;
pub mod store;
pub mod tar_ext;
pub mod template;
#[cfg(test)]
pub(crate) mod testing;
pub mod volumes;
pub mod workspaces;

/// An error and its causes on one line, as clients and logs should see it.
pub use husk_runtime::failure::chain as error_chain;
