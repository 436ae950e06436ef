//! `[catalogs.NAME]` with `type = "rest"`: the settings Flink, Trino and PyIceberg users
//! know (`uri`, `warehouse`, `credential`, `scope`, `header.*`, `s3.*`).

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::Deserialize;

use crate::redact::Redacted;
pub use crate::redact::Secret;

/// Whether the catalog hands out storage credentials for each table.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum AccessDelegation {
    /// Send `X-Iceberg-Access-Delegation: vended-credentials` and write with what the
    /// catalog returns for each table.
    #[default]
    VendedCredentials,
    /// Write with the agent's own storage credentials (`s3.*`, else the AWS chain).
    None,
}

/// The agent's own S3 settings (`s3.endpoint`, `s3.region`, `s3.path-style-access`, keys).
/// With vended credentials only endpoint, region and addressing are used.
#[derive(Clone, Default, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct S3Settings {
    /// Endpoint of an S3-compatible store, e.g. `http://127.0.0.1:9000`.
    pub endpoint: Option<String>,
    /// Region (`us-east-1` when neither this nor the catalog says).
    pub region: Option<String>,
    /// Path-style addressing (`http://host/bucket/key`), which most S3-compatible stores need.
    pub path_style_access: Option<bool>,
    /// Static access key id; without it the standard AWS chain is used
    /// (environment, profile, web identity, instance metadata).
    pub access_key_id: Option<String>,
    /// Static secret access key.
    pub secret_access_key: Option<Secret>,
    /// Session token of temporary static credentials.
    pub session_token: Option<Secret>,
}

impl fmt::Debug for S3Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Settings")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("path_style_access", &self.path_style_access)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &self.secret_access_key)
            .field("session_token", &self.session_token)
            .finish()
    }
}

impl S3Settings {
    /// These settings as Iceberg FileIO properties (`s3.endpoint`, ...).
    pub fn file_io_props(&self, with_keys: bool) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if let Some(e) = &self.endpoint {
            out.push(("s3.endpoint".into(), e.clone()));
        }
        if let Some(r) = &self.region {
            out.push(("s3.region".into(), r.clone()));
        }
        if let Some(p) = self.path_style_access {
            out.push(("s3.path-style-access".into(), p.to_string()));
        }
        if with_keys {
            if let Some(k) = &self.access_key_id {
                out.push(("s3.access-key-id".into(), k.clone()));
            }
            if let Some(s) = &self.secret_access_key {
                out.push(("s3.secret-access-key".into(), s.expose().to_string()));
            }
            if let Some(t) = &self.session_token {
                out.push(("s3.session-token".into(), t.expose().to_string()));
            }
        }
        out
    }
}

/// An Iceberg REST catalog (Apache Polaris, Lakekeeper, Nessie, Gravitino, Unity, ...).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestCatalogConfig {
    /// Base URI, e.g. `http://polaris:8181/api/catalog` (requests go to `{uri}/v1/...`).
    pub uri: String,
    /// Warehouse: for Polaris the catalog name, for others often a location.
    pub warehouse: Option<String>,
    /// OAuth2 client credentials `client_id:client_secret` (use `${ENV_VAR}`).
    pub credential: Option<Secret>,
    /// A file holding `client_id:client_secret` (surrounding whitespace ignored).
    pub credential_file: Option<PathBuf>,
    /// OAuth2 scope, e.g. `PRINCIPAL_ROLE:ALL` (Polaris requires one).
    pub scope: Option<String>,
    /// Token endpoint; default `{uri}/v1/oauth/tokens`.
    #[serde(alias = "oauth2-server-uri")]
    pub oauth2_server_uri: Option<String>,
    /// A static bearer token instead of client credentials (not refreshed).
    pub token: Option<Secret>,
    /// Extra HTTP headers sent with every catalog request (`header.X-Name = "v"` works too).
    /// Values may hold credentials (`Authorization`): `Debug` shows the names only.
    #[serde(default, alias = "header")]
    pub headers: Redacted<BTreeMap<String, String>>,
    /// Allow `http://` to a host other than loopback while a credential, token or
    /// `Authorization` header is sent (it then travels in the clear; a warning is logged
    /// at every start). Default false: such a config is refused.
    #[serde(default)]
    pub allow_insecure_http: bool,
    /// `vended-credentials` (default) or `none`.
    #[serde(default, alias = "access-delegation")]
    pub access_delegation: AccessDelegation,
    /// The agent's own S3 settings (`s3.endpoint`, `s3.region`, `s3.path-style-access`, keys).
    #[serde(default)]
    pub s3: S3Settings,
    /// Sign every catalog request with AWS SigV4 and the agent's AWS identity (`aws.*`,
    /// else the SDK's default chain), as AWS Glue's and S3 Tables' Iceberg REST
    /// endpoints require (Iceberg's `rest.sigv4-enabled`).
    #[serde(default)]
    pub sigv4: bool,
    /// Service the signatures are for: `glue`, `s3tables` (default `execute-api`, as
    /// Iceberg's `rest.signing-name`).
    pub signing_name: Option<String>,
    /// Region the signatures are for (default: `aws.region`, `s3.region`, then
    /// `AWS_REGION`).
    pub signing_region: Option<String>,
    /// How the agent finds its AWS identity, for SigV4 and for S3 when the catalog
    /// vends no credentials and no `s3.*` keys are set.
    #[serde(default)]
    pub aws: crate::catalog::aws::AwsSettings,
}

