//! The index as an Apache Iceberg table (cargo feature `iceberg`): `berth.artifacts`, kept by
//! the Iceberg SQL catalog in the store's own SQLite database, its data and metadata files under
//! a local warehouse directory. Append-only: [`IcebergIndex::sync`] appends the rows of every
//! bundle that is INDEXED in the store and not yet in the table, one snapshot per sync, and
//! names the bundles it added in the snapshot's summary (`berth.bundles`) — that is how the next
//! sync knows what the table already holds, so a crash anywhere repeats harmlessly:
//!
//! - before the commit: an unreferenced data file is left (Iceberg ignores files no snapshot
//!   names; its name is derived from the bundles, so the retry rewrites the same file);
//! - after the commit: the bundles are in a snapshot summary and are not appended again.
//!
//! Syncs from several processes are serialized by an exclusive lock on a file in the warehouse
//! (Iceberg's own commit retry would re-apply the same append to a table another sync already
//! extended).

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use berth_store::{ArtifactQuery, ArtifactRow, ArtifactStore, PublicationState};
use futures::TryStreamExt;
use iceberg::io::LocalFsStorageFactory;
use iceberg::spec::{DataFileFormat, NestedField, PrimitiveType, Schema, Type};
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use iceberg::{Catalog, CatalogBuilder, NamespaceIdent, TableCreation, TableIdent};
use iceberg_catalog_sql::{SqlBindStyle, SqlCatalog, SqlCatalogBuilder};
use parquet::file::properties::WriterProperties;

use crate::export::{from_batch, to_batch, INDEX_SCHEMA, SCHEMA_KEY};
use crate::ArtifactError;

/// The catalog's name (rows in the store's `iceberg_tables` carry it).
pub const CATALOG_NAME: &str = "berth";
/// The table's namespace and name.
pub const NAMESPACE: &str = "berth";
/// The table.
pub const TABLE: &str = "artifacts";
/// The snapshot summary key naming the bundles a snapshot appended (comma-separated).
pub const BUNDLES_KEY: &str = "berth.bundles";

fn iceberg_err(e: iceberg::Error) -> ArtifactError {
    ArtifactError::Export(format!("iceberg: {e}"))
}

/// The Iceberg schema of the index, field for field [`crate::export::index_schema`].
fn table_schema() -> Result<Schema, ArtifactError> {
    let names = [
        ("bundle_id", PrimitiveType::String),
        ("path", PrimitiveType::String),
        ("mission_id", PrimitiveType::String),
        ("task_id", PrimitiveType::String),
        ("attempt_key", PrimitiveType::String),
        ("accepted", PrimitiveType::Boolean),
        ("mime", PrimitiveType::String),
        ("size", PrimitiveType::Long),
        ("blake3", PrimitiveType::String),
        ("sha256", PrimitiveType::String),
        ("object_key", PrimitiveType::String),
    ];
    Schema::builder()
        .with_fields(names.into_iter().zip(1..).map(|((name, kind), id)| {
            NestedField::required(id, name, Type::Primitive(kind)).into()
        }))
        .build()
        .map_err(iceberg_err)
}

/// The bundles `table`'s snapshots name in their summaries.
fn appended(table: &iceberg::table::Table) -> BTreeSet<String> {
    table
        .metadata()
        .snapshots()
        .filter_map(|s| s.summary().additional_properties.get(BUNDLES_KEY))
        .flat_map(|ids| ids.split(',').filter(|id| !id.is_empty()))
        .map(str::to_owned)
        .collect()
}

/// What a sync appended.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Synced {
    /// Bundles appended by this sync.
    pub bundles: Vec<String>,
    /// Rows appended.
    pub rows: usize,
    /// The snapshot committed, if any.
    pub snapshot_id: Option<i64>,
}

/// The Iceberg table of the index.
#[derive(Debug)]
pub struct IcebergIndex {
    catalog: SqlCatalog,
    ident: TableIdent,
    lock_path: PathBuf,
}

impl IcebergIndex {
    /// Opens the catalog in the SQLite database at `database` (the store's) with its warehouse
    /// at `warehouse`, creating the namespace and table if they do not exist.
    pub async fn open(database: &Path, warehouse: &Path) -> Result<IcebergIndex, ArtifactError> {
        std::fs::create_dir_all(warehouse)
            .map_err(|e| ArtifactError::Export(format!("creating {}: {e}", warehouse.display())))?;
        let warehouse = warehouse.canonicalize().map_err(|e| {
            ArtifactError::Export(format!("resolving {}: {e}", warehouse.display()))
        })?;
        let props = HashMap::from([
            (
                iceberg_catalog_sql::SQL_CATALOG_PROP_URI.to_owned(),
                format!("sqlite:{}", database.display()),
            ),
            (
                iceberg_catalog_sql::SQL_CATALOG_PROP_WAREHOUSE.to_owned(),
                format!("file://{}", warehouse.display()),
            ),
            (
                iceberg_catalog_sql::SQL_CATALOG_PROP_BIND_STYLE.to_owned(),
                SqlBindStyle::QMark.to_string(),
            ),
        ]);
        let catalog = SqlCatalogBuilder::default()
            .with_storage_factory(Arc::new(LocalFsStorageFactory))
            .load(CATALOG_NAME, props)
            .await
            .map_err(iceberg_err)?;
        let index = IcebergIndex {
            catalog,
            ident: TableIdent::from_strs([NAMESPACE, TABLE]).map_err(iceberg_err)?,
            lock_path: warehouse.join(".berth-sync.lock"),
        };
        let _lock = index.lock().await?;
        let namespace = NamespaceIdent::new(NAMESPACE.to_owned());
        if !index
            .catalog
            .namespace_exists(&namespace)
            .await
            .map_err(iceberg_err)?
        {
            index
                .catalog
                .create_namespace(&namespace, HashMap::new())
                .await
                .map_err(iceberg_err)?;
        }
        if !index
            .catalog
            .table_exists(&index.ident)
            .await
            .map_err(iceberg_err)?
        {
            let creation = TableCreation::builder()
                .name(TABLE.to_owned())
                .schema(table_schema()?)
                .location(format!(
                    "file://{}",
                    warehouse.join(NAMESPACE).join(TABLE).display()
                ))
                .properties(HashMap::from([(
                    SCHEMA_KEY.to_owned(),
                    INDEX_SCHEMA.to_owned(),
                )]))
                .build();
            index
                .catalog
                .create_table(&namespace, creation)
                .await
                .map_err(iceberg_err)?;
        }
        Ok(index)
    }

