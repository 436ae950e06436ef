//! Probing a catalog for `floe check`: token, API, namespaces, the table, and a write
//! and delete under its location with the credentials the agent would use.

use std::sync::Arc;

use iceberg::table::Table;
use iceberg::{Catalog, NamespaceIdent, TableIdent};

use floe_iceberg::redact::redact_url;
use floe_iceberg::rest::{RestCatalog, RestCatalogConfig, RestSession};
use floe_iceberg::{CatalogConfig, is_not_found, open_catalog};

use crate::probe::{Outcome, Steps};

/// What the pipeline needs of the catalog.
pub struct Target<'a> {
    /// Catalog name in the config.
    pub catalog: &'a str,
    /// Dotted namespace.
    pub namespace: &'a str,
    /// Table name.
    pub table: &'a str,
    /// Whether the agent may create the table.
    pub create_table: bool,
}

/// Runs every catalog step for `target` and records them in `report`.
pub async fn probe(config: &CatalogConfig, target: &Target<'_>, report: &mut Steps) {
    match config {
        CatalogConfig::Rest(rest) => check_rest(target, rest, report).await,
        sql => check_sql(target, sql, report).await,
    }
}

async fn check_rest(p: &Target<'_>, rest: &RestCatalogConfig, report: &mut Steps) {
    let session = match RestSession::new(p.catalog, rest) {
        Ok(s) => s,
        Err(e) => return report.report("catalog", Outcome::Fail, e.to_string()),
    };
    match session.signer().await {
        Some(Ok((service, region))) => report.report(
            "signing",
            Outcome::Pass,
            format!("SigV4 for {service} in {region}, AWS credentials found"),
        ),
        Some(Err(e)) => {
            report.report("signing", Outcome::Fail, e.to_string());
            return skip_rest(report, "no AWS credentials to sign with");
        }
        None => {}
    }
    match session.obtain_token().await {
        Ok(true) => report.report("token", Outcome::Pass, "token obtained".into()),
        Ok(false) => report.report("token", Outcome::Skip, "no credential configured".into()),
        Err(e) => {
            report.report("token", Outcome::Fail, e.to_string());
            return skip_rest(report, "no token");
        }
    }
    let session = match session.configure(rest.warehouse.as_deref()).await {
        Ok(s) => {
            report.report(
                "catalog",
                Outcome::Pass,
                format!("REST API at {}", s.base()),
            );
            s
        }
        Err(e) => {
            report.report("catalog", Outcome::Fail, e.to_string());
            return skip_rest(report, "catalog unreachable");
        }
    };
    let catalog: Arc<dyn Catalog> = Arc::new(RestCatalog::new(session, rest.s3.clone()));
    check_catalog(p, None, catalog, report).await;
}

fn skip_rest(report: &mut Steps, why: &str) {
    for step in ["namespaces", "table", "storage"] {
        report.report(step, Outcome::Skip, why.into());
    }
}

/// An embedded or Postgres catalog: opened as the agent opens it.
async fn check_sql(p: &Target<'_>, config: &CatalogConfig, report: &mut Steps) {
    let what = match config {
        CatalogConfig::Sql { uri, .. } => {
            format!("SQL catalog on postgres at {}", redact_url(uri))
        }
        _ => "embedded catalog".to_string(),
    };
    match open_catalog(p.catalog, config).await {
        Ok(handle) => {
            report.report("catalog", Outcome::Pass, format!("{what} opened"));
            report.report("token", Outcome::Skip, format!("{what}: no token"));
            check_catalog(p, Some(config), handle.catalog, report).await;
        }
        Err(e) => {
            report.report("catalog", Outcome::Fail, e.to_string());
            skip_rest(report, "catalog unreachable");
        }
    }
}

async fn check_catalog(
    p: &Target<'_>,
    warehouse: Option<&CatalogConfig>,
    catalog: Arc<dyn Catalog>,
    report: &mut Steps,
) {
    match catalog.list_namespaces(None).await {
        Ok(ns) => report.report("namespaces", Outcome::Pass, format!("{} listed", ns.len())),
        Err(e) => report.report("namespaces", Outcome::Fail, e.message().to_string()),
    }
    let levels: Vec<String> = p.namespace.split('.').map(str::to_string).collect();
    let ident = match NamespaceIdent::from_vec(levels) {
        Ok(ns) => TableIdent::new(ns, p.table.to_string()),
        Err(e) => return report.report("table", Outcome::Fail, e.to_string()),
    };
    match catalog.load_table(&ident).await {
        Ok(table) => {
            report.report(
                "table",
                Outcome::Pass,
                format!(
                    "{ident} loaded ({} snapshots)",
                    table.metadata().snapshots().len()
                ),
            );
            check_storage(&table, report).await;
        }
        Err(e) if is_not_found(&e) => {
            if p.create_table {
                report.report(
                    "table",
                    Outcome::Pass,
                    format!(
                        "{ident} does not exist yet; created on the first commit (create_table = true)"
                    ),
                );
                let probed = match warehouse {
                    Some(config) => floe_iceberg::probe_warehouse(p.catalog, config).await,
                    None => None,
                };
                match probed {
                    Some(Ok(path)) => report.report(
                        "storage",
                        Outcome::Pass,
                        format!("wrote and deleted {path}"),
                    ),
                    Some(Err(e)) => report.report("storage", Outcome::Fail, e),
                    None => report.report(
                        "storage",
                        Outcome::Skip,
                        "checked once the table exists (its location and credentials come with it)"
                            .into(),
                    ),
                }
            } else {
                report.report(
                    "table",
                    Outcome::Fail,
                    format!("{ident} does not exist; create it or set `create_table = true`"),
                );
                report.report("storage", Outcome::Skip, "no table".into());
            }
        }
        Err(e) => {
            report.report("table", Outcome::Fail, e.message().to_string());
            report.report("storage", Outcome::Skip, "no table".into());
        }
    }
}

/// Writes and deletes a small object under the table's data location, with the
/// credentials the agent would write with.
async fn check_storage(table: &Table, report: &mut Steps) {
    let data = format!("{}/data", table.metadata().location().trim_end_matches('/'));
    match floe_iceberg::probe_write(table.file_io(), &data).await {
        Ok(path) => report.report(
            "storage",
            Outcome::Pass,
            format!("wrote and deleted {path}"),
        ),
        Err(e) => report.report("storage", Outcome::Fail, e),
    }
}
