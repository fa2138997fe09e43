//! The OpenAPI 3.1 description of every route, generated from the handlers' `#[utoipa::path]`
//! attributes and the request/answer types' `ToSchema` derives. Served at `GET /openapi.json`
//! and checked into `docs/openapi.json` (a test fails when the two differ; regenerate with
//! `cargo run -p sut-server --bin sut-server -- --print-openapi > docs/openapi.json`).
//!
//! Four answer types belong to `sut` (`snowflake::Decoded`, `store::TagRow`, `token::Claims`,
//! `token::RevokeOutcome`), which is the pure core and knows nothing of OpenAPI. Rust's orphan
//! rule keeps this crate from implementing `ToSchema` for them, so each has a local stand-in here
//! ([`DecodedSchema`], [`TagRowSchema`], [`ClaimsSchema`], [`RevokeOutcomeSchema`]) with the
//! sut type's name and a schema written by hand; handlers and bodies point at the stand-in
//! (`body = ...`, `#[schema(value_type = ...)]`). A test checks every stand-in against the
//! serialized values so that the two cannot drift apart unnoticed.

use std::borrow::Cow;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Schema, Type};
use utoipa::{OpenApi, PartialSchema, ToSchema};

use super::error::ErrorBody;
use super::ids::SnowflakeView;
use super::lottery::{
    Check, DeadLetterBody, DrawAnswer, DrawStatusBody, LedgerReport, LotteryState, StockView,
};
use super::remote::{BranchBatch, BranchReplies, BranchRequest};
use super::tokens::{
    ConsumeBody, ConsumedBody, IssueBody, IssuedBody, OnceBody, OnceIssueBody, RevokedBody,
    TokenBody, VerifiedBody,
};
use super::{
    AccountsBody, ActivityBody, DrawBody, HealthBody, IdBody, IdsBody, Ok1, OpenedBody,
    PublicHealthBody, RegisteredBody, Role, StockBody, TagBody,
};

/// The description (derive).
#[derive(Debug, OpenApi)]
#[openapi(
    info(
        title = "sut-server",
        description = "Segment/Snowflake IDs, tokens and the TCC lottery over SQLite or PostgreSQL (docs/server.md). Every non-2xx answer is `{\"error\", \"field\"?}`.",
        license(name = "MIT OR Apache-2.0"),
    ),
    modifiers(&Throttled),
    paths(
        super::noop,
        super::next_id,
        super::next_ids,
        super::snowflake,
        super::decode,
        super::semantic_id,
        super::health,
        super::health_detail,
        super::metrics,
        super::tokens::issue,
        super::tokens::verify,
        super::tokens::revoke,
        super::tokens::once_issue,
        super::tokens::once_consume,
        super::draw,
        super::draw_status,
        super::dead_letters,
        super::retry_dead_letter,
        super::ledger,
        super::create_tag,
        super::open_accounts,
        super::add_stock,
        super::register_activity,
        super::list_activities,
        super::branch,
        super::branches,
        super::lottery_state,
        openapi_route,
    ),
    components(schemas(
        ErrorBody,
        Ok1,
        IdBody,
        IdsBody,
        HealthBody,
        PublicHealthBody,
        SnowflakeView,
        TagBody,
        AccountsBody,
        OpenedBody,
        StockBody,
        ActivityBody,
        RegisteredBody,
        DrawBody,
        DrawAnswer,
        DrawStatusBody,
        DeadLetterBody,
        LedgerReport,
        StockView,
        Check,
        IssueBody,
        IssuedBody,
        TokenBody,
        VerifiedBody,
        RevokedBody,
        RevokeOutcomeSchema,
        OnceIssueBody,
        OnceBody,
        ConsumeBody,
        ConsumedBody,
        ClaimsSchema,
        DecodedSchema,
        TagRowSchema,
        BranchRequest,
        BranchBatch,
        BranchReplies,
        Role,
        LotteryState,
    ))
)]
pub struct ApiDoc;

/// The 429 of an address that presented too many wrong secrets, on every route of
/// [`super::THROTTLED_ROUTES`].
struct Throttled;

/// Its description: the `field` names the credential.
pub const THROTTLED_429: &str = "This address presented too many wrong secrets: every credential \
     is refused, the right one too, for `Retry-After` seconds (one more try a second, 20 at most \
     saved) (`field: authorization`)";

