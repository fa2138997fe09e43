//! The JSON error body every non-2xx answer carries: `{"error": "...", "field": "n"}`.
//!
//! Client mistakes are 4xx and name the offending field where there is one; overload and store
//! trouble are 503 with `Retry-After`; only a server bug would be a 500.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// An error answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong (never echoes a token or a secret).
    pub error: String,
    /// The request field at fault, if any.
    pub field: Option<String>,
    /// Seconds for `Retry-After` (503s).
    pub retry_after_s: Option<u64>,
}

/// The body of every non-2xx answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: String,
    /// The request field at fault, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

impl ApiError {
    /// A client error naming `field`.
    pub fn field(status: StatusCode, field: &str, error: impl Into<String>) -> Self {
        Self {
            status,
            error: error.into(),
            field: Some(field.to_owned()),
            retry_after_s: None,
        }
    }

    /// 400 naming `field`.
    pub fn bad(field: &str, error: impl Into<String>) -> Self {
        Self::field(StatusCode::BAD_REQUEST, field, error)
    }

    /// 503 with `Retry-After: retry_after_s`.
    pub fn unavailable(error: impl Into<String>, retry_after_s: u64) -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            error: error.into(),
            field: None,
            retry_after_s: Some(retry_after_s),
        }
    }

    /// 500: a failure of the server itself (a store backend error, a lost worker thread).
    pub fn internal(error: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            error: error.into(),
            field: None,
            retry_after_s: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.error,
            field: self.field,
        };
        let mut response = (self.status, Json(body)).into_response();
        if let Some(s) = self.retry_after_s {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        response
    }
}
