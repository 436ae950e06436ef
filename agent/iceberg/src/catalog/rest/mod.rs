//! Iceberg REST catalog client (Apache Polaris, Lakekeeper, Nessie, Gravitino, ...).
//!
//! - `config`: `[catalogs.NAME]` with `type = "rest"`; secrets never printed.
//! - `auth`: OAuth2 client-credentials tokens, renewed before `expires_in` runs out and
//!   after a 401 (iceberg-catalog-rest 0.10 keeps its first token forever).
//! - `session`: [`RestSession`], the authenticated request path every call takes; the
//!   commit layer uses it directly for commit-table requests.
//! - `catalog`: [`RestCatalog`], the `iceberg::Catalog` on top of the session.
//! - `storage`: table FileIO with vended credentials (renewed before they expire) or
//!   the agent's own S3 settings.
//! - `sigv4`: AWS SigV4 request signing (Glue, S3 Tables) with the agent's AWS identity.
//! - `error`: [`RestError`], whose messages say what to fix (401, 403, 404 on the base path).

mod auth;
mod catalog;
mod config;
mod error;
mod session;
mod sigv4;
mod storage;

pub use catalog::RestCatalog;
pub use config::{AccessDelegation, RestCatalogConfig, S3Settings, Secret};
pub use error::RestError;
pub use session::RestSession;
