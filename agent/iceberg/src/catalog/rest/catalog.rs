//! An Iceberg [`Catalog`] over a [`RestSession`]: the wire types come from
//! iceberg-catalog-rest, the requests go through our session so that tokens are
//! renewed, errors say what to do and tables get their vended storage credentials.

use std::collections::HashMap;

use async_trait::async_trait;
use iceberg::Runtime;
use iceberg::table::Table;
use iceberg::{
    Catalog, Error, ErrorKind, Namespace, NamespaceIdent, Result, TableCommit, TableCreation,
    TableIdent,
};
use iceberg_catalog_rest::{
    CommitTableRequest, CommitTableResponse, CreateNamespaceRequest, CreateTableRequest,
    ListNamespaceResponse, ListTablesResponse, LoadTableResult, NamespaceResponse,
    RegisterTableRequest, RenameTableRequest,
};

use reqwest::Method;
use serde_json::Value;

/// Pages of one listing before it is given up on (a catalog that never stops paging).
const MAX_PAGES: usize = 10_000;
/// A namespace or table creation is tried 6 times while the catalog fails transiently.
const CREATE_RETRY: Policy = Policy::backoff(
    std::time::Duration::from_millis(500),
    std::time::Duration::from_secs(15),
)
.attempts(6);

use super::config::S3Settings;
use super::session::{RestSession, encode, namespace_path};
use super::storage::table_file_io;
use crate::retry::{Policy, retry};

// upstream: REST catalog client (iceberg-catalog-rest 0.10 has no token refresh, no SigV4
// signing and no vended-credential renewal; only its wire types are used here; delete
// when it has them)
/// A REST catalog. Every table it returns writes with the storage credentials in use
/// (vended, renewed before they expire; or the agent's own).
#[derive(Debug)]
pub struct RestCatalog {
    session: RestSession,
    s3: S3Settings,
    /// Where tables spawn their I/O tasks (the runtime that opened the catalog).
    runtime: Runtime,
}

impl RestCatalog {
    /// A catalog over an open session; call it inside the tokio runtime tables will use.
    pub fn new(session: RestSession, s3: S3Settings) -> RestCatalog {
        RestCatalog {
            session,
            s3,
            runtime: Runtime::current(),
        }
    }

    /// The session, for requests the `Catalog` trait has no method for.
    pub fn session(&self) -> &RestSession {
        &self.session
    }

    /// Path of a table's endpoint, relative to `{uri}/v1/{prefix}/`.
    pub(crate) fn table_path(ident: &TableIdent) -> String {
        format!(
            "namespaces/{}/tables/{}",
            namespace_path(ident.namespace().as_ref()),
            encode(ident.name())
        )
    }

    fn to_table(&self, ident: &TableIdent, loaded: LoadTableResult) -> Result<Table> {
        let location = loaded.metadata.location().to_string();
        let file_io = table_file_io(
            &self.session,
            &self.s3,
            &Self::table_path(ident),
            &location,
            &loaded.config,
            loaded.storage_credentials.as_deref().unwrap_or_default(),
        )
        .map_err(|e| e.into_iceberg(ErrorKind::Unexpected))?;
        let mut builder = Table::builder()
            .identifier(ident.clone())
            .metadata(loaded.metadata)
            .file_io(file_io)
            .runtime(self.runtime.clone());
        if let Some(l) = loaded.metadata_location {
            builder = builder.metadata_location(l);
        }
        builder.build()
    }

    async fn json<T: serde::de::DeserializeOwned>(
        &self,
        operation: String,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<Value>,
        not_found: ErrorKind,
    ) -> Result<T> {
        self.session
            .call_as(&operation, method, path, query, body.as_ref())
            .await
            .map_err(|e| e.into_iceberg(not_found))
    }

