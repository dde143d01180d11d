//! Where husk's database is, as every command that opens it is told: the SQLite file in the
//! state directory (the default: one machine), or a PostgreSQL database a cluster's nodes
//! share (`--database-url`, or `HUSK_DATABASE_URL` so that the password stays out of the
//! process list and shell history).

use std::path::Path;

use husk_core::store::{Store, StoreError, StoreLocation};

/// The flags that say where the database is (flattened into each command that opens it).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct DatabaseArgs {
    #[command(flatten)]
    pub postgres: PostgresArgs,
    /// This machine's name among the nodes sharing --database-url: its sandboxes, saved
    /// sandboxes, snapshots and runs are recorded under it [default: the host name].
    #[arg(long, global = true, value_name = "NAME", env = "HUSK_NODE_NAME")]
    pub node_name: Option<String>,
}

impl DatabaseArgs {
    /// Where the database is: PostgreSQL if a URL is given, else `state_dir`'s SQLite file.
    pub fn location(&self, state_dir: &Path) -> Result<StoreLocation, StoreError> {
        let Some(url) = &self.postgres.database_url else {
            return Ok(StoreLocation::Sqlite(state_dir.to_owned()));
        };
        let node = match &self.node_name {
            Some(n) => n.clone(),
            None => host_name(),
        };
        husk_core::store::postgres::validate_node(&node)?;
        Ok(StoreLocation::Postgres {
            url: url.clone(),
            node,
            ca: self.postgres.database_ca.clone(),
        })
    }

    /// Opens the database (see [`Self::location`]).
    pub fn open(&self, state_dir: &Path) -> Result<Store, StoreError> {
        Store::open_at(&self.location(state_dir)?)
    }

    /// Opens the database, or says on one line where it is and why it cannot be opened.
    pub fn open_or_explain(&self, state_dir: &Path) -> Result<Store, String> {
        let location = self
            .location(state_dir)
            .map_err(|e| crate::report::chain(&e))?;
        Store::open_at(&location)
            .map_err(|e| format!("{}: {}", describe(&location), crate::report::chain(&e)))
    }
}

/// Where `location` is, for messages: the state directory, or the database without its
/// password.
pub fn describe(location: &StoreLocation) -> String {
    match location {
        StoreLocation::Sqlite(dir) => format!("state directory {}", dir.display()),
        StoreLocation::Postgres { url, node, .. } => {
            format!("database {} (node {node})", redact(url))
        }
    }
}

/// `url` with any password replaced by `***`.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        // The key=value form: drop a password=… pair's value.
        return url
            .split_whitespace()
            .map(|kv| {
                if kv.starts_with("password=") {
                    "password=***"
                } else {
                    kv
                }
            })
            .collect::<Vec<_>>()
            .join(" ");
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            None => authority.to_owned(),
        },
        None => authority.to_owned(),
    };
    // A password may also be a query parameter.
    let path = match path.split_once('?') {
        Some((p, query)) => {
            let query = query
                .split('&')
                .map(|kv| {
                    if kv.starts_with("password=") {
                        "password=***"
                    } else {
                        kv
                    }
                })
                .collect::<Vec<_>>()
                .join("&");
            format!("{p}?{query}")
        }
        None => path.to_owned(),
    };
    format!("{scheme}://{authority}{path}")
}

/// The host name, lower-cased, as a node name's default.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_ascii_lowercase())
        .unwrap_or_default()
}

/// Where a PostgreSQL database is: every command that opens the database has these (in
/// [`DatabaseArgs`]); `husk gateway` and `husk cluster`, which only work on one, have them alone.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PostgresArgs {
    /// The PostgreSQL database (postgres://USER:PASSWORD@HOST:PORT/DB) that keeps keys, teams,
    /// secrets, templates and the sandbox catalog, shared by a cluster's nodes and gateways;
    /// without it, a server keeps them in the SQLite file in its state directory.
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = "HUSK_DATABASE_URL",
        hide_env_values = true
    )]
    pub database_url: Option<String>,
    /// A CA certificate (PEM) the database's certificate may be signed by, beside the host's
    /// CAs; with sslmode=require in the URL, husk always verifies the database's certificate.
    #[arg(long, global = true, value_name = "FILE", env = "HUSK_DATABASE_CA")]
    pub database_ca: Option<std::path::PathBuf>,
}

impl PostgresArgs {
    /// Opens the database as `node` (the row a command changes, or a name of its own);
    /// `command` names who needs it in the error when no URL was given.
    pub fn open(&self, command: &str, node: &str) -> Result<Store, String> {
        let Some(url) = &self.database_url else {
            return Err(format!(
                "{command} works on the cluster's PostgreSQL database: give --database-url (or \
                 HUSK_DATABASE_URL)"
            ));
        };
        let location = StoreLocation::Postgres {
            url: url.clone(),
            node: node.to_owned(),
            ca: self.database_ca.clone(),
        };
        Store::open_at(&location)
            .map_err(|e| format!("{}: {}", describe(&location), crate::report::chain(&e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_messages() {
        for (url, want) in [
            (
                "postgres://husk:s3cret@db:5432/husk",
                "postgres://husk:***@db:5432/husk",
            ),
            ("postgres://husk@db/husk", "postgres://husk@db/husk"),
            (
                "postgresql://u:p%40ss@db/x?sslmode=disable&password=zz",
                "postgresql://u:***@db/x?sslmode=disable&password=***",
            ),
            (
                "host=db user=husk password=s3cret dbname=husk",
                "host=db user=husk password=*** dbname=husk",
            ),
        ] {
            assert_eq!(redact(url), want);
        }
    }

    #[test]
    fn the_location_follows_the_flags() {
        let dir = Path::new("/var/lib/husk");
        let none = DatabaseArgs::default();
        assert_eq!(
            none.location(dir).unwrap(),
            StoreLocation::Sqlite(dir.to_owned())
        );
        let pg = DatabaseArgs {
            postgres: PostgresArgs {
                database_url: Some("postgres://h@db/husk".into()),
                database_ca: None,
            },
            node_name: Some("node-1".into()),
        };
        assert_eq!(
            pg.location(dir).unwrap(),
            StoreLocation::Postgres {
                url: "postgres://h@db/husk".into(),
                node: "node-1".into(),
                ca: None,
            }
        );
        let bad = DatabaseArgs {
            node_name: Some("Node_1".into()),
            ..pg
        };
        assert!(matches!(bad.location(dir), Err(StoreError::InvalidNode(_))));
    }
}
