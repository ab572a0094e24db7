//! The HTTP/1.1 front: request parsing, routing, and the REST verbs on resources.
//!
//! Every failure is answered with a `Status` body; nothing taken from a request can panic.

use super::discovery;
use super::patch::PatchKind;
use super::selectors::{FieldSelector, LabelSelector};
use super::status::ApiError;
use super::store::{parse_rv, present, Filter, ObjectKey, Preconditions, ResourceDef, Store};
use super::watch::{self, WatchRequest};
use super::{ObjectWrite, Shared, WatchClient};
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderValue, ACCEPT, CONTENT_TYPE, USER_AGENT};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio::time::Instant;

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// The largest request body accepted (the real server's limit is 3 MiB).
const MAX_BODY: usize = 3 * 1024 * 1024;

/// How long a list with `resourceVersionMatch=NotOlderThan` waits for a revision the server
/// has not reached yet before failing with 504, as the real server does.
const TOO_LARGE_RV_WAIT: Duration = Duration::from_secs(3);

/// Accepts connections until the task is aborted; the connections are owned here, so
/// aborting closes them all (open watches included).
pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, peer)) = accepted else { continue };
                let shared = shared.clone();
                connections.spawn(async move {
                    let service = service_fn(move |req| handle(shared.clone(), peer, req));
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            Some(_) = connections.join_next() => {}
        }
    }
}

/// A request with its body read.
struct ApiRequest {
    method: Method,
    query: Query,
    accept: String,
    content_type: String,
    /// Who sent it, as the real server knows it (its audit log records both).
    user_agent: String,
    peer: SocketAddr,
    body: Bytes,
}

impl ApiRequest {
    /// Objects as `PartialObjectMetadata` (`kube::Api::get_metadata`, metadata watchers).
    fn partial(&self) -> bool {
        self.accept.contains("as=PartialObjectMetadata")
    }

    fn body_json(&self) -> Result<Value, ApiError> {
        if self.body.is_empty() {
            return Err(ApiError::bad_request("the request body is empty"));
        }
        let media = self
            .content_type
            .split(';')
            .next()
            .unwrap_or_default()
            .trim();
        if media.contains("protobuf") || media.contains("cbor") {
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!("the body of the request was in an unknown format ({media}) - accepted media types include: application/json, application/yaml"),
            ));
        }
        let parsed = if media.contains("yaml") {
            std::str::from_utf8(&self.body)
                .map_err(|e| e.to_string())
                .and_then(|text| shoal_common::yaml::from_str(text).map_err(|e| e.to_string()))
        } else {
            serde_json::from_slice(&self.body).map_err(|e| e.to_string())
        };
        parsed.map_err(|e| {
            ApiError::bad_request(format!("the body of the request could not be decoded: {e}"))
        })
    }

    fn dry_run(&self) -> Result<bool, ApiError> {
        match self.query.get("dryRun") {
            None | Some("") => Ok(false),
            Some("All") => Ok(true),
            Some(other) => Err(ApiError::bad_request(format!(
                "unsupported dryRun value {other:?}: only \"All\""
            ))),
        }
    }
}

/// Decoded query parameters, in order; the first occurrence of a key wins.
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(query: Option<&str>) -> Result<Query, ApiError> {
        let mut pairs = Vec::new();
        for pair in query
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
        {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            pairs.push((percent_decode(key, true)?, percent_decode(value, true)?));
        }
        Ok(Query(pairs))
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some("true" | "1" | "True") => Ok(Some(true)),
            Some("false" | "0" | "False" | "") => Ok(Some(false)),
            Some(other) => Err(ApiError::bad_request(format!(
                "invalid value {other:?} for {key}: expected a boolean"
            ))),
        }
    }

    fn number(&self, key: &str) -> Result<Option<u64>, ApiError> {
        match self.get(key) {
            None | Some("") => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| {
                ApiError::bad_request(format!(
                    "invalid value {v:?} for {key}: expected a non-negative integer"
                ))
            }),
        }
    }
}

fn percent_decode(text: &str, plus_is_space: bool) -> Result<String, ApiError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| {
                        ApiError::bad_request(format!("invalid percent-encoding in {text:?}"))
                    })?;
                out.push(hex);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out)
        .map_err(|_| ApiError::bad_request(format!("{text:?} is not UTF-8 once decoded")))
}

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed_unsync()
}

