//! The pool's connections: a PostgreSQL client and the statements it has prepared.
//!
//! The synchronous client prepares a statement on every call that names it by its SQL text,
//! a round trip of its own before the one that runs it. Each connection here keeps what it
//! prepared, by text, so that a store call after the first is one round trip plus the pool's
//! check. The texts are the store's own (a few dozen), never a tenant's; the cache is bounded
//! anyway.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use postgres::types::ToSql;
use postgres::{Client, Row, Statement, Transaction};
use r2d2::ManageConnection;
use tokio_postgres_rustls::MakeRustlsConnect;

/// Statements a connection keeps prepared; past this it starts over (never reached by the
/// store's fixed set of statements).
const MAX_STATEMENTS: usize = 256;

/// A connection that answered a statement this recently is handed out without a check of
/// its own: the check is a round trip, as much as the statement itself. One idle for longer
/// (the database may have restarted meanwhile) is checked first.
const RECHECK_AFTER: Duration = Duration::from_secs(1);

/// Opens connections for the pool (r2d2's `ManageConnection`).
pub(in crate::store) struct Manager {
    pub(super) config: postgres::Config,
    pub(super) tls: MakeRustlsConnect,
}

/// One connection of the pool.
pub(in crate::store) struct Connection {
    pub(super) client: Client,
    statements: HashMap<String, Statement>,
    /// When the database last answered on it.
    answered: Instant,
}

impl ManageConnection for Manager {
    type Connection = Connection;
    type Error = postgres::Error;

    fn connect(&self) -> Result<Connection, postgres::Error> {
        Ok(Connection {
            client: self.config.connect(self.tls.clone())?,
            statements: HashMap::new(),
            answered: Instant::now(),
        })
    }

    /// Run as a connection leaves the pool: an empty query finds a connection the database
    /// closed (it restarted) before a store call fails on it, unless the connection answered
    /// within [`RECHECK_AFTER`] (then a restart since costs at most one call an
    /// `Unavailable`, and the broken connection is dropped).
    fn is_valid(&self, conn: &mut Connection) -> Result<(), postgres::Error> {
        if conn.client.is_closed() {
            // Checked the usual way, which fails: the pool drops it.
            return conn.client.simple_query("").map(|_| ());
        }
        if conn.answered.elapsed() < RECHECK_AFTER {
            return Ok(());
        }
        conn.client.simple_query("")?;
        conn.answered = Instant::now();
        Ok(())
    }

    fn has_broken(&self, conn: &mut Connection) -> bool {
        conn.client.is_closed()
    }
}

type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

impl Connection {
    /// `sql` prepared on this connection, from the cache when it was before.
    fn statement(&mut self, sql: &str) -> Result<Statement, postgres::Error> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        let statement = self.client.prepare(sql)?;
        if self.statements.len() >= MAX_STATEMENTS {
            self.statements.clear();
        }
        self.statements.insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }

    pub(super) fn execute(
        &mut self,
        sql: &str,
        params: Params<'_>,
    ) -> Result<u64, postgres::Error> {
        let statement = self.statement(sql)?;
        let out = self.client.execute(&statement, params);
        self.answered(out)
    }

    pub(super) fn query(
        &mut self,
        sql: &str,
        params: Params<'_>,
    ) -> Result<Vec<Row>, postgres::Error> {
        let statement = self.statement(sql)?;
        let out = self.client.query(&statement, params);
        self.answered(out)
    }

    pub(super) fn query_opt(
        &mut self,
        sql: &str,
        params: Params<'_>,
    ) -> Result<Option<Row>, postgres::Error> {
        let statement = self.statement(sql)?;
        let out = self.client.query_opt(&statement, params);
        self.answered(out)
    }

    pub(super) fn query_one(
        &mut self,
        sql: &str,
        params: Params<'_>,
    ) -> Result<Row, postgres::Error> {
        let statement = self.statement(sql)?;
        let out = self.client.query_one(&statement, params);
        self.answered(out)
    }

    /// Notes that the database answered (an error it sent back is an answer too).
    fn answered<T>(&mut self, out: Result<T, postgres::Error>) -> Result<T, postgres::Error> {
        if out.is_ok() || !self.client.is_closed() {
            self.answered = Instant::now();
        }
        out
    }

    /// A transaction on the client (its statements are prepared as they come: transactions
    /// are the rare writes).
    pub(super) fn transaction(&mut self) -> Result<Transaction<'_>, postgres::Error> {
        self.client.transaction()
    }
}
