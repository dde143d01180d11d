//! The registry of built templates in PostgreSQL (see the SQLite file's
//! `store/templates.rs`): the cluster's, name → digest, image and manifest.

use std::path::PathBuf;

use postgres::Row;

use super::super::templates::{finish, COLUMNS};
use super::super::{to_db_time, StoreError, TemplateRecord};
use super::{to_i64, Postgres};

fn parts(row: &Row) -> Result<(TemplateRecord, String, i64), StoreError> {
    let size: i64 = row.get(3);
    Ok((
        TemplateRecord {
            name: row.get(0),
            digest: row.get(1),
            image: PathBuf::from(row.get::<_, String>(2)),
            size: u64::try_from(size)
                .map_err(|_| StoreError::Corrupt(format!("template size {size}")))?,
            manifest: Default::default(),
            created_at: time::OffsetDateTime::UNIX_EPOCH,
        },
        row.get(4),
        row.get(5),
    ))
}

impl Postgres {
    /// Registers `rec`, replacing a template of the same name; returns the replaced record.
    pub fn put_template(&self, rec: &TemplateRecord) -> Result<Option<TemplateRecord>, StoreError> {
        let manifest = serde_json::to_string(&rec.manifest)
            .map_err(|e| StoreError::Corrupt(format!("manifest: {e}")))?;
        let created = to_db_time(rec.created_at)?;
        let size = to_i64(rec.size, "template size")?;
        let image = rec.image.to_string_lossy();
        let mut conn = self.conn()?;
        let mut tx = conn.transaction()?;
        // Locks the row it replaces, so that two registrations of one name each return what
        // they replaced.
        let old = tx.query_opt(
            &format!("SELECT {COLUMNS} FROM templates WHERE name = $1 FOR UPDATE"),
            &[&rec.name],
        )?;
        tx.execute(
            "INSERT INTO templates (name, digest, image, size, manifest, created_at)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (name) DO UPDATE SET digest = excluded.digest, image = excluded.image,
               size = excluded.size, manifest = excluded.manifest,
               created_at = excluded.created_at",
            &[&rec.name, &rec.digest, &image, &size, &manifest, &created],
        )?;
        tx.commit()?;
        old.map(|r| parts(&r).and_then(finish)).transpose()
    }

    /// The template called `name`.
    pub fn template(&self, name: &str) -> Result<Option<TemplateRecord>, StoreError> {
        self.conn()?
            .query_opt(
                &format!("SELECT {COLUMNS} FROM templates WHERE name = $1"),
                &[&name],
            )?
            .map(|r| parts(&r).and_then(finish))
            .transpose()
    }

    /// Every template, by name.
    pub fn templates(&self) -> Result<Vec<TemplateRecord>, StoreError> {
        let rows = self.conn()?.query(
            &format!("SELECT {COLUMNS} FROM templates ORDER BY name"),
            &[],
        )?;
        rows.iter().map(|r| parts(r).and_then(finish)).collect()
    }

    /// Unregisters `name`; returns its record (`None`: there was none).
    pub fn delete_template(&self, name: &str) -> Result<Option<TemplateRecord>, StoreError> {
        self.conn()?
            .query_opt(
                &format!("DELETE FROM templates WHERE name = $1 RETURNING {COLUMNS}"),
                &[&name],
            )?
            .map(|r| parts(&r).and_then(finish))
            .transpose()
    }

    /// Whether any template's or snapshot's image is `digest` (so its file must stay).
    pub fn image_in_use(&self, digest: &str) -> Result<bool, StoreError> {
        Ok(self
            .conn()?
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM templates WHERE digest = $1)
                     OR EXISTS (SELECT 1 FROM snapshots WHERE digest = $1)",
                &[&digest],
            )?
            .get(0))
    }
}