fn json_response(code: u16, value: &Value) -> Response<Body> {
    let mut response = Response::new(full(value.to_string()));
    *response.status_mut() =
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn error_response(error: &ApiError) -> Response<Body> {
    json_response(error.code, &error.status())
}

async fn handle(
    shared: Arc<Shared>,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    shared
        .counters
        .requests
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let method = req.method().clone();
    let uri = req.uri().clone();
    let header = |name| {
        req.headers()
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let (accept, content_type) = (header(ACCEPT), header(CONTENT_TYPE));
    let user_agent = header(USER_AGENT);
    let fail_with = shared.faults().fail_with;
    if let Some(code) = fail_with {
        let error = ApiError::new(code, "InternalError", "injected failure (a test fault)");
        tracing::debug!(server = %shared.name, %method, %uri, code, "kubeapi request failed on purpose");
        return Ok(error_response(&error));
    }
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            let error = ApiError::new(
                413,
                "RequestEntityTooLarge",
                format!("the request body could not be read: {e}"),
            );
            return Ok(error_response(&error));
        }
    };
    let result = match Query::parse(uri.query()) {
        Ok(query) => {
            let request = ApiRequest {
                method: method.clone(),
                query,
                accept,
                content_type,
                user_agent,
                peer,
                body,
            };
            route(&shared, uri.path(), request).await
        }
        Err(e) => Err(e),
    };
    let response = result.unwrap_or_else(|e| error_response(&e));
    tracing::debug!(server = %shared.name, %method, %uri, status = response.status().as_u16(), "kubeapi request");
    Ok(response)
}

async fn route(
    shared: &Arc<Shared>,
    path: &str,
    req: ApiRequest,
) -> Result<Response<Body>, ApiError> {
    let segments: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| percent_decode(s, false))
        .collect::<Result<_, _>>()?;
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    let get = |value: Option<Value>| -> Result<Response<Body>, ApiError> {
        if req.method != Method::GET {
            return Err(ApiError::method_not_allowed(req.method.as_str()));
        }
        value
            .map(|v| json_response(200, &v))
            .ok_or_else(ApiError::no_route)
    };
    let resources = || shared.read(Store::resources);
    let aggregated = discovery::wants_aggregated(&req.accept);
    match segments[..] {
        [] => get(Some(
            json!({"paths": ["/api", "/api/v1", "/apis", "/healthz", "/livez", "/readyz", "/version"]}),
        )),
        ["version"] => get(Some(discovery::version())),
        [".well-known", "openid-configuration"] => get(shared.issuer().map(|(issuer, _)| {
            json!({
                "issuer": issuer,
                "jwks_uri": format!("{issuer}/openid/v1/jwks"),
                "response_types_supported": ["id_token"],
                "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": ["ES256", "RS256"],
            })
        })),
        ["openid", "v1", "jwks"] => get(shared.issuer().map(|(_, jwks)| jwks)),
        ["healthz" | "livez" | "readyz"] => {
            let mut response = Response::new(full("ok"));
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            Ok(response)
        }
        ["api"] if aggregated => {
            get(Some(discovery::aggregated(&resources(), true))).map(aggregated_type)
        }
        ["api"] => get(Some(discovery::api_versions(shared.addr))),
        ["apis"] if aggregated => {
            get(Some(discovery::aggregated(&resources(), false))).map(aggregated_type)
        }
        ["apis"] => get(Some(discovery::group_list(&resources()))),
        ["api", "v1"] => get(discovery::resource_list(&resources(), "", "v1")),
        ["apis", group] => get(discovery::group(&resources(), group)),
        ["apis", group, version] => get(discovery::resource_list(&resources(), group, version)),
        ["api", "v1", ref rest @ ..] => resource_request(shared, req, "", "v1", rest).await,
        ["apis", group, version, ref rest @ ..] => {
            resource_request(shared, req, group, version, rest).await
        }
        _ => Err(ApiError::no_route()),
    }
}

fn aggregated_type(mut response: Response<Body>) -> Response<Body> {
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static(discovery::AGGREGATED_CONTENT_TYPE),
    );
    response
}

/// What a resource path names.
struct Target {
    res: ResourceDef,
    version: String,
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
    /// The deprecated `/watch/` path prefix.
    watch_path: bool,
}