impl utoipa::Modify for Throttled {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{ResponseBuilder, header::HeaderBuilder};
        for (method, path) in super::THROTTLED_ROUTES {
            let Some(item) = openapi.paths.paths.get_mut(*path) else {
                continue; // every_route_is_described fails on it
            };
            let operation = match *method {
                "get" => item.get.as_mut(),
                "post" => item.post.as_mut(),
                _ => None,
            };
            let Some(operation) = operation else { continue };
            let response = ResponseBuilder::new()
                .description(THROTTLED_429)
                .content(
                    "application/json",
                    utoipa::openapi::ContentBuilder::new()
                        .schema(Some(utoipa::openapi::Ref::from_schema_name("ErrorBody")))
                        .build(),
                )
                .header(
                    "Retry-After",
                    HeaderBuilder::new()
                        .schema(Some(u64::schema()))
                        .description(Some("Seconds to wait"))
                        .build(),
                )
                .build();
            operation
                .responses
                .responses
                .insert("429".to_owned(), RefOr::T(response));
        }
    }
}

/// The description as pretty JSON with a final newline (the exact text of `docs/openapi.json`).
///
/// # Panics
/// Never: the description is plain data and always serializes.
#[must_use]
pub fn openapi_json() -> String {
    let mut text = ApiDoc::openapi()
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": \"openapi: {e}\"}}"));
    text.push('\n');
    text
}

/// `GET /openapi.json`.
#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "openapi_json",
    tag = "ops",
    summary = "This description",
    responses((status = 200, description = "OpenAPI 3.1 JSON", body = Object))
)]
pub async fn openapi_route() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], openapi_json()).into_response()
}

fn u64_schema(description: &str) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::Integer)
        .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
            utoipa::openapi::KnownFormat::Int64,
        )))
        .minimum(Some(0))
        .description(Some(description))
}

/// A `u64` as `#[derive(ToSchema)]` describes it (the `non_strict_integers` format).
fn derived_u64_schema(description: &str) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::Integer)
        .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
            utoipa::openapi::KnownFormat::UInt64,
        )))
        .minimum(Some(0))
        .description(Some(description))
}

fn string_schema(description: &str) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .description(Some(description))
}

/// The OpenAPI schema of [`sut::snowflake::Decoded`] (component `Decoded`).
#[derive(Debug)]
pub enum DecodedSchema {}

impl PartialSchema for DecodedSchema {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .description(Some("The parts of a Snowflake ID."))
            .property(
                "time_ms",
                u64_schema("Wall-clock milliseconds of the ID's time unit."),
            )
            .required("time_ms")
            .property("ts", u64_schema("Time units since the epoch."))
            .required("ts")
            .property("worker", u64_schema("Worker id."))
            .required("worker")
            .property("seq", u64_schema("Sequence."))
            .required("seq")
            .into()
    }
}

impl ToSchema for DecodedSchema {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("Decoded")
    }
}

/// The OpenAPI schema of [`sut::id_store::TagRow`] (component `TagRow`).
#[derive(Debug)]
pub enum TagRowSchema {}

impl PartialSchema for TagRowSchema {
    fn schema() -> RefOr<Schema> {
        let segment = ObjectBuilder::new()
            .property("start", u64_schema("First ID of the run."))
            .required("start")
            .property("end", u64_schema("Exclusive upper bound."))
            .required("end")
            .property("delta", u64_schema("Distance between consecutive IDs."))
            .required("delta");
        ObjectBuilder::new()
            .description(Some("A tag as stored."))
            .property(
                "tag",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .description(Some("The tag's name.")),
            )
            .required("tag")
            .property("max_id", u64_schema("The next ID never granted."))
            .required("max_id")
            .property("step", u64_schema("The database's step in IDs."))
            .required("step")
            .property("delta", u64_schema("Distance between IDs."))
            .required("delta")
            .property("remainder", u64_schema("This store's residue."))
            .required("remainder")
            .property("version", u64_schema("The optimistic lock."))
            .required("version")
            .property(
                "pool",
                ArrayBuilder::new()
                    .items(segment)
                    .description(Some("Reclaimed tails, lowest first.")),
            )
            .required("pool")
            .into()
    }
}

impl ToSchema for TagRowSchema {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("TagRow")
    }
}

/// The OpenAPI schema of [`sut::token::Claims`] (component `Claims`; the texts are that type's
/// doc comments, as `#[derive(ToSchema)]` took them while the derive lived in `sut`).
#[derive(Debug)]
pub enum ClaimsSchema {}