    /// Every item of a paged listing (`GET path` with `fixed` query parameters), page by
    /// page while the catalog returns a next-page token ([`Pages`]).
    async fn list_all<R: serde::de::DeserializeOwned, T>(
        &self,
        operation: String,
        path: &str,
        fixed: &[(&str, &str)],
        items: impl Fn(R) -> (Vec<T>, Option<String>),
    ) -> Result<Vec<T>> {
        let mut out = Vec::new();
        let mut page: Option<String> = None;
        let mut pages = Pages::default();
        loop {
            let mut query = fixed.to_vec();
            if let Some(t) = &page {
                query.push(("pageToken", t.as_str()));
            }
            let answer: R = self
                .json(
                    operation.clone(),
                    Method::GET,
                    path,
                    &query,
                    None,
                    ErrorKind::NamespaceNotFound,
                )
                .await?;
            let (found, next) = items(answer);
            out.extend(found);
            match pages.next(&operation, next)? {
                Some(t) => page = Some(t),
                None => return Ok(out),
            }
        }
    }

    async fn no_content(
        &self,
        operation: String,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<Value>,
        not_found: ErrorKind,
    ) -> Result<()> {
        self.session
            .call(&operation, method, path, query, body.as_ref())
            .await
            .map(|_| ())
            .map_err(|e| e.into_iceberg(not_found))
    }

    /// A creation request, sent again with backoff while the catalog fails transiently
    /// (a creation that landed before its answer was lost then answers 409).
    async fn create<T: serde::de::DeserializeOwned>(
        &self,
        operation: &str,
        path: &str,
        body: Option<Value>,
    ) -> std::result::Result<T, super::RestError> {
        retry(
            CREATE_RETRY,
            || {
                self.session
                    .call_as(operation, Method::POST, path, &[], body.as_ref())
            },
            super::RestError::class,
            |e, attempt, wait| tracing::warn!(%operation, attempt, error = %e, wait_ms = wait.as_millis() as u64, "catalog failed transiently: retrying"),
        )
        .await
    }

    async fn exists(&self, operation: String, path: &str) -> Result<bool> {
        match self
            .session
            .call(&operation, Method::HEAD, path, &[], None)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.status() == Some(404) => Ok(false),
            Err(e) => Err(e.into_iceberg(ErrorKind::Unexpected)),
        }
    }
}

/// A 409 on a creation means another client created it first.
fn already_exists(e: super::RestError, kind: ErrorKind) -> Error {
    if e.status() == Some(409) {
        Error::new(kind, e.to_string())
    } else {
        e.into_iceberg(ErrorKind::NamespaceNotFound)
    }
}

/// Page tokens of one listing: a token seen twice would loop forever.
#[derive(Default)]
struct Pages {
    seen: std::collections::HashSet<String>,
}

impl Pages {
    /// The token of the next page, `None` at the end; an error on a repeated token or
    /// past [`MAX_PAGES`].
    fn next(&mut self, operation: &str, token: Option<String>) -> Result<Option<String>> {
        let Some(token) = token.filter(|t| !t.is_empty()) else {
            return Ok(None);
        };
        if self.seen.len() >= MAX_PAGES || !self.seen.insert(token.clone()) {
            return Err(Error::new(
                ErrorKind::Unexpected,
                format!(
                    "{operation}: the catalog returned page token {token:?} again (or more than \
                     {MAX_PAGES} pages); stopping instead of looping forever"
                ),
            ));
        }
        Ok(Some(token))
    }
}

fn body(value: impl serde::Serialize) -> Result<Option<Value>> {
    serde_json::to_value(value).map(Some).map_err(|e| {
        Error::new(
            ErrorKind::DataInvalid,
            format!("cannot encode request: {e}"),
        )
    })
}

#[async_trait]
impl Catalog for RestCatalog {
    async fn list_namespaces(
        &self,
        parent: Option<&NamespaceIdent>,
    ) -> Result<Vec<NamespaceIdent>> {
        let parent_arg = parent.map(|p| p.as_ref().join("\u{1f}"));
        let fixed: Vec<(&str, &str)> = parent_arg.iter().map(|p| ("parent", p.as_str())).collect();
        self.list_all(
            "list namespaces".into(),
            "namespaces",
            &fixed,
            |r: ListNamespaceResponse| (r.namespaces, r.next_page_token),
        )
        .await
    }

