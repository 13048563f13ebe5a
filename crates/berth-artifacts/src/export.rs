//! The index as Apache Parquet: one row per indexed file, readable by any Parquet tool
//! (DuckDB, pyarrow, Spark) without Berth's database. The file carries its schema version in the
//! Parquet key-value metadata (`berth.schema`).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, BooleanArray, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use berth_store::ArtifactRow;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;

use crate::ArtifactError;

/// The schema version written into every exported file's metadata.
pub const INDEX_SCHEMA: &str = "berth.artifacts.index/v1";
/// The metadata key that carries [`INDEX_SCHEMA`].
pub const SCHEMA_KEY: &str = "berth.schema";
/// The file [`write_parquet`] writes inside its directory.
pub const PARQUET_FILE: &str = "artifacts.parquet";

/// Rows per row group: bounds the writer's memory whatever the index's size.
const ROW_GROUP_ROWS: usize = 64 * 1024;

/// The Arrow schema of an index row (also the Iceberg table's, field for field).
pub fn index_schema() -> SchemaRef {
    let text = |name: &str| Field::new(name, DataType::Utf8, false);
    Arc::new(Schema::new(vec![
        text("bundle_id"),
        text("path"),
        text("mission_id"),
        text("task_id"),
        text("attempt_key"),
        Field::new("accepted", DataType::Boolean, false),
        text("mime"),
        Field::new("size", DataType::Int64, false),
        text("blake3"),
        text("sha256"),
        text("object_key"),
    ]))
}

/// `rows` as one Arrow batch of [`index_schema`].
pub fn to_batch(rows: &[ArtifactRow], schema: SchemaRef) -> Result<RecordBatch, ArtifactError> {
    let text = |f: fn(&ArtifactRow) -> &str| -> ArrayRef {
        Arc::new(StringArray::from_iter_values(rows.iter().map(f)))
    };
    let columns: Vec<ArrayRef> = vec![
        text(|r| &r.bundle_id),
        text(|r| &r.path),
        text(|r| &r.mission_id),
        text(|r| &r.task_id),
        text(|r| &r.attempt_key),
        Arc::new(BooleanArray::from_iter(
            rows.iter().map(|r| Some(r.accepted)),
        )),
        text(|r| &r.mime),
        Arc::new(Int64Array::from_iter_values(
            rows.iter()
                .map(|r| i64::try_from(r.size).unwrap_or(i64::MAX)),
        )),
        text(|r| &r.blake3),
        text(|r| &r.sha256),
        text(|r| &r.object_key),
    ];
    RecordBatch::try_new(schema, columns).map_err(|e| ArtifactError::Export(e.to_string()))
}

/// What an export wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Exported {
    /// The file written.
    pub path: PathBuf,
    /// Rows in it.
    pub rows: usize,
    /// Its size in bytes.
    pub bytes: u64,
    /// [`INDEX_SCHEMA`].
    pub schema: &'static str,
}

/// Writes `rows` to `DIR/artifacts.parquet` (created, or replaced atomically: a reader never
/// sees half a file). `dir` is created if missing; it must not be a symlink.
pub fn write_parquet(rows: &[ArtifactRow], dir: &Path) -> Result<Exported, ArtifactError> {
    let io = |what: &str, e: std::io::Error| {
        ArtifactError::Export(format!("{what} {}: {e}", dir.display()))
    };
    std::fs::create_dir_all(dir).map_err(|e| io("creating", e))?;
    let meta = std::fs::symlink_metadata(dir).map_err(|e| io("reading", e))?;
    if !meta.is_dir() {
        return Err(ArtifactError::Invalid(format!(
            "export directory {} is not a directory (symlinks are refused)",
            dir.display()
        )));
    }
    let target = dir.join(PARQUET_FILE);
    let mut tmp = tempfile::Builder::new()
        .prefix(".artifacts.parquet.")
        .tempfile_in(dir)
        .map_err(|e| io("creating a temporary file in", e))?;
    let schema = index_schema();
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_key_value_metadata(Some(vec![KeyValue::new(
            SCHEMA_KEY.to_owned(),
            INDEX_SCHEMA.to_owned(),
        )]))
        .build();
    let parquet_err = |e: parquet::errors::ParquetError| ArtifactError::Export(e.to_string());
    {
        let mut writer = ArrowWriter::try_new(tmp.as_file_mut(), schema.clone(), Some(props))
            .map_err(parquet_err)?;
        for chunk in rows.chunks(ROW_GROUP_ROWS) {
            writer
                .write(&to_batch(chunk, schema.clone())?)
                .map_err(parquet_err)?;
        }
        writer.close().map_err(parquet_err)?;
    }
    tmp.as_file_mut()
        .flush()
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(|e| io("syncing the export in", e))?;
    let bytes = tmp.as_file().metadata().map(|m| m.len()).unwrap_or(0);
    tmp.persist(&target)
        .map_err(|e| io("replacing the export in", e.error))?;
    Ok(Exported {
        path: target,
        rows: rows.len(),
        bytes,
        schema: INDEX_SCHEMA,
    })
}