fn target(store: &Store, group: &str, version: &str, rest: &[&str]) -> Result<Target, ApiError> {
    let (watch_path, rest) = match rest {
        ["watch", rest @ ..] => (true, rest),
        _ => (false, rest),
    };
    // `/api/v1/namespaces/{name}/status` is the namespace's own subresource.
    let (namespace, plural, tail) = match rest {
        ["namespaces", ns, plural, tail @ ..]
            if !(group.is_empty() && matches!(*plural, "status" | "finalize")) =>
        {
            (Some(*ns), *plural, tail)
        }
        [plural, tail @ ..] => (None, *plural, tail),
        [] => return Err(ApiError::no_route()),
    };
    let res = store
        .resource(group, plural)
        .filter(|r| r.serves(version))
        .ok_or_else(ApiError::no_route)?;
    if namespace.is_some() && !res.namespaced {
        return Err(ApiError::no_route());
    }
    let (name, status) = match tail {
        [] => (None, false),
        [name] => (Some(name.to_string()), false),
        [name, "status"] if res.status_subresource => (Some(name.to_string()), true),
        _ => return Err(ApiError::no_route()),
    };
    Ok(Target {
        res,
        version: version.to_string(),
        namespace: namespace.map(String::from),
        name,
        status,
        watch_path,
    })
}

async fn resource_request(
    shared: &Arc<Shared>,
    req: ApiRequest,
    group: &str,
    version: &str,
    rest: &[&str],
) -> Result<Response<Body>, ApiError> {
    let target = shared.read(|store| target(store, group, version, rest))?;
    let res = &target.res;
    let method = req.method.clone();
    if target.status && matches!(method, Method::PUT | Method::PATCH) {
        shared.count_status_write(res);
    }
    let verb = match (&method, target.name.is_some()) {
        _ if target.status || target.watch_path => None,
        (&Method::POST, false) => Some("create"),
        (&Method::PUT, true) => Some("update"),
        (&Method::PATCH, true) => Some("patch"),
        (&Method::DELETE, true) => Some("delete"),
        (&Method::DELETE, false) => Some("deletecollection"),
        _ => None,
    };
    let audit = verb.map(|verb| ObjectWrite {
        user_agent: req.user_agent.clone(),
        verb,
        resource: res.qualified(),
        namespace: target.namespace.clone(),
        name: target.name.clone().unwrap_or_default(),
        code: 0,
    });
    let result = object_request(shared, req, &target).await;
    if let Some(mut write) = audit {
        write.code = match &result {
            Ok(response) => response.status().as_u16(),
            Err(error) => error.code,
        };
        shared.record_write(write);
    }
    result
}

