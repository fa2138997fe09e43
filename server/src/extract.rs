//! Request-body extraction that names the offending field.
//!
//! axum's own `Json` rejection is plain text; [`JsonBody`] reads the (size-limited) body and
//! deserializes it with `serde_path_to_error`, so a bad value is reported as
//! `{"error": "...", "field": "amount"}` and a missing one by its name.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// A JSON body of type `T`.
#[derive(Clone, Copy, Debug, Default)]
pub struct JsonBody<T>(pub T);

/// The field a serde error is about: the path, or the name in "missing field `x`".
fn field_of(path: &str, message: &str) -> String {
    if !path.is_empty() && path != "." && path != "?" {
        return path.to_owned();
    }
    for prefix in ["missing field `", "unknown field `"] {
        if let Some(rest) = message.strip_prefix(prefix)
            && let Some(end) = rest.find('`')
        {
            return rest[..end].to_owned();
        }
    }
    "body".to_owned()
}

/// Deserializes `bytes` as `T`, naming the field on failure.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        let message = inner.to_string();
        let field = field_of(&path, &message);
        let status = if inner.is_syntax() || inner.is_eof() {
            StatusCode::BAD_REQUEST
        } else {
            StatusCode::UNPROCESSABLE_ENTITY
        };
        ApiError::field(status, &field, format!("invalid JSON body: {message}"))
    })
}

/// Whether a `Content-Type` value names JSON (`application/json`, or `application/…+json`, any
/// parameters, any case).
#[must_use]
pub fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || essence
            .strip_prefix("application/")
            .is_some_and(|sub| sub.ends_with("+json"))
}

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        // A body is read as JSON only when it says it is (a form or text posted cross-site is
        // not taken for an API call).
        let content_type = req
            .headers()
            .get(axum::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        // No body and no type: nothing is taken for JSON, and the parse below says the body is
        // missing.
        let headers = req.headers();
        let empty = headers.get(axum::http::header::TRANSFER_ENCODING).is_none()
            && headers
                .get(axum::http::header::CONTENT_LENGTH)
                .is_none_or(|v| v.as_bytes() == b"0");
        let untyped_and_empty = content_type.is_empty() && empty;
        if !untyped_and_empty && !is_json(content_type) {
            return Err(ApiError::field(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "content-type",
                format!(
                    "the body must be JSON (Content-Type: application/json), not `{}`",
                    content_type.chars().take(64).collect::<String>()
                ),
            ));
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            let status = rejection.status();
            let error = if status == StatusCode::PAYLOAD_TOO_LARGE {
                "request body too large".to_owned()
            } else {
                format!("cannot read the request body: {}", rejection.body_text())
            };
            ApiError::field(status, "body", error)
        })?;
        object_only(&bytes)?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// Every request body of the API is a JSON object: one that is an array is refused, since serde
/// would read a struct from one by the order of its fields (`[0]` was taken for `{"user": 0}`).
/// An empty body is left to the parse, which names what is missing.
fn object_only(bytes: &[u8]) -> Result<(), ApiError> {
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        None | Some(b'{') => Ok(()),
        Some(_) => Err(ApiError::field(
            StatusCode::UNPROCESSABLE_ENTITY,
            "body",
            "invalid JSON body: a JSON object is expected",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Req {
        user: u64,
        amount: u64,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Strict {
        user: u64,
    }

    #[test]
    fn only_json_content_types_are_json() {
        for yes in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "application/problem+json",
        ] {
            assert!(is_json(yes), "{yes}");
        }
        for no in [
            "",
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data",
            "application/jsonx",
            "text/json",
        ] {
            assert!(!is_json(no), "{no}");
        }
    }

    #[test]
    fn a_body_that_is_not_an_object_is_refused_naming_the_body() {
        // The schemathesis finding: `[0]` was read as `{"user": 0}`.
        assert!(parse_json::<Strict>(b"[0]").is_ok(), "serde alone takes it");
        for bad in [&b"[0]"[..], b" [1, 2]", b"0", b"\"user\"", b"null"] {
            let e = object_only(bad).unwrap_err();
            assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY, "{bad:?}");
            assert_eq!(e.field.as_deref(), Some("body"), "{bad:?}");
        }
        for good in [&b"{\"user\": 1}"[..], b"  {}", b""] {
            assert!(object_only(good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn errors_name_the_field() {
        let e = parse_json::<Req>(br#"{"user": 1, "amount": -5}"#).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("amount"));
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        let e = parse_json::<Req>(br#"{"user": 1}"#).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("amount"));
        let e = parse_json::<Req>(br#"{"user": 1,"#).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("body"));
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(parse_json::<Req>(br#"{"user": 1, "amount": 5}"#).is_ok());
        let e = parse_json::<Strict>(br#"{"user": 1, "x": 5}"#).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("x"));
    }
}