/// Reads an exported file back, checking its schema version and every column's type.
pub fn read_parquet(path: &Path) -> Result<Vec<ArtifactRow>, ArtifactError> {
    let file = File::open(path)
        .map_err(|e| ArtifactError::Export(format!("opening {}: {e}", path.display())))?;
    let parquet_err = |e: parquet::errors::ParquetError| ArtifactError::Export(e.to_string());
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(parquet_err)?;
    let version = builder
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .and_then(|kv| kv.iter().find(|k| k.key == SCHEMA_KEY))
        .and_then(|k| k.value.clone());
    if version.as_deref() != Some(INDEX_SCHEMA) {
        return Err(ArtifactError::Corrupt(format!(
            "{} carries schema {version:?}, expected {INDEX_SCHEMA}",
            path.display()
        )));
    }
    let mut rows = Vec::new();
    for batch in builder.build().map_err(parquet_err)? {
        let batch = batch.map_err(|e| ArtifactError::Export(e.to_string()))?;
        rows.extend(from_batch(&batch)?);
    }
    Ok(rows)
}

/// Index rows from a batch of [`index_schema`] (by column name, so a reader that reordered
/// columns still reads right).
pub fn from_batch(batch: &RecordBatch) -> Result<Vec<ArtifactRow>, ArtifactError> {
    fn column<'a, T: 'static>(batch: &'a RecordBatch, name: &str) -> Result<&'a T, ArtifactError> {
        let array = batch
            .column_by_name(name)
            .ok_or_else(|| ArtifactError::Corrupt(format!("index column `{name}` is missing")))?;
        if array.null_count() > 0 {
            return Err(ArtifactError::Corrupt(format!(
                "index column `{name}` has nulls"
            )));
        }
        array.as_any().downcast_ref::<T>().ok_or_else(|| {
            ArtifactError::Corrupt(format!("index column `{name}` has the wrong type"))
        })
    }
    let text = |name| column::<StringArray>(batch, name);
    let (bundle, path, mission, task, attempt) = (
        text("bundle_id")?,
        text("path")?,
        text("mission_id")?,
        text("task_id")?,
        text("attempt_key")?,
    );
    let accepted = column::<BooleanArray>(batch, "accepted")?;
    let mime = text("mime")?;
    let size = column::<Int64Array>(batch, "size")?;
    let (b3, sha, key) = (text("blake3")?, text("sha256")?, text("object_key")?);
    (0..batch.num_rows())
        .map(|i| {
            Ok(ArtifactRow {
                bundle_id: bundle.value(i).to_owned(),
                path: path.value(i).to_owned(),
                mission_id: mission.value(i).to_owned(),
                task_id: task.value(i).to_owned(),
                attempt_key: attempt.value(i).to_owned(),
                accepted: accepted.value(i),
                mime: mime.value(i).to_owned(),
                size: u64::try_from(size.value(i))
                    .map_err(|_| ArtifactError::Corrupt(format!("negative size in row {i}")))?,
                blake3: b3.value(i).to_owned(),
                sha256: sha.value(i).to_owned(),
                object_key: key.value(i).to_owned(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(n: usize) -> ArtifactRow {
        ArtifactRow {
            bundle_id: format!("bd-{}", n / 3),
            path: format!("logs/ünïcode-{n}.txt"),
            mission_id: "m-1".into(),
            task_id: "t".into(),
            attempt_key: format!("m-1/t/{}", n / 3),
            accepted: n.is_multiple_of(2),
            mime: "text/plain".into(),
            size: (n as u64) << 33,
            blake3: format!("{n:064x}"),
            sha256: format!("{:064x}", n + 1),
            object_key: format!("cas/blake3/00/{n:064x}"),
        }
    }

    #[test]
    fn every_row_reads_back_equal_across_row_groups() {
        let dir = tempfile::tempdir().unwrap();
        let rows: Vec<ArtifactRow> = (0..ROW_GROUP_ROWS + 7).map(row).collect();
        let exported = write_parquet(&rows, dir.path()).unwrap();
        assert_eq!(exported.rows, rows.len());
        assert_eq!(read_parquet(&exported.path).unwrap(), rows);
        // An empty index is an empty, readable file, not an error.
        let exported = write_parquet(&[], dir.path()).unwrap();
        assert!(read_parquet(&exported.path).unwrap().is_empty());
        // Only the export is left: no temporary files.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_file_without_the_schema_version_or_not_parquet_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("other.parquet");
        let batch = to_batch(&[row(1)], index_schema()).unwrap();
        let mut writer =
            ArrowWriter::try_new(File::create(&path).unwrap(), index_schema(), None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        assert!(matches!(
            read_parquet(&path),
            Err(ArtifactError::Corrupt(m)) if m.contains("schema")
        ));
        std::fs::write(&path, b"PAR1 not really").unwrap();
        assert!(matches!(read_parquet(&path), Err(ArtifactError::Export(_))));
    }

    #[test]
    fn a_symlinked_or_file_target_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(matches!(
            write_parquet(&[row(0)], &link),
            Err(ArtifactError::Invalid(_))
        ));
        assert_eq!(std::fs::read_dir(&real).unwrap().count(), 0);
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(write_parquet(&[row(0)], &file).is_err());
    }
}