async fn object_request(
    shared: &Arc<Shared>,
    req: ApiRequest,
    target: &Target,
) -> Result<Response<Body>, ApiError> {
    let ns = target.namespace.as_deref();
    let (res, version) = (&target.res, target.version.as_str());
    let show = |object: &Value| present_for(&req, object, res, version);
    let method = req.method.clone();
    match (&method, target.name.as_deref()) {
        (&Method::GET, None) => {
            let watching = target.watch_path || req.query.bool("watch")?.unwrap_or(false);
            let filter = filter(&req.query, res, ns, None)?;
            if watching {
                serve_watch(shared, &req, target, filter)
            } else {
                serve_list(shared, &req, target, filter).await
            }
        }
        (&Method::GET, Some(name)) if target.watch_path => {
            let filter = filter(&req.query, res, ns, Some(name))?;
            serve_watch(shared, &req, target, filter)
        }
        (&Method::POST, None) => {
            if res.namespaced && ns.is_none() {
                return Err(ApiError::method_not_allowed("POST"));
            }
            let body = req.body_json()?;
            let dry_run = req.dry_run()?;
            let created = shared.write(|s| s.create(res, version, ns, body, dry_run))?;
            Ok(json_response(201, &show(&created)))
        }
        (&Method::DELETE, None) => {
            if res.namespaced && ns.is_none() {
                return Err(ApiError::method_not_allowed("DELETE"));
            }
            let filter = filter(&req.query, res, ns, None)?;
            let (preconditions, dry_run) = delete_options(&req)?;
            let (rv, deleted) = shared.write(|s| {
                let page = s.list(res, &filter, None, None, None)?;
                let mut deleted = Vec::new();
                for item in page.items {
                    let name = item
                        .pointer("/metadata/name")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    deleted.push(s.delete(res, ns, name, &preconditions, dry_run)?);
                }
                Ok::<_, ApiError>((s.revision(), deleted))
            })?;
            let items: Vec<Value> = deleted.iter().map(show).collect();
            Ok(json_response(
                200,
                &list_json(&req, res, version, rv, items, None, None),
            ))
        }
        (&Method::GET, Some(name)) => {
            let object = shared.read(|s| s.get(res, ns, name))?;
            Ok(json_response(200, &show(&object)))
        }
        (&Method::PUT, Some(name)) => {
            let body = req.body_json()?;
            let dry_run = req.dry_run()?;
            let updated =
                shared.write(|s| s.update(res, version, ns, name, body, target.status, dry_run))?;
            Ok(json_response(200, &show(&updated)))
        }
        (&Method::PATCH, Some(name)) => {
            let kind = PatchKind::from_content_type(&req.content_type).ok_or_else(|| {
                ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    format!(
                        "the body of the request was in an unknown format ({}) - accepted media types include: \
                         application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
                        req.content_type
                    ),
                )
            })?;
            if kind == PatchKind::Apply && req.query.get("fieldManager").is_none_or(str::is_empty) {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                ));
            }
            let dry_run = req.dry_run()?;
            let (patched, created) = shared.write(|s| {
                s.patch(
                    res,
                    version,
                    ns,
                    name,
                    kind,
                    &req.body,
                    target.status,
                    dry_run,
                )
            })?;
            Ok(json_response(
                if created { 201 } else { 200 },
                &show(&patched),
            ))
        }
        (&Method::DELETE, Some(name)) if !target.status => {
            let (preconditions, dry_run) = delete_options(&req)?;
            let deleted = shared.write(|s| s.delete(res, ns, name, &preconditions, dry_run))?;
            Ok(json_response(200, &show(&deleted)))
        }
        (method, _) => Err(ApiError::method_not_allowed(method.as_str())),
    }
}

fn present_for(req: &ApiRequest, object: &Value, res: &ResourceDef, version: &str) -> Value {
    if req.partial() {
        json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadata",
            "metadata": object.get("metadata").cloned().unwrap_or_else(|| json!({})),
        })
    } else {
        present(object, res, version)
    }
}

fn filter(
    query: &Query,
    res: &ResourceDef,
    namespace: Option<&str>,
    name: Option<&str>,
) -> Result<Filter, ApiError> {
    let mut fields = query.get("fieldSelector").unwrap_or_default().to_string();
    if let Some(name) = name {
        if !fields.is_empty() {
            fields.push(',');
        }
        fields.push_str(&format!("metadata.name={name}"));
    }
    Ok(Filter {
        namespace: namespace.map(String::from),
        labels: LabelSelector::parse(query.get("labelSelector").unwrap_or_default())
            .map_err(ApiError::bad_request)?,
        fields: FieldSelector::parse(&fields, res.fields).map_err(ApiError::bad_request)?,
    })
}

fn delete_options(req: &ApiRequest) -> Result<(Preconditions, bool), ApiError> {
    let mut dry_run = req.dry_run()?;
    let mut preconditions = Preconditions::default();
    if !req.body.is_empty() {
        let options: Value = serde_json::from_slice(&req.body)
            .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?;
        let text = |pointer: &str| {
            options
                .pointer(pointer)
                .and_then(Value::as_str)
                .map(String::from)
        };
        preconditions.uid = text("/preconditions/uid");
        preconditions.resource_version = text("/preconditions/resourceVersion");
        if let Some(values) = options.get("dryRun").and_then(Value::as_array) {
            dry_run |= values.iter().any(|v| v == "All");
        }
    }
    Ok((preconditions, dry_run))
}

#[allow(clippy::too_many_arguments)]
fn list_json(
    req: &ApiRequest,
    res: &ResourceDef,
    version: &str,
    rv: u64,
    items: Vec<Value>,
    continue_token: Option<String>,
    remaining: Option<usize>,
) -> Value {
    let (api_version, kind) = if req.partial() {
        (
            "meta.k8s.io/v1".to_string(),
            "PartialObjectMetadataList".to_string(),
        )
    } else {
        (res.api_version(version), res.list_kind.clone())
    };
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if let Some(token) = continue_token {
        metadata["continue"] = json!(token);
    }
    if let Some(remaining) = remaining {
        metadata["remainingItemCount"] = json!(remaining);
    }
    json!({"kind": kind, "apiVersion": api_version, "metadata": metadata, "items": items})
}

