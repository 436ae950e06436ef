//! A time limit on every catalog call.
//!
//! A catalog call that never finishes holds whatever it holds for ever: the embedded
//! catalog's SQLite pool has one connection, so one stuck call (a lock another process
//! never releases, a connection lost to a cancelled call) stops every later call of the
//! agent, and a stopping pipeline waits on it. Past the limit the call is abandoned
//! (dropping it returns its connection) and reported as a transient error, which the
//! caller retries like any outage.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use iceberg::table::Table;
use iceberg::{
    Catalog, Error, ErrorKind, Namespace, NamespaceIdent, Result, TableCommit, TableCreation,
    TableIdent,
};

/// How long one catalog call may take before it is abandoned.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// A catalog whose calls are abandoned past a time limit.
#[derive(Debug)]
pub struct Timed {
    inner: Arc<dyn Catalog>,
    limit: Duration,
    what: String,
}

impl Timed {
    /// Wraps `inner` (named `what` in errors) with `limit` per call.
    pub fn new(inner: Arc<dyn Catalog>, what: &str, limit: Duration) -> Timed {
        Timed {
            inner,
            limit,
            what: what.to_string(),
        }
    }

    async fn limited<T>(&self, op: &str, call: impl Future<Output = Result<T>>) -> Result<T> {
        match tokio::time::timeout(self.limit, call).await {
            Ok(result) => result,
            Err(_) => {
                tracing::warn!(catalog = %self.what, op, limit_s = self.limit.as_secs(), "catalog call abandoned: it did not finish in time");
                Err(Error::new(
                    ErrorKind::Unexpected,
                    format!(
                        "{}: {op} did not finish within {}s (abandoned; retried)",
                        self.what,
                        self.limit.as_secs()
                    ),
                )
                .with_retryable(true))
            }
        }
    }
}

#[async_trait]
impl Catalog for Timed {
    async fn list_namespaces(
        &self,
        parent: Option<&NamespaceIdent>,
    ) -> Result<Vec<NamespaceIdent>> {
        self.limited("list namespaces", self.inner.list_namespaces(parent))
            .await
    }

    async fn create_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> Result<Namespace> {
        self.limited(
            "create namespace",
            self.inner.create_namespace(namespace, properties),
        )
        .await
    }

    async fn get_namespace(&self, namespace: &NamespaceIdent) -> Result<Namespace> {
        self.limited("get namespace", self.inner.get_namespace(namespace))
            .await
    }

    async fn namespace_exists(&self, namespace: &NamespaceIdent) -> Result<bool> {
        self.limited("check namespace", self.inner.namespace_exists(namespace))
            .await
    }

    async fn update_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> Result<()> {
        self.limited(
            "update namespace",
            self.inner.update_namespace(namespace, properties),
        )
        .await
    }

    async fn drop_namespace(&self, namespace: &NamespaceIdent) -> Result<()> {
        self.limited("drop namespace", self.inner.drop_namespace(namespace))
            .await
    }

    async fn list_tables(&self, namespace: &NamespaceIdent) -> Result<Vec<TableIdent>> {
        self.limited("list tables", self.inner.list_tables(namespace))
            .await
    }

    async fn create_table(
        &self,
        namespace: &NamespaceIdent,
        creation: TableCreation,
    ) -> Result<Table> {
        self.limited("create table", self.inner.create_table(namespace, creation))
            .await
    }

    async fn load_table(&self, table: &TableIdent) -> Result<Table> {
        self.limited("load table", self.inner.load_table(table))
            .await
    }

    async fn drop_table(&self, table: &TableIdent) -> Result<()> {
        self.limited("drop table", self.inner.drop_table(table))
            .await
    }

    async fn purge_table(&self, table: &TableIdent) -> Result<()> {
        self.limited("purge table", self.inner.purge_table(table))
            .await
    }

    async fn table_exists(&self, table: &TableIdent) -> Result<bool> {
        self.limited("check table", self.inner.table_exists(table))
            .await
    }

    async fn rename_table(&self, src: &TableIdent, dest: &TableIdent) -> Result<()> {
        self.limited("rename table", self.inner.rename_table(src, dest))
            .await
    }

    async fn register_table(&self, table: &TableIdent, metadata_location: String) -> Result<Table> {
        self.limited(
            "register table",
            self.inner.register_table(table, metadata_location),
        )
        .await
    }

    async fn update_table(&self, commit: TableCommit) -> Result<Table> {
        self.limited("update table", self.inner.update_table(commit))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A catalog whose table loads never finish (a call holding the only connection).
    #[derive(Debug)]
    struct Stuck;

    #[async_trait]
    impl Catalog for Stuck {
        async fn list_namespaces(&self, _: Option<&NamespaceIdent>) -> Result<Vec<NamespaceIdent>> {
            Ok(Vec::new())
        }
        async fn create_namespace(
            &self,
            _: &NamespaceIdent,
            _: HashMap<String, String>,
        ) -> Result<Namespace> {
            unimplemented!()
        }
        async fn get_namespace(&self, _: &NamespaceIdent) -> Result<Namespace> {
            unimplemented!()
        }
        async fn namespace_exists(&self, _: &NamespaceIdent) -> Result<bool> {
            unimplemented!()
        }
        async fn update_namespace(
            &self,
            _: &NamespaceIdent,
            _: HashMap<String, String>,
        ) -> Result<()> {
            unimplemented!()
        }
        async fn drop_namespace(&self, _: &NamespaceIdent) -> Result<()> {
            unimplemented!()
        }
        async fn list_tables(&self, _: &NamespaceIdent) -> Result<Vec<TableIdent>> {
            unimplemented!()
        }
        async fn create_table(&self, _: &NamespaceIdent, _: TableCreation) -> Result<Table> {
            unimplemented!()
        }
        async fn load_table(&self, _: &TableIdent) -> Result<Table> {
            std::future::pending().await
        }
        async fn drop_table(&self, _: &TableIdent) -> Result<()> {
            unimplemented!()
        }
        async fn purge_table(&self, _: &TableIdent) -> Result<()> {
            unimplemented!()
        }
        async fn table_exists(&self, _: &TableIdent) -> Result<bool> {
            unimplemented!()
        }
        async fn rename_table(&self, _: &TableIdent, _: &TableIdent) -> Result<()> {
            unimplemented!()
        }
        async fn register_table(&self, _: &TableIdent, _: String) -> Result<Table> {
            unimplemented!()
        }
        async fn update_table(&self, _: TableCommit) -> Result<Table> {
            unimplemented!()
        }
    }

    #[tokio::test]
    async fn a_call_that_never_finishes_is_abandoned_as_transient() {
        let timed = Timed::new(
            Arc::new(Stuck),
            "catalog \"local\"",
            Duration::from_millis(200),
        );
        let started = std::time::Instant::now();
        let e = timed
            .load_table(&TableIdent::from_strs(["ns", "t"]).unwrap())
            .await
            .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(e.to_string().contains("did not finish within"), "{e}");
        assert_eq!(
            crate::error::iceberg_class(&e),
            crate::error::ErrorClass::Transient
        );
    }
}