    /// An exclusive lock on the warehouse's sync file, released when dropped. Waited for on a
    /// blocking thread: another sync in this process may hold it and must keep running.
    async fn lock(&self) -> Result<std::fs::File, ArtifactError> {
        let path = self.lock_path.clone();
        let failed =
            move |e: std::io::Error| ArtifactError::Export(format!("{}: {e}", path.display()));
        let path = self.lock_path.clone();
        tokio::task::spawn_blocking(move || {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)?;
            file.lock()?;
            Ok(file)
        })
        .await
        .map_err(|e| ArtifactError::Export(format!("waiting for the sync lock: {e}")))?
        .map_err(failed)
    }

    /// The bundles the table's snapshots have appended.
    pub async fn bundles(&self) -> Result<BTreeSet<String>, ArtifactError> {
        Ok(appended(&self.table().await?))
    }

    async fn table(&self) -> Result<iceberg::table::Table, ArtifactError> {
        self.catalog
            .load_table(&self.ident)
            .await
            .map_err(iceberg_err)
    }

    /// Appends the rows of every INDEXED bundle the table does not hold yet (see the module).
    pub async fn sync(&self, store: &dyn ArtifactStore) -> Result<Synced, ArtifactError> {
        let _lock = self.lock().await?;
        let table = self.table().await?;
        let present = appended(&table);
        let mut missing: Vec<String> = store
            .publications(Some(PublicationState::Indexed))
            .await
            .map_err(|e| ArtifactError::Store(e.to_string()))?
            .into_iter()
            .map(|p| p.bundle_id)
            .filter(|id| !present.contains(id))
            .collect();
        missing.sort();
        if missing.is_empty() {
            return Ok(Synced::default());
        }
        let mut rows: Vec<ArtifactRow> = Vec::new();
        for id in &missing {
            rows.extend(
                store
                    .artifacts(&ArtifactQuery {
                        bundle_id: Some(id.clone()),
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| ArtifactError::Store(e.to_string()))?,
            );
        }
        let schema = table.metadata().current_schema().clone();
        let arrow = Arc::new(iceberg::arrow::schema_to_arrow_schema(&schema).map_err(iceberg_err)?);
        // Named after the bundles it holds: a retry after a crash rewrites the same file.
        let name = blake3::hash(missing.join(",").as_bytes()).to_hex()[..32].to_owned();
        let writer =
            DataFileWriterBuilder::new(RollingFileWriterBuilder::new_with_default_file_size(
                ParquetWriterBuilder::new(WriterProperties::default(), schema),
                table.file_io().clone(),
                DefaultLocationGenerator::new(table.metadata()).map_err(iceberg_err)?,
                DefaultFileNameGenerator::new("berth".into(), Some(name), DataFileFormat::Parquet),
            ));
        let mut writer = writer.build(None).await.map_err(iceberg_err)?;
        writer
            .write(to_batch(&rows, arrow)?)
            .await
            .map_err(iceberg_err)?;
        let files = writer.close().await.map_err(iceberg_err)?;
        let tx = Transaction::new(&table);
        let tx = tx
            .fast_append()
            .add_data_files(files)
            .set_snapshot_properties(HashMap::from([(BUNDLES_KEY.to_owned(), missing.join(","))]))
            .apply(tx)
            .map_err(iceberg_err)?;
        let table = tx.commit(&self.catalog).await.map_err(iceberg_err)?;
        Ok(Synced {
            rows: rows.len(),
            bundles: missing,
            snapshot_id: table.metadata().current_snapshot_id(),
        })
    }

    /// Every row of the table, read back through the catalog (a full scan).
    pub async fn rows(&self) -> Result<Vec<ArtifactRow>, ArtifactError> {
        let table = self.table().await?;
        if table.metadata().current_snapshot().is_none() {
            return Ok(Vec::new());
        }
        let batches: Vec<_> = table
            .scan()
            .select_all()
            .build()
            .map_err(iceberg_err)?
            .to_arrow()
            .await
            .map_err(iceberg_err)?
            .try_collect()
            .await
            .map_err(iceberg_err)?;
        let mut rows = Vec::new();
        for batch in &batches {
            rows.extend(from_batch(batch)?);
        }
        Ok(rows)
    }
}