async fn serve_list(
    shared: &Arc<Shared>,
    req: &ApiRequest,
    target: &Target,
    filter: Filter,
) -> Result<Response<Body>, ApiError> {
    let delay = shared.faults().list_delay;
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let q = &req.query;
    let limit = q.number("limit")?.filter(|l| *l > 0).map(|l| l as usize);
    let rv = q.get("resourceVersion").filter(|rv| !rv.is_empty());
    let rv_match = q.get("resourceVersionMatch").filter(|m| !m.is_empty());
    let mut at = None;
    let mut start_after = None;
    let continue_token = q.get("continue").filter(|c| !c.is_empty());
    if let Some(token) = continue_token {
        if rv.is_some() {
            return Err(ApiError::bad_request(
                "specifying resource version is not allowed when using continue",
            ));
        }
        let (token_rv, key) = decode_continue(token)?;
        at = Some(token_rv);
        start_after = Some(key);
    } else {
        match (rv, rv_match) {
            (None, Some(_)) => {
                return Err(ApiError::bad_request(
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                ))
            }
            (None, None) | (Some("0"), None | Some("NotOlderThan")) => {}
            (Some("0"), Some(m)) => {
                return Err(ApiError::bad_request(format!(
                    "resourceVersionMatch {m:?} is forbidden for resourceVersion \"0\""
                )))
            }
            (Some(rv), m) => {
                let rv = parse_rv(rv)?;
                let exact = match m {
                    Some("Exact") => true,
                    Some("NotOlderThan") => false,
                    // Legacy semantics: a paginated list at an explicit version is exact.
                    None => limit.is_some(),
                    Some(other) => {
                        return Err(ApiError::bad_request(format!(
                            "unsupported resourceVersionMatch {other:?}"
                        )))
                    }
                };
                wait_for_revision(shared, rv).await?;
                if exact {
                    at = Some(rv);
                }
            }
        }
    }
    shared.count_list(&target.res);
    let page = shared.read(|s| {
        if let Some(at) = at.filter(|at| *at < s.oldest()) {
            return Err(ApiError::expired(if start_after.is_some() {
                "The provided continue parameter is too old to display a consistent list result. \
                 You can start a new list without the continue parameter."
                    .to_string()
            } else {
                format!(
                    "The resourceVersion for the provided list is too old: {at} ({})",
                    s.oldest()
                )
            }));
        }
        s.list(&target.res, &filter, at, limit, start_after.as_ref())
    })?;
    let token = page.next.as_ref().map(|key| encode_continue(page.rv, key));
    let remaining = (token.is_some() && filter.no_selectors()).then_some(page.remaining);
    let items: Vec<Value> = page
        .items
        .iter()
        .map(|o| present_for(req, o, &target.res, &target.version))
        .collect();
    Ok(json_response(
        200,
        &list_json(
            req,
            &target.res,
            &target.version,
            page.rv,
            items,
            token,
            remaining,
        ),
    ))
}

async fn wait_for_revision(shared: &Shared, rv: u64) -> Result<(), ApiError> {
    let mut revisions = shared.revision.subscribe();
    let deadline = Instant::now() + TOO_LARGE_RV_WAIT;
    loop {
        let current = *revisions.borrow_and_update();
        if current >= rv {
            return Ok(());
        }
        match tokio::time::timeout_at(deadline, revisions.changed()).await {
            Ok(Ok(())) => continue,
            _ => {
                return Err(ApiError::new(
                    504,
                    "Timeout",
                    format!("Too large resource version: {rv}, current: {current}"),
                ))
            }
        }
    }
}

