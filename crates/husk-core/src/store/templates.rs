//! The registry of built templates: name → image file, digest and manifest. A template is
//! registered only once its image is complete (the builder renames it into place first), and
//! re-registering a name replaces the record in one statement.

use std::path::PathBuf;

use rusqlite::{params, OptionalExtension};

use super::{from_db_time, to_db_time, Sqlite, StoreError, TemplateRecord};

pub(super) const COLUMNS: &str = "name, digest, image, size, manifest, created_at";

fn row_to_record(row: &rusqlite::Row<'_>) -> rusqlite::Result<(TemplateRecord, String, i64)> {
    let manifest: String = row.get(4)?;
    let created: i64 = row.get(5)?;
    let size: i64 = row.get(3)?;
    Ok((
        TemplateRecord {
            name: row.get(0)?,
            digest: row.get(1)?,
            image: PathBuf::from(row.get::<_, String>(2)?),
            size: size as u64,
            manifest: Default::default(),
            created_at: time::OffsetDateTime::UNIX_EPOCH,
        },
        manifest,
        created,
    ))
}

pub(super) fn finish(parts: (TemplateRecord, String, i64)) -> Result<TemplateRecord, StoreError> {
    let (mut rec, manifest, created) = parts;
    rec.manifest = serde_json::from_str(&manifest)
        .map_err(|e| StoreError::Corrupt(format!("template {} manifest: {e}", rec.name)))?;
    rec.created_at = from_db_time(created)?;
    Ok(rec)
}

impl Sqlite {
    /// Registers `rec`, replacing a template of the same name; returns the replaced record.
    pub fn put_template(&self, rec: &TemplateRecord) -> Result<Option<TemplateRecord>, StoreError> {
        let manifest = serde_json::to_string(&rec.manifest)
            .map_err(|e| StoreError::Corrupt(format!("manifest: {e}")))?;
        let created = to_db_time(rec.created_at)?;
        let size = i64::try_from(rec.size).map_err(|_| StoreError::Corrupt("size".into()))?;
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let old = tx
            .query_row(
                &format!("SELECT {COLUMNS} FROM templates WHERE name = ?1"),
                params![rec.name],
                row_to_record,
            )
            .optional()?;
        tx.execute(
            "INSERT INTO templates (name, digest, image, size, manifest, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT(name) DO UPDATE SET digest = excluded.digest, image = excluded.image,
               size = excluded.size, manifest = excluded.manifest,
               created_at = excluded.created_at",
            params![
                rec.name,
                rec.digest,
                rec.image.to_string_lossy(),
                size,
                manifest,
                created
            ],
        )?;
        tx.commit()?;
        old.map(finish).transpose()
    }

    /// The template called `name`.
    pub fn template(&self, name: &str) -> Result<Option<TemplateRecord>, StoreError> {
        let conn = self.reader();
        let row = conn
            .prepare_cached(&format!("SELECT {COLUMNS} FROM templates WHERE name = ?1"))?
            .query_row(params![name], row_to_record)
            .optional()?;
        drop(conn);
        row.map(finish).transpose()
    }

    /// Every template, by name.
    pub fn templates(&self) -> Result<Vec<TemplateRecord>, StoreError> {
        let conn = self.reader();
        let mut stmt =
            conn.prepare_cached(&format!("SELECT {COLUMNS} FROM templates ORDER BY name"))?;
        let rows = stmt
            .query_map([], row_to_record)?
            .collect::<Result<Vec<_>, _>>()?;
        drop(stmt);
        drop(conn);
        rows.into_iter().map(finish).collect()
    }

    /// Unregisters `name`; returns its record (`None`: there was none).
    pub fn delete_template(&self, name: &str) -> Result<Option<TemplateRecord>, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let old = tx
            .query_row(
                &format!("SELECT {COLUMNS} FROM templates WHERE name = ?1"),
                params![name],
                row_to_record,
            )
            .optional()?;
        tx.execute("DELETE FROM templates WHERE name = ?1", params![name])?;
        tx.commit()?;
        old.map(finish).transpose()
    }

    /// Whether any template's image is `digest` (so its file must stay).
    pub fn image_in_use(&self, digest: &str) -> Result<bool, StoreError> {
        let conn = self.reader();
        let n: i64 = conn
            .prepare_cached(
                "SELECT (SELECT count(*) FROM templates WHERE digest = ?1)
                      + (SELECT count(*) FROM snapshots WHERE digest = ?1)",
            )?
            .query_row(params![digest], |r| r.get(0))?;
        Ok(n > 0)
    }
}