    async fn create_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> Result<Namespace> {
        let request = CreateNamespaceRequest {
            namespace: namespace.clone(),
            properties,
        };
        let operation = format!("create namespace {}", namespace.to_url_string());
        let answer: NamespaceResponse = self
            .create(&operation, "namespaces", body(request)?)
            .await
            .map_err(|e| already_exists(e, ErrorKind::NamespaceAlreadyExists))?;
        Ok(Namespace::with_properties(
            answer.namespace,
            answer.properties,
        ))
    }

    async fn get_namespace(&self, namespace: &NamespaceIdent) -> Result<Namespace> {
        let answer: NamespaceResponse = self
            .json(
                format!("get namespace {}", namespace.to_url_string()),
                Method::GET,
                &format!("namespaces/{}", namespace_path(namespace.as_ref())),
                &[],
                None,
                ErrorKind::NamespaceNotFound,
            )
            .await?;
        Ok(Namespace::with_properties(
            answer.namespace,
            answer.properties,
        ))
    }

    async fn namespace_exists(&self, namespace: &NamespaceIdent) -> Result<bool> {
        self.exists(
            format!("check namespace {}", namespace.to_url_string()),
            &format!("namespaces/{}", namespace_path(namespace.as_ref())),
        )
        .await
    }

    async fn update_namespace(
        &self,
        namespace: &NamespaceIdent,
        properties: HashMap<String, String>,
    ) -> Result<()> {
        self.no_content(
            format!("update namespace {}", namespace.to_url_string()),
            Method::POST,
            &format!(
                "namespaces/{}/properties",
                namespace_path(namespace.as_ref())
            ),
            &[],
            Some(serde_json::json!({ "removals": [], "updates": properties })),
            ErrorKind::NamespaceNotFound,
        )
        .await
    }

    async fn drop_namespace(&self, namespace: &NamespaceIdent) -> Result<()> {
        self.no_content(
            format!("drop namespace {}", namespace.to_url_string()),
            Method::DELETE,
            &format!("namespaces/{}", namespace_path(namespace.as_ref())),
            &[],
            None,
            ErrorKind::NamespaceNotFound,
        )
        .await
    }

    async fn list_tables(&self, namespace: &NamespaceIdent) -> Result<Vec<TableIdent>> {
        let path = format!("namespaces/{}/tables", namespace_path(namespace.as_ref()));
        let operation = format!("list tables of {}", namespace.to_url_string());
        self.list_all(operation, &path, &[], |r: ListTablesResponse| {
            (r.identifiers, r.next_page_token)
        })
        .await
    }

    async fn create_table(
        &self,
        namespace: &NamespaceIdent,
        creation: TableCreation,
    ) -> Result<Table> {
        let ident = TableIdent::new(namespace.clone(), creation.name.clone());
        let request = CreateTableRequest {
            name: creation.name,
            location: creation.location,
            schema: creation.schema,
            partition_spec: creation.partition_spec,
            write_order: creation.sort_order,
            stage_create: None,
            properties: creation.properties,
        };
        let _: LoadTableResult = self
            .create(
                &format!("create table {ident}"),
                &format!("namespaces/{}/tables", namespace_path(namespace.as_ref())),
                body(request)?,
            )
            .await
            .map_err(|e| already_exists(e, ErrorKind::TableAlreadyExists))?;
        // Catalogs may vend storage credentials on load only: load the new table.
        self.load_table(&ident).await
    }

    async fn load_table(&self, table: &TableIdent) -> Result<Table> {
        let loaded: LoadTableResult = self
            .json(
                format!("load table {table}"),
                Method::GET,
                &Self::table_path(table),
                &[],
                None,
                ErrorKind::TableNotFound,
            )
            .await?;
        self.to_table(table, loaded)
    }