fn serve_watch(
    shared: &Arc<Shared>,
    req: &ApiRequest,
    target: &Target,
    filter: Filter,
) -> Result<Response<Body>, ApiError> {
    let q = &req.query;
    let send_initial_events = q.bool("sendInitialEvents")?;
    let bookmarks = q.bool("allowWatchBookmarks")?.unwrap_or(false);
    let rv_match = q.get("resourceVersionMatch").filter(|m| !m.is_empty());
    let invalid = |why: &str| {
        ApiError::new(
            422,
            "Invalid",
            format!("ListOptions.meta.k8s.io \"\" is invalid: {why}"),
        )
    };
    if send_initial_events.is_some() {
        if rv_match != Some("NotOlderThan") {
            return Err(invalid(
                "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
        if send_initial_events == Some(true) && !bookmarks {
            return Err(invalid(
                "allowWatchBookmarks: Required value: sendInitialEvents requires setting allowWatchBookmarks to true",
            ));
        }
    } else if rv_match.is_some() {
        return Err(invalid(
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
        ));
    }
    let request = WatchRequest {
        res: target.res.clone(),
        version: target.version.clone(),
        filter,
        resource_version: q.get("resourceVersion").map(String::from),
        send_initial_events,
        bookmarks,
        // 0 means "the server's default" (here: no timeout), as on the real server.
        timeout: q
            .number("timeoutSeconds")?
            .filter(|t| *t > 0)
            .map(Duration::from_secs),
        partial: req.partial(),
    };
    let client = WatchClient {
        user_agent: req.user_agent.clone(),
        source: req.peer,
        resource: target.res.qualified(),
        namespace: target.namespace.clone(),
        label_selector: q
            .get("labelSelector")
            .filter(|s| !s.is_empty())
            .map(String::from),
    };
    let lines = watch::open(shared.clone(), request, client)?;
    let body = StreamBody::new(lines.map(|line| Ok::<_, Infallible>(Frame::data(line))));
    let mut response = Response::new(BodyExt::boxed_unsync(body));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(response)
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// An opaque continue token: the revision of the first page and the last key served, as
/// base64url JSON (the real server's token has the same content).
fn encode_continue(rv: u64, key: &ObjectKey) -> String {
    let doc = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{}/{}", key.0, key.1)})
        .to_string();
    let mut out = String::new();
    for chunk in doc.as_bytes().chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(char::from(BASE64[((n >> (18 - 6 * i)) & 63) as usize]));
        }
    }
    out
}

fn decode_continue(token: &str) -> Result<(u64, ObjectKey), ApiError> {
    let bad = || ApiError::bad_request(format!("continue key is not valid: {token:?}"));
    let mut bytes = Vec::new();
    let sextets: Vec<u32> = token
        .bytes()
        .map(|c| BASE64.iter().position(|b| *b == c).map(|p| p as u32))
        .collect::<Option<_>>()
        .ok_or_else(bad)?;
    for chunk in sextets.chunks(4) {
        if chunk.len() < 2 {
            return Err(bad());
        }
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, s)| n | (s << (18 - 6 * i)));
        for i in 0..chunk.len() - 1 {
            bytes.push((n >> (16 - 8 * i)) as u8);
        }
    }
    let doc: Value = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    let rv = doc.get("rv").and_then(Value::as_u64).ok_or_else(bad)?;
    let (ns, name) = doc
        .get("start")
        .and_then(Value::as_str)
        .and_then(|s| s.split_once('/'))
        .ok_or_else(bad)?;
    Ok((rv, (ns.to_string(), name.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip_and_reject_garbage() {
        for (ns, name) in [
            ("", "a"),
            ("default", "pod-1"),
            ("x", "yy"),
            ("abc", "d.e.f"),
        ] {
            let key = (ns.to_string(), name.to_string());
            let token = encode_continue(42, &key);
            assert_eq!(decode_continue(&token).unwrap(), (42, key));
        }
        assert!(decode_continue("!!!").is_err());
        assert!(decode_continue("e30").is_err()); // "{}"
    }

    #[test]
    fn queries_decode_percent_and_plus() {
        let q = Query::parse(Some(
            "&labelSelector=app%3Dweb%2Ctier+in+%28a%29&watch=true&x",
        ))
        .unwrap();
        assert_eq!(q.get("labelSelector"), Some("app=web,tier in (a)"));
        assert_eq!(q.bool("watch").unwrap(), Some(true));
        assert_eq!(q.get("x"), Some(""));
        assert!(Query::parse(Some("a=%zz")).is_err());
        assert!(q.number("labelSelector").is_err());
    }
}
