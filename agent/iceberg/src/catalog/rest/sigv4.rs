//! AWS SigV4 signing of catalog requests (`sigv4 = true`), for AWS Glue's and S3 Tables'
//! Iceberg REST endpoints, which authenticate requests by signature instead of OAuth2.
//! Signs like Iceberg's Java client: the body's SHA-256 in `x-amz-content-sha256`, and
//! an `Authorization` header of another scheme moved to `Original-Authorization`.

use std::sync::Arc;
use std::time::SystemTime;

use aws_sigv4::http_request::{
    PayloadChecksumKind, SignableBody, SignableRequest, SigningSettings, sign,
};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use reqwest::header::{AUTHORIZATION, HeaderName, HeaderValue};

use crate::catalog::aws::{AwsCredentials, AwsError};

/// Why a request could not be signed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SignError {
    /// No AWS credentials to sign with.
    #[error(transparent)]
    Credentials(#[from] AwsError),
    /// The request's body is a stream, whose hash is not known before it is sent.
    #[error("a streamed body cannot be signed")]
    StreamedBody,
    /// The request cannot be signed as it is.
    #[error("{0}")]
    Signing(#[source] aws_sigv4::http_request::SigningError),
    /// The signing parameters are incomplete.
    #[error("{0}")]
    Params(#[source] v4::signing_params::BuildError),
    /// A signature header is not a valid header value.
    #[error("{0}")]
    HeaderValue(#[source] reqwest::header::InvalidHeaderValue),
    /// A signature header is not a valid header name.
    #[error("{0}")]
    HeaderName(#[source] reqwest::header::InvalidHeaderName),
}

/// Signs requests for one service and region.
#[derive(Debug)]
// upstream: REST SigV4 signing (iceberg-catalog-rest 0.10 has no rest.sigv4-enabled;
// delete when it has)
pub(crate) struct SigV4 {
    /// Whose credentials sign.
    pub credentials: Arc<AwsCredentials>,
    /// `signing_region`.
    pub region: String,
    /// `signing_name`: `glue`, `s3tables`, ...
    pub service: String,
}

impl SigV4 {
    /// Signs a built request in place, just before it is sent (every attempt anew: a
    /// signature is valid for minutes only).
    pub(crate) async fn sign(&self, request: &mut reqwest::Request) -> Result<(), SignError> {
        let identity: Identity = self.credentials.credentials().await?.into();
        if let Some(auth) = request.headers_mut().remove(AUTHORIZATION) {
            request
                .headers_mut()
                .insert(HeaderName::from_static("original-authorization"), auth);
        }
        let signed = {
            let body: &[u8] = match request.body() {
                None => &[],
                Some(b) => b.as_bytes().ok_or(SignError::StreamedBody)?,
            };
            let headers: Vec<(&str, &str)> = request
                .headers()
                .iter()
                .filter_map(|(k, v)| v.to_str().ok().map(|v| (k.as_str(), v)))
                .collect();
            let signable = SignableRequest::new(
                request.method().as_str(),
                request.url().as_str(),
                headers.into_iter(),
                SignableBody::Bytes(body),
            )
            .map_err(SignError::Signing)?;
            let mut settings = SigningSettings::default();
            settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
            let params = v4::SigningParams::builder()
                .identity(&identity)
                .region(&self.region)
                .name(&self.service)
                .time(SystemTime::now())
                .settings(settings)
                .build()
                .map_err(SignError::Params)?
                .into();
            sign(signable, &params)
                .map_err(SignError::Signing)?
                .into_parts()
                .0
        };
        let (headers, _) = signed.into_parts();
        for header in headers {
            let mut value =
                HeaderValue::from_str(header.value()).map_err(SignError::HeaderValue)?;
            value.set_sensitive(header.sensitive());
            let name =
                HeaderName::from_bytes(header.name().as_bytes()).map_err(SignError::HeaderName)?;
            request.headers_mut().insert(name, value);
        }
        Ok(())
    }
}