impl RestCatalogConfig {
    /// Problems serde cannot see, as `(field, message)` pairs.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if !(self.uri.starts_with("http://") || self.uri.starts_with("https://")) {
            out.push(("uri".into(), "must start with http:// or https://".into()));
        }
        let given = [
            self.credential.is_some(),
            self.credential_file.is_some(),
            self.token.is_some(),
        ];
        if given.iter().filter(|g| **g).count() > 1 {
            out.push((
                "credential".into(),
                "set only one of credential, credential_file and token".into(),
            ));
        }
        if let Some(c) = &self.credential
            && !valid_client_credential(c.expose())
        {
            out.push((
                "credential".into(),
                "must be client_id:client_secret (both non-empty)".into(),
            ));
        }
        for name in self.headers.keys() {
            if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
                out.push((format!("headers.{name}"), "not a valid header name".into()));
            }
        }
        if self.sigv4 && self.signing_region().is_none() {
            out.push((
                "signing_region".into(),
                "sigv4 needs a region: set signing_region (or aws.region, or AWS_REGION)".into(),
            ));
        }
        if !self.allow_insecure_http {
            for (field, url) in self.cleartext_secrets() {
                out.push((
                    field.into(),
                    format!(
                        "{url} is plain http:// to a host that is not loopback, and the \
                         catalog's credentials would travel in the clear: use https://, or \
                         set allow_insecure_http = true to accept that"
                    ),
                ));
            }
        }
        out
    }

    /// The endpoints (`(field, url)`) that would receive a credential, token or
    /// credential-like header over plain HTTP on a non-loopback host.
    pub fn cleartext_secrets(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        let client_credentials =
            self.token.is_none() && (self.credential.is_some() || self.credential_file.is_some());
        let bearer = self.token.is_some()
            || client_credentials
            || self.headers.keys().any(|h| secret_header(h));
        if bearer && insecure(&self.uri) {
            out.push(("uri", self.uri.clone()));
        }
        if client_credentials && self.oauth2_server_uri.is_some() {
            let endpoint = self.token_endpoint();
            if insecure(&endpoint) {
                out.push(("oauth2_server_uri", endpoint));
            }
        }
        out
    }

    /// The region SigV4 signatures are for.
    pub fn signing_region(&self) -> Option<String> {
        // signing_region, then aws.region, then s3.region, then the environment.
        let aws_first = self.aws.region.as_ref();
        self.aws.region_or_env(&[
            self.signing_region.as_ref(),
            aws_first,
            self.s3.region.as_ref(),
        ])
    }

    /// The service SigV4 signatures are for.
    pub fn signing_name(&self) -> &str {
        self.signing_name.as_deref().unwrap_or("execute-api")
    }

    /// The token endpoint.
    pub fn token_endpoint(&self) -> String {
        self.oauth2_server_uri
            .clone()
            .unwrap_or_else(|| format!("{}/v1/oauth/tokens", self.uri.trim_end_matches('/')))
    }
}

/// Whether a header's value is likely a credential (`Authorization`, `X-Api-Key`, ...).
fn secret_header(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    ["auth", "key", "token", "secret", "cookie", "password"]
        .iter()
        .any(|w| n.contains(w))
}

/// `http://` to a host other than loopback (`127.0.0.0/8`, `::1`, `localhost`).
fn insecure(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit('@').next().unwrap_or("");
    let host = if let Some(v6) = host_port.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        host_port.split(':').next().unwrap_or("")
    };
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    !loopback
}