    async fn drop_table(&self, table: &TableIdent) -> Result<()> {
        self.no_content(
            format!("drop table {table}"),
            Method::DELETE,
            &Self::table_path(table),
            &[],
            None,
            ErrorKind::TableNotFound,
        )
        .await
    }

    async fn purge_table(&self, table: &TableIdent) -> Result<()> {
        self.no_content(
            format!("purge table {table}"),
            Method::DELETE,
            &Self::table_path(table),
            &[("purgeRequested", "true")],
            None,
            ErrorKind::TableNotFound,
        )
        .await
    }

    async fn table_exists(&self, table: &TableIdent) -> Result<bool> {
        self.exists(format!("check table {table}"), &Self::table_path(table))
            .await
    }

    async fn rename_table(&self, src: &TableIdent, dest: &TableIdent) -> Result<()> {
        let request = RenameTableRequest {
            source: src.clone(),
            destination: dest.clone(),
        };
        self.no_content(
            format!("rename table {src} to {dest}"),
            Method::POST,
            "tables/rename",
            &[],
            body(request)?,
            ErrorKind::TableNotFound,
        )
        .await
    }

    async fn register_table(&self, table: &TableIdent, metadata_location: String) -> Result<Table> {
        let request = RegisterTableRequest {
            name: table.name().to_string(),
            metadata_location,
            overwrite: None,
        };
        let loaded: LoadTableResult = self
            .json(
                format!("register table {table}"),
                Method::POST,
                &format!(
                    "namespaces/{}/register",
                    namespace_path(table.namespace().as_ref())
                ),
                &[],
                body(request)?,
                ErrorKind::NamespaceNotFound,
            )
            .await?;
        self.to_table(table, loaded)
    }

    async fn update_table(&self, mut commit: TableCommit) -> Result<Table> {
        let ident = commit.identifier().clone();
        let request = CommitTableRequest {
            identifier: Some(ident.clone()),
            requirements: commit.take_requirements(),
            updates: commit.take_updates(),
        };
        let answer: CommitTableResponse = self
            .json(
                format!("commit to table {ident}"),
                Method::POST,
                &Self::table_path(&ident),
                &[],
                body(request)?,
                ErrorKind::TableNotFound,
            )
            .await?;
        // A commit answer carries no storage credentials: load the table again for them.
        let loaded = self.load_table(&ident).await?;
        if loaded.metadata_location() != Some(answer.metadata_location.as_str()) {
            tracing::debug!(table = %ident, "table moved on after our commit");
        }
        Ok(loaded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_page_token_ends_the_listing_with_an_error() {
        let mut pages = Pages::default();
        assert_eq!(
            pages.next("list", Some("a".into())).unwrap(),
            Some("a".into())
        );
        assert_eq!(
            pages.next("list", Some("b".into())).unwrap(),
            Some("b".into())
        );
        let e = pages.next("list", Some("a".into())).unwrap_err();
        assert!(e.to_string().contains("again"), "{e}");
        assert_eq!(
            Pages::default().next("list", Some(String::new())).unwrap(),
            None
        );
        assert_eq!(Pages::default().next("list", None).unwrap(), None);
    }

    #[test]
    fn a_conflict_on_creation_means_it_exists() {
        let conflict = super::super::RestError::Status {
            status: 409,
            operation: "create table a.b".into(),
            message: "Table already exists".into(),
        };
        assert_eq!(
            already_exists(conflict, ErrorKind::TableAlreadyExists).kind(),
            ErrorKind::TableAlreadyExists
        );
        let unavailable = super::super::RestError::Status {
            status: 503,
            operation: "create table a.b".into(),
            message: String::new(),
        };
        let e = already_exists(unavailable, ErrorKind::TableAlreadyExists);
        assert!(e.retryable(), "a 503 is transient");
        assert_eq!(
            crate::error::iceberg_class(&e),
            crate::error::ErrorClass::Transient
        );
    }
}
