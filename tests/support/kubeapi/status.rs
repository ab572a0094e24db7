//! Failures, as the `Status` objects (`kind: Status`, `status: Failure`) the real API server
//! answers with.

use super::store::ResourceDef;
use serde_json::{json, Value};
use std::fmt;

/// A failed API request: the HTTP status `code`, the machine-readable `reason`
/// (`NotFound`, `AlreadyExists`, `Conflict`, `Invalid`, `BadRequest`, `Expired`, ...) and the
/// message, as the real API server words them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status code (404, 409, ...).
    pub code: u16,
    /// `Status.reason`.
    pub reason: String,
    /// `Status.message`.
    pub message: String,
    details: Option<Value>,
}

impl ApiError {
    pub(crate) fn new(code: u16, reason: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason: reason.to_string(),
            message: message.into(),
            details: None,
        }
    }

    fn about(mut self, res: &ResourceDef, name: &str) -> ApiError {
        let mut details = json!({"name": name, "kind": res.plural});
        if !res.group.is_empty() {
            details["group"] = json!(res.group);
        }
        self.details = Some(details);
        self
    }

    /// 400 BadRequest.
    pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    /// 404 NotFound for a path the server does not serve.
    pub(crate) fn no_route() -> ApiError {
        let mut e = ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        );
        e.details = Some(json!({}));
        e
    }

    /// 404 NotFound for an object.
    pub(crate) fn not_found(res: &ResourceDef, name: &str) -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", res.qualified()),
        )
        .about(res, name)
    }

    /// 409 AlreadyExists.
    pub(crate) fn already_exists(res: &ResourceDef, name: &str) -> ApiError {
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", res.qualified()),
        )
        .about(res, name)
    }

    /// 409 Conflict: the object changed since the client read it.
    pub(crate) fn conflict(res: &ResourceDef, name: &str, why: &str) -> ApiError {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                res.qualified()
            ),
        )
        .about(res, name)
    }

    /// 422 Invalid.
    pub(crate) fn invalid(res: &ResourceDef, name: &str, why: &str) -> ApiError {
        let kind = if res.group.is_empty() {
            res.kind.clone()
        } else {
            format!("{}.{}", res.kind, res.group)
        };
        ApiError::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {why}"),
        )
        .about(res, name)
    }

    /// 403 Forbidden.
    pub(crate) fn forbidden(res: &ResourceDef, name: &str, why: &str) -> ApiError {
        ApiError::new(
            403,
            "Forbidden",
            format!("{} \"{name}\" is forbidden: {why}", res.qualified()),
        )
        .about(res, name)
    }

    /// 410 Gone with reason Expired: the requested resourceVersion was compacted away.
    pub(crate) fn expired(message: impl Into<String>) -> ApiError {
        ApiError::new(410, "Expired", message)
    }

    /// 405 MethodNotAllowed.
    pub(crate) fn method_not_allowed(method: &str) -> ApiError {
        ApiError::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({method})"),
        )
    }

    /// 500 InternalError.
    pub(crate) fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(500, "InternalError", message)
    }

    /// The `Status` object for this failure.
    pub fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}
