//! Fencing: every commit attempt first checks that this pipeline's stored offsets are
//! still the ones the buffered records start from.
//!
//! iceberg-rust's `Transaction::commit` reloads the table and re-applies its actions on a
//! conflict, without a hook for the caller to re-validate. This wrapper sits between the
//! transaction and the real catalog, so the check runs on every attempt, right before the
//! catalog's own compare-and-swap. The append's `assert-ref-snapshot-id` requirement makes
//! the check and the swap see the same snapshot, so a zombie or a second instance of the
//! pipeline can never commit records that another commit already covered.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use iceberg::table::Table;
use iceberg::{
    Catalog, Error, ErrorKind, Namespace, NamespaceIdent, Result, TableCommit, TableCreation,
    TableIdent,
};

use crate::offsets::OffsetMap;

/// What the table must hold for the pending commit to be valid.
#[derive(Debug, Clone)]
pub struct Expectation {
    /// The pipeline whose offsets are checked.
    pub pipeline: String,
    /// The table being committed to.
    pub table: TableIdent,
    /// The offsets the table must currently store for the pipeline.
    pub stored: OffsetMap,
}

/// A catalog that refuses commits whose offsets were overtaken. See the module docs.
#[derive(Debug)]
pub struct FencedCatalog {
    inner: std::sync::Arc<dyn Catalog>,
    expectation: Mutex<Option<Expectation>>,
}

/// Message prefix of a fencing refusal.
pub const FENCED: &str = "fenced:";

impl FencedCatalog {
    /// Wraps a catalog.
    pub fn new(inner: std::sync::Arc<dyn Catalog>) -> Self {
        FencedCatalog {
            inner,
            expectation: Mutex::new(None),
        }
    }

    /// Sets (or clears) the expectation checked by the next commits.
    pub fn expect(&self, expectation: Option<Expectation>) {
        *self.expectation.lock().expect("fence lock") = expectation;
    }

    async fn check(&self, ident: &TableIdent) -> Result<()> {
        let expectation = self.expectation.lock().expect("fence lock").clone();
        let Some(exp) = expectation.filter(|e| &e.table == ident) else {
            return Ok(());
        };
        let table = self.inner.load_table(ident).await?;
        let stored = OffsetMap::from_table(table.metadata(), &exp.pipeline)
            .map_err(|e| Error::new(ErrorKind::DataInvalid, e.to_string()))?;
        if stored != exp.stored {
            return Err(Error::new(
                ErrorKind::DataInvalid,
                format!(
                    "{FENCED} another writer committed offsets of pipeline {:?} to {ident} (table has {}, this writer expected {})",
                    exp.pipeline,
                    stored.to_summary_value(),
                    exp.stored.to_summary_value()
                ),
            ));
        }
        Ok(())
    }
}

/// Whether an error is a fencing refusal.
pub fn is_fenced(e: &Error) -> bool {
    e.message().starts_with(FENCED)
}

#[async_trait]
impl Catalog for FencedCatalog {
    async fn list_namespaces(
        &self,
        parent: Option<&NamespaceIdent>,
    ) -> Result<Vec<NamespaceIdent>> {
        self.inner.list_namespaces(parent).await
    }
    async fn create_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> Result<Namespace> {
        self.inner.create_namespace(namespace, properties).await
    }
    async fn get_namespace(&self, namespace: &NamespaceIdent) -> Result<Namespace> {
        self.inner.get_namespace(namespace).await
    }
    async fn namespace_exists(&self, namespace: &NamespaceIdent) -> Result<bool> {
        self.inner.namespace_exists(namespace).await
    }
    async fn update_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> Result<()> {
        self.inner.update_namespace(namespace, properties).await
    }
    async fn drop_namespace(&self, namespace: &NamespaceIdent) -> Result<()> {
        self.inner.drop_namespace(namespace).await
    }
    async fn list_tables(&self, namespace: &NamespaceIdent) -> Result<Vec<TableIdent>> {
        self.inner.list_tables(namespace).await
    }
    async fn create_table(
        &self,
        namespace: &NamespaceIdent,
        creation: TableCreation,
    ) -> Result<Table> {
        self.inner.create_table(namespace, creation).await
    }
    async fn load_table(&self, table: &TableIdent) -> Result<Table> {
        self.inner.load_table(table).await
    }
    async fn drop_table(&self, table: &TableIdent) -> Result<()> {
        self.inner.drop_table(table).await
    }
    async fn purge_table(&self, table: &TableIdent) -> Result<()> {
        self.inner.purge_table(table).await
    }
    async fn table_exists(&self, table: &TableIdent) -> Result<bool> {
        self.inner.table_exists(table).await
    }
    async fn rename_table(&self, src: &TableIdent, dest: &TableIdent) -> Result<()> {
        self.inner.rename_table(src, dest).await
    }
    async fn register_table(&self, table: &TableIdent, metadata_location: String) -> Result<Table> {
        self.inner.register_table(table, metadata_location).await
    }
    async fn update_table(&self, commit: TableCommit) -> Result<Table> {
        self.check(commit.identifier()).await?;
        self.inner.update_table(commit).await
    }
}