impl PartialSchema for ClaimsSchema {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(
                "The claims every token carries (all required). Times are RFC 7519 \
                 `NumericDate`s: seconds\nsince the Unix epoch.",
            ))
            .property(
                "jti",
                string_schema("Token id, unique per token: the revocation key."),
            )
            .required("jti")
            .property(
                "sub",
                string_schema("Subject: the user, as decimal text of a [`UserId`](super::UserId)."),
            )
            .required("sub")
            .property("iss", string_schema("Issuer."))
            .required("iss")
            .property("aud", string_schema("Audience."))
            .required("aud")
            .property("exp", derived_u64_schema("Expiry, seconds."))
            .required("exp")
            .property("nbf", derived_u64_schema("Not before, seconds."))
            .required("nbf")
            .property("iat", derived_u64_schema("Issued at, seconds."))
            .required("iat")
            .into()
    }
}

impl ToSchema for ClaimsSchema {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("Claims")
    }
}

/// The OpenAPI schema of [`sut::token::RevokeOutcome`] (component `RevokeOutcome`).
#[derive(Debug)]
pub enum RevokeOutcomeSchema {}

impl PartialSchema for RevokeOutcomeSchema {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some("What a revocation did."))
            .enum_values(Some(["Revoked", "AlreadyRevoked", "NotNeeded"]))
            .into()
    }
}

impl ToSchema for RevokeOutcomeSchema {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("RevokeOutcome")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sut::id_store::{Segment, TagRow};
    use sut::snowflake::Decoded;
    use sut::token::{Claims, RevokeOutcome};

    fn properties(schema: &RefOr<Schema>) -> Vec<String> {
        let value = serde_json::to_value(schema).unwrap();
        let mut keys: Vec<String> = value["properties"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        keys.sort();
        keys
    }

    fn keys(value: &serde_json::Value) -> Vec<String> {
        let mut keys: Vec<String> = value.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        keys
    }

    #[test]
    fn hand_written_schemas_match_the_serialized_types() {
        let decoded = serde_json::to_value(Decoded {
            time_ms: 1,
            ts: 2,
            worker: 3,
            seq: 4,
        })
        .unwrap();
        assert_eq!(properties(&DecodedSchema::schema()), keys(&decoded));
        let row = serde_json::to_value(TagRow {
            tag: "t".to_owned(),
            max_id: 1,
            step: 2,
            delta: 1,
            remainder: 0,
            version: 0,
            pool: vec![Segment {
                start: 1,
                end: 2,
                delta: 1,
            }],
        })
        .unwrap();
        assert_eq!(properties(&TagRowSchema::schema()), keys(&row));
        let pool = serde_json::to_value(TagRowSchema::schema()).unwrap();
        let mut segment_keys: Vec<String> = pool["properties"]["pool"]["items"]["properties"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        segment_keys.sort();
        assert_eq!(segment_keys, keys(&row["pool"][0]));
        let claims = serde_json::to_value(Claims {
            jti: "j".to_owned(),
            sub: "1".to_owned(),
            iss: "i".to_owned(),
            aud: "a".to_owned(),
            exp: 1,
            nbf: 2,
            iat: 3,
        })
        .unwrap();
        assert_eq!(properties(&ClaimsSchema::schema()), keys(&claims));
        let outcomes: Vec<serde_json::Value> = [
            RevokeOutcome::Revoked,
            RevokeOutcome::AlreadyRevoked,
            RevokeOutcome::NotNeeded,
        ]
        .iter()
        .map(|o| serde_json::to_value(o).unwrap())
        .collect();
        let schema = serde_json::to_value(RevokeOutcomeSchema::schema()).unwrap();
        assert_eq!(schema["enum"], serde_json::Value::Array(outcomes));
    }

    #[test]
    fn every_route_is_described() {
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        let mut paths: Vec<&str> = doc["paths"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        paths.sort_unstable();
        let mut routed: Vec<&str> = crate::ROUTES.iter().map(|(_, p)| *p).collect();
        routed.sort_unstable();
        routed.dedup();
        assert_eq!(paths, routed);
        for (method, path) in crate::ROUTES {
            assert!(
                doc["paths"][path][method].is_object(),
                "{method} {path} is routed but not described"
            );
        }
    }

    /// `docs/openapi.json` is the generated description, byte for byte.
    #[test]
    fn checked_in_description_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json");
        let checked_in = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            checked_in == openapi_json(),
            "docs/openapi.json differs from the description generated from the code; \
             regenerate it with `cargo run -p sut-server --bin sut-server -- --print-openapi > docs/openapi.json` \
             and review the diff"
        );
    }
}