/// Whether `text` reads `client_id:client_secret` with both parts present.
pub(crate) fn valid_client_credential(text: &str) -> bool {
    text.split_once(':')
        .is_some_and(|(id, secret)| !id.trim().is_empty() && !secret.trim().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flink_style_keys_parse_and_secrets_stay_hidden() {
        let c: RestCatalogConfig = toml::from_str(
            r#"
uri = "https://polaris:8181/api/catalog"
warehouse = "prod"
credential = "etl:s3cr3t"
scope = "PRINCIPAL_ROLE:ALL"
header.X-Tenant = "acme"
s3.endpoint = "http://127.0.0.1:9000"
s3.path-style-access = true
s3.secret-access-key = "hidden-key"
"#,
        )
        .unwrap();
        assert_eq!(c.access_delegation, AccessDelegation::VendedCredentials);
        assert_eq!(c.headers["X-Tenant"], "acme");
        assert_eq!(c.s3.path_style_access, Some(true));
        assert_eq!(
            c.token_endpoint(),
            "https://polaris:8181/api/catalog/v1/oauth/tokens"
        );
        assert!(c.problems().is_empty(), "{:?}", c.problems());
        let debug = format!("{c:?}");
        assert!(
            !debug.contains("s3cr3t") && !debug.contains("hidden-key"),
            "{debug}"
        );
    }

    #[test]
    fn conflicting_or_malformed_credentials_are_reported() {
        let c: RestCatalogConfig =
            toml::from_str("uri = \"polaris:8181\"\ncredential = \"only-id\"\ntoken = \"t\"")
                .unwrap();
        let fields: Vec<_> = c.problems().into_iter().map(|p| p.0).collect();
        assert_eq!(fields, ["uri", "credential", "credential"]);
        let e = toml::from_str::<RestCatalogConfig>(
            "uri = \"http://x\"\naccess_delegation = \"maybe\"",
        )
        .unwrap_err();
        assert!(e.to_string().contains("vended-credentials"), "{e}");
    }

    #[test]
    fn credentials_over_plain_http_are_refused_unless_allowed() {
        let parse = |text: &str| toml::from_str::<RestCatalogConfig>(text).unwrap();
        let refused = parse("uri = \"http://polaris:8181/api/catalog\"\ncredential = \"a:b\"");
        let problems = refused.problems();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].0, "uri");
        assert!(
            problems[0].1.contains("allow_insecure_http"),
            "{problems:?}"
        );
        // A static token, an Authorization header, or an http:// token endpoint too.
        for extra in [
            "uri = \"http://10.0.0.5/api\"\ntoken = \"t\"",
            "uri = \"http://cat.example/api\"\nheader.Authorization = \"Bearer x\"",
            "uri = \"https://cat.example/api\"\ncredential = \"a:b\"\noauth2_server_uri = \"http://idp.example/token\"",
        ] {
            assert_eq!(parse(extra).problems().len(), 1, "{extra}");
        }
        // Allowed explicitly; loopback (a local sidecar, the tests); https; no secret sent.
        for fine in [
            "uri = \"http://polaris:8181/api\"\ncredential = \"a:b\"\nallow_insecure_http = true",
            "uri = \"http://127.0.0.1:8181/api\"\ncredential = \"a:b\"",
            "uri = \"http://[::1]:8181/api\"\ntoken = \"t\"",
            "uri = \"http://localhost/api\"\nheader.Authorization = \"x\"",
            "uri = \"https://polaris/api\"\ncredential = \"a:b\"",
            "uri = \"http://polaris/api\"\nheader.X-Tenant = \"acme\"",
        ] {
            assert!(parse(fine).problems().is_empty(), "{fine}");
        }
        let allowed =
            parse("uri = \"http://polaris/api\"\ntoken = \"t\"\nallow_insecure_http = true");
        assert_eq!(allowed.cleartext_secrets().len(), 1);
    }

    #[test]
    fn header_values_are_not_printed() {
        let c: RestCatalogConfig =
            toml::from_str("uri = \"https://x\"\nheader.Authorization = \"Bearer top-secret\"")
                .unwrap();
        let debug = format!("{c:?}");
        assert!(
            debug.contains("Authorization") && !debug.contains("top-secret"),
            "{debug}"
        );
    }
}
