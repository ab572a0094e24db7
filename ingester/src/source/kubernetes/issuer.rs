//! A cluster's service-account token issuer, for the xDS servers' offline verification of
//! the tokens proxies present (see `shoal_server::auth`).
//!
//! Read from the API server's service-account issuer discovery endpoints
//! (`/.well-known/openid-configuration` for the issuer name, `/openid/v1/jwks` for the
//! keys; Kubernetes 1.21+), which the `system:service-account-issuer-discovery`
//! ClusterRole grants. Read when the cluster's watches start and every [`REFRESH`] after
//! (API servers rotate their signing keys rarely and keep serving the old public key while
//! tokens signed with it are valid); a failure is retried after [`RETRY`] and changes
//! nothing on the bus (servers keep the keys they have).

use super::watch::{Sink, Tagged, Update};
use crate::task::TaskGuard;
use shoal_common::model::ClusterIssuer;
use std::time::Duration;

/// How often the issuer's keys are read again.
pub const REFRESH: Duration = Duration::from_secs(300);

/// How soon a failed read is retried.
pub const RETRY: Duration = Duration::from_secs(30);

/// Why the issuer could not be read.
#[derive(Debug, thiserror::Error)]
pub enum IssuerError {
    /// The request failed (connection, status).
    #[error("cannot read {path} from the API server: {source}{}", hint(source))]
    Request {
        /// The path requested.
        path: &'static str,
        /// The cause.
        source: kube::Error,
    },
    /// The answer is not what Kubernetes serves.
    #[error("{path} is not a valid answer: {error}")]
    Invalid {
        /// The path requested.
        path: &'static str,
        /// What is wrong.
        error: String,
    },
}

fn hint(error: &kube::Error) -> &'static str {
    match error {
        kube::Error::Api(e) if e.code == 401 || e.code == 403 => {
            " (bind the ClusterRole system:service-account-issuer-discovery to the ingester's \
             identity in this cluster)"
        }
        kube::Error::Api(e) if e.code == 404 => {
            " (the API server does not serve service-account issuer discovery: Kubernetes \
             1.21+ serves it unless disabled)"
        }
        _ => "",
    }
}

const CONFIGURATION: &str = "/.well-known/openid-configuration";
const JWKS: &str = "/openid/v1/jwks";

async fn get(client: &kube::Client, path: &'static str) -> Result<String, IssuerError> {
    let request = http::Request::get(path)
        .body(Vec::new())
        .map_err(|e| IssuerError::Invalid {
            path,
            error: e.to_string(),
        })?;
    client
        .request_text(request)
        .await
        .map_err(|source| IssuerError::Request { path, source })
}

/// Reads the issuer of `cluster`.
pub async fn fetch(client: &kube::Client, cluster: &str) -> Result<ClusterIssuer, IssuerError> {
    #[derive(serde::Deserialize)]
    struct Configuration {
        issuer: String,
    }
    let invalid = |path, error: String| IssuerError::Invalid { path, error };
    let configuration: Configuration = serde_json::from_str(&get(client, CONFIGURATION).await?)
        .map_err(|e| invalid(CONFIGURATION, e.to_string()))?;
    let jwks = get(client, JWKS).await?;
    let keys = serde_json::from_str::<serde_json::Value>(&jwks)
        .map_err(|e| invalid(JWKS, e.to_string()))?;
    if !keys.get("keys").is_some_and(serde_json::Value::is_array) {
        return Err(invalid(JWKS, "no \"keys\" array".into()));
    }
    Ok(ClusterIssuer {
        cluster: cluster.to_string(),
        issuer: configuration.issuer,
        jwks,
    })
}

/// Reads the issuer now and every [`REFRESH`], sending each result to the cluster task.
pub fn spawn(client: kube::Client, sink: Sink) -> TaskGuard {
    TaskGuard::new(tokio::spawn(async move {
        loop {
            let result = fetch(&client, &sink.cluster)
                .await
                .map_err(|e| e.to_string());
            let again = if result.is_ok() { REFRESH } else { RETRY };
            let tagged = Tagged {
                generation: sink.generation,
                update: Update::Issuer(result),
            };
            if sink.tx.send(tagged).await.is_err() {
                return;
            }
            tokio::time::sleep(again).await;
        }
    }))
}
