//! The sandbox API on `--sandbox-listen`: E2B's control API (the shapes of
//! its public OpenAPI description, which the `e2b` SDK's client is generated
//! from) and, on the same port, the sandbox proxy: a request carrying
//! `E2b-Sandbox-Id` (the SDK's `E2B_SANDBOX_URL` mode), or addressed to
//! `<port>-<id>.<domain>` (`--sandbox-domain`), goes to that port of that
//! sandbox (`super::proxy`).
//!
//! Authentication: `X-API-Key`, one of the keys file's `sandbox_api_key`s
//! (its account's sandboxes only); without `--auth`, every request is the
//! default account's.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use serde::Deserialize;

use super::lifecycle::NewSandbox;
use super::reply::{empty, error, json, Body};
use super::request::{form_pairs, parse, parse_or_default};
use super::template_api::{receive_upload, template_route};
use super::{
    envd, events, Record, SandboxError, Sandboxes, State, DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S,
};
use crate::accounts::DEFAULT_ACCOUNT;
use crate::auth::Keys;
use crate::network::egress::Egress;

/// Largest control request body (metadata and environment variables).
const MAX_BODY: usize = 1 << 20;

/// Serves one request on the sandbox listener.
pub async fn handle(
    sandboxes: Arc<Sandboxes>,
    keys: Option<&Keys>,
    req: Request<Incoming>,
    body_timeout: Duration,
) -> Response<Body> {
    if let Some((id, port)) = proxy_target(&req, sandboxes.domain.as_deref()) {
        return super::proxy::forward(&sandboxes, &id, port, req).await;
    }
    // A template build's file upload: the link's token is its key (the
    // SDK sends it without `X-API-Key`, as to a presigned URL).
    if req.method() == Method::PUT {
        let path = req.uri().path().to_string();
        if let ["templates", template_id, "files", hash] =
            path.split('/').skip(1).collect::<Vec<_>>().as_slice()
        {
            let token = form_pairs(req.uri().query().unwrap_or(""))
                .and_then(|p| p.into_iter().find(|(k, _)| k == "token").map(|(_, v)| v))
                .unwrap_or_default();
            return match receive_upload(&sandboxes, template_id, hash, &token, req, body_timeout)
                .await
            {
                Ok(()) => empty(200),
                Err(e) => error(e.status(), &e.to_string()),
            };
        }
    }
    let account = match account_of(keys, &req) {
        Some(a) => a,
        None => return error(401, "Invalid API key"),
    };
    match route(&sandboxes, &account, req, body_timeout).await {
        Ok(resp) => resp,
        Err(e) => error(e.status(), &e.to_string()),
    }
}

/// The account a request's `X-API-Key` names.
fn account_of(keys: Option<&Keys>, req: &Request<Incoming>) -> Option<String> {
    let Some(keys) = keys else {
        return Some(DEFAULT_ACCOUNT.to_string());
    };
    let key = req.headers().get("x-api-key")?.to_str().ok()?;
    keys.sandbox_account(key).map(|a| a.id.clone())
}

/// Where the proxy sends a request: `E2b-Sandbox-Id`/`E2b-Sandbox-Port`,
/// else a `Host` of `<port>-<id>.<domain>`.
fn proxy_target(req: &Request<Incoming>, domain: Option<&str>) -> Option<(String, u16)> {
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    if let Some(id) = header("e2b-sandbox-id") {
        let port = header("e2b-sandbox-port")
            .and_then(|p| p.parse().ok())
            .unwrap_or(envd::ENVD_PORT);
        return Some((id.to_string(), port));
    }
    let host = header("host")?;
    host_target(host, domain?)
}

/// `<port>-<id>.<domain>[:port]` → `(id, port)`.
fn host_target(host: &str, domain: &str) -> Option<(String, u16)> {
    let host = host.rsplit_once(':').map_or(host, |(h, p)| {
        if p.bytes().all(|b| b.is_ascii_digit()) {
            h
        } else {
            host
        }
    });
    let label = host.strip_suffix(domain)?.strip_suffix('.')?;
    let (port, id) = label.split_once('-')?;
    if id.is_empty() || id.contains('.') {
        return None;
    }
    Some((id.to_string(), port.parse().ok()?))
}

async fn route(
    sbx: &Arc<Sandboxes>,
    account: &str,
    req: Request<Incoming>,
    body_timeout: Duration,
) -> Result<Response<Body>, SandboxError> {
    // How the client reached this API (where a template's file uploads go).
    let base_url = req
        .headers()
        .get("host")
        .and_then(|h| h.to_str().ok())
        .map_or_else(String::new, |h| format!("http://{h}"));
    let method = req.method().clone();
    let path = req.uri().path().trim_end_matches('/').to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let parts: Vec<&str> = path.split('/').skip(1).collect();
    let body = read_body(req, body_timeout).await?;
    if matches!(
        parts.as_slice(),
        ["templates", ..] | ["v2" | "v3", "templates", ..]
    ) {
        return template_route(sbx, account, &method, &parts, &query, &body, &base_url).await;
    }
    match (&method, parts.as_slice()) {
        (&Method::GET, ["health"]) => Ok(empty(204)),
        (&Method::POST, ["sandboxes"] | ["v2", "sandboxes"]) => {
            let new: CreateBody = parse(&body)?;
            let rec = sbx.create(account, new.into_new()?).await?;
            Ok(json(201, sandbox_json(sbx, &rec)))
        }
        (&Method::GET, ["sandboxes"]) => {
            let q = ListQuery::parse(&query)?;
            let recs = sbx.list(account).await;
            let listed: Vec<_> = recs
                .iter()
                .filter(|r| r.state == State::Running && r.matches(&q.metadata))
                .map(listed_json)
                .collect();
            Ok(json(200, listed.into()))
        }
        (&Method::GET, ["v2", "sandboxes"]) => {
            let q = ListQuery::parse(&query)?;
            Ok(list_v2(sbx.list(account).await, &q))
        }
        (&Method::GET, ["sandboxes", id]) => {
            let rec = sbx.get(account, id).await?;
            Ok(json(200, detail_json(sbx, &rec)))
        }
        (&Method::DELETE, ["sandboxes", id]) => {
            sbx.kill(account, id).await?;
            Ok(empty(204))
        }
        (&Method::POST, ["sandboxes", id, "timeout"]) => {
            let t: TimeoutBody = parse(&body)?;
            sbx.set_timeout(account, id, timeout_s(Some(t.timeout))?)
                .await?;
            Ok(empty(204))
        }
        (&Method::POST, ["sandboxes", id, "refreshes"]) => {
            let r: RefreshBody = parse_or_default(&body)?;
            sbx.set_timeout(
                account,
                id,
                timeout_s(r.duration.or(Some(DEFAULT_TIMEOUT_S)))?,
            )
            .await?;
            Ok(empty(204))
        }
        (&Method::POST, ["sandboxes", id, "pause"]) => {
            sbx.pause(account, id).await?;
            Ok(empty(204))
        }
        (&Method::POST, ["sandboxes", id, "resume"]) => {
            let r: ResumeBody = parse_or_default(&body)?;
            let t = timeout_s(r.timeout.or(Some(DEFAULT_TIMEOUT_S)))?;
            if !sbx.resume(account, id, t, r.auto_pause).await? {
                return Err(SandboxError::Conflict(format!(
                    "sandbox \"{id}\" is already running"
                )));
            }
            Ok(json(201, sandbox_json(sbx, &sbx.get(account, id).await?)))
        }
        (&Method::POST, ["sandboxes", id, "connect"] | ["v2", "sandboxes", id, "connect"]) => {
            let c: ConnectBody = parse_or_default(&body)?;
            let t = timeout_s(c.timeout.or(Some(CONNECT_DEFAULT_TIMEOUT_S)))?;
            let resumed = sbx.resume(account, id, t, None).await?;
            let rec = sbx.get(account, id).await?;
            Ok(json(
                if resumed { 201 } else { 200 },
                sandbox_json(sbx, &rec),
            ))
        }
        (&Method::POST, ["sandboxes", id, "fork"]) => {
            let f: ForkBody = parse_or_default(&body)?;
            let count = f.count.unwrap_or(1);
            if !(1..=MAX_FORKS).contains(&count) {
                return Err(SandboxError::BadRequest(format!(
                    "count must be 1 to {MAX_FORKS}"
                )));
            }
            let timeout = f.timeout.map(|t| timeout_s(Some(t))).transpose()?;
            let results = sbx.fork(account, id, count, timeout).await?;
            let out: Vec<serde_json::Value> = results
                .iter()
                .map(|r| match r {
                    Ok(rec) => serde_json::json!({ "sandbox": sandbox_json(sbx, rec) }),
                    Err(e) => serde_json::json!({
                        "error": { "code": e.status(), "message": e.to_string() }
                    }),
                })
                .collect();
            Ok(json(201, out.into()))
        }
        (&Method::GET, ["sandboxes", id, "metrics"]) => {
            // Its history and a sample taken now, inside the asked window
            // (`start`, `end`: Unix seconds).
            let pairs = form_pairs(&query).ok_or_else(|| {
                SandboxError::BadRequest("invalid query: not form-encoded".into())
            })?;
            let bound = |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| n == k)
                    .map(|(_, v)| v.parse::<u64>())
                    .transpose()
                    .map_err(|_| {
                        SandboxError::BadRequest(format!(
                            "invalid query: {k} is not a number of seconds"
                        ))
                    })
            };
            let (start, end) = (bound("start")?, bound("end")?);
            let list = sbx.metrics(account, id, start, end).await?;
            Ok(json(200, list.into()))
        }
        (&Method::PUT, ["sandboxes", id, "network"]) => {
            // The SDK's update_network: the whole egress configuration,
            // what it leaves out cleared (so {} allows everything again).
            let u: NetworkUpdateBody = parse_or_default(&body)?;
            sbx.set_egress(account, id, u.egress()?).await?;
            Ok(empty(204))
        }
        (&Method::GET, ["sandboxes", id, "logs"]) => logs(sbx, account, id, &query, false).await,
        (&Method::GET, ["v2", "sandboxes", id, "logs"]) => {
            logs(sbx, account, id, &query, true).await
        }
        _ => Err(SandboxError::NotFound(format!(
            "no route for {method} {path}"
        ))),
    }
}

/// The most forks one request may ask for.
const MAX_FORKS: u32 = 100;
/// What `connect` gives a sandbox when it names no timeout (E2B's).
const CONNECT_DEFAULT_TIMEOUT_S: u64 = 300;

fn timeout_s(t: Option<u64>) -> Result<u64, SandboxError> {
    let t = t.unwrap_or(DEFAULT_TIMEOUT_S);
    if t > MAX_TIMEOUT_S {
        return Err(SandboxError::BadRequest(format!(
            "timeout {t} s is longer than the most a sandbox may run, {MAX_TIMEOUT_S} s"
        )));
    }
    Ok(t)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CreateBody {
    #[serde(rename = "templateID")]
    template_id: String,
    timeout: Option<u64>,
    auto_pause: Option<bool>,
    auto_resume: Option<AutoResume>,
    metadata: Option<BTreeMap<String, String>>,
    env_vars: Option<BTreeMap<String, String>>,
    /// E2B's name is in snake case here, unlike the others.
    #[serde(rename = "allow_internet_access", alias = "allowInternetAccess")]
    allow_internet_access: Option<bool>,
    network: Option<NetworkBody>,
}

/// E2B's `SandboxNetworkConfig` (and, flattened, the rules of its
/// `SandboxNetworkUpdateConfig`): egress rules by IPv4 address and CIDR
/// block. What spore cannot enforce (domain names, header rules, an egress
/// proxy, sandbox URLs behind a traffic token) is refused, never ignored: a
/// sandbox must never have more network than its creator asked for.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct NetworkBody {
    #[serde(default)]
    allow_out: Vec<String>,
    #[serde(default)]
    deny_out: Vec<String>,
    /// Only used to resolve domain names in `allowOut`, which are refused.
    #[serde(default, rename = "dnsServers")]
    _dns_servers: Option<serde_json::Value>,
    #[serde(default)]
    rules: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    egress_proxy: Option<serde_json::Value>,
    #[serde(default)]
    allow_public_traffic: Option<bool>,
    #[serde(default)]
    mask_request_host: Option<String>,
}

impl NetworkBody {
    fn egress(&self) -> Result<Egress, SandboxError> {
        let unsupported = |what: &str| {
            Err(SandboxError::BadRequest(format!(
                "network.{what} is not supported by spore (its egress rules are IPv4 addresses \
                 and CIDR blocks in allowOut/denyOut)"
            )))
        };
        if self.rules.as_ref().is_some_and(|r| !r.is_empty()) {
            return unsupported("rules");
        }
        if self.egress_proxy.as_ref().is_some_and(|p| !p.is_null()) {
            return unsupported("egressProxy");
        }
        if self.allow_public_traffic == Some(false) {
            return unsupported("allowPublicTraffic = false (sandbox URLs behind a token)");
        }
        if self.mask_request_host.is_some() {
            return unsupported("maskRequestHost");
        }
        Egress::parse(&self.allow_out, &self.deny_out)
            .map_err(|e| SandboxError::BadRequest(format!("network.{e}")))
    }
}

/// E2B's `SandboxNetworkUpdateConfig`: the whole egress configuration, what
/// it leaves out cleared.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct NetworkUpdateBody {
    #[serde(alias = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    #[serde(flatten)]
    rules: NetworkBody,
}

impl NetworkUpdateBody {
    fn egress(&self) -> Result<Egress, SandboxError> {
        let egress = self.rules.egress()?;
        Ok(if self.allow_internet_access == Some(false) {
            egress.and_closed()
        } else {
            egress
        })
    }
}

/// E2B's `SandboxAutoResumeConfig`.
#[derive(Deserialize)]
struct AutoResume {
    enabled: bool,
}

impl CreateBody {
    fn into_new(self) -> Result<NewSandbox, SandboxError> {
        let auto_pause = self.auto_pause.unwrap_or(false);
        let auto_resume = self.auto_resume.is_some_and(|a| a.enabled);
        if auto_resume && !auto_pause {
            return Err(SandboxError::BadRequest(
                "autoResume needs autoPause: only a sandbox its timeout pauses can be resumed by a request".into(),
            ));
        }
        let egress = match &self.network {
            Some(n) => n.egress()?,
            None => Egress::default(),
        };
        // `allow_internet_access: false` is `denyOut: ["0.0.0.0/0"]`.
        let egress = if self.allow_internet_access == Some(false) {
            egress.and_closed()
        } else {
            egress
        };
        Ok(NewSandbox {
            template: self.template_id,
            timeout_s: timeout_s(self.timeout)?,
            auto_pause,
            auto_resume,
            metadata: self.metadata.unwrap_or_default(),
            env_vars: self.env_vars.unwrap_or_default(),
            egress,
        })
    }
}

#[derive(Deserialize)]
struct TimeoutBody {
    timeout: u64,
}

#[derive(Deserialize, Default)]
struct RefreshBody {
    duration: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ResumeBody {
    timeout: Option<u64>,
    auto_pause: Option<bool>,
}

#[derive(Deserialize, Default)]
struct ConnectBody {
    timeout: Option<u64>,
}

#[derive(Deserialize, Default)]
struct ForkBody {
    timeout: Option<u64>,
    count: Option<u32>,
}

/// `GET /sandboxes` and `/v2/sandboxes`' query: `metadata` (itself a
/// form-encoded `k=v&...`), `state` (comma-separated), `limit`, `nextToken`
/// (the offset where the last page ended).
struct ListQuery {
    metadata: Vec<(String, String)>,
    states: Option<Vec<State>>,
    limit: usize,
    offset: usize,
}

impl ListQuery {
    fn parse(query: &str) -> Result<ListQuery, SandboxError> {
        let bad = |what: &str| SandboxError::BadRequest(format!("invalid query: {what}"));
        let mut q = ListQuery {
            metadata: Vec::new(),
            states: None,
            limit: 100,
            offset: 0,
        };
        for (k, v) in form_pairs(query).ok_or_else(|| bad("not form-encoded"))? {
            match k.as_str() {
                "metadata" => {
                    q.metadata = form_pairs(&v).ok_or_else(|| bad("metadata"))?;
                }
                "state" => {
                    let mut states = Vec::new();
                    for s in v.split(',').filter(|s| !s.is_empty()) {
                        states.push(match s {
                            "running" => State::Running,
                            "paused" => State::Paused,
                            _ => return Err(bad("state is running or paused")),
                        });
                    }
                    q.states = Some(states);
                }
                "limit" => {
                    q.limit = v
                        .parse()
                        .ok()
                        .filter(|l| (1..=1000).contains(l))
                        .ok_or_else(|| bad("limit is 1 to 1000"))?;
                }
                "nextToken" => q.offset = v.parse().map_err(|_| bad("nextToken"))?,
                _ => {}
            }
        }
        Ok(q)
    }
}

fn list_v2(recs: Vec<Record>, q: &ListQuery) -> Response<Body> {
    let matching: Vec<&Record> = recs
        .iter()
        .filter(|r| q.states.as_ref().is_none_or(|s| s.contains(&r.state)))
        .filter(|r| r.matches(&q.metadata))
        .collect();
    let page: Vec<serde_json::Value> = matching
        .iter()
        .skip(q.offset)
        .take(q.limit)
        .map(|r| listed_json(r))
        .collect();
    let mut resp = json(200, page.into());
    let next = q.offset + q.limit;
    if next < matching.len() {
        if let Ok(v) = hyper::header::HeaderValue::from_str(&next.to_string()) {
            resp.headers_mut().insert("x-next-token", v);
        }
    }
    resp
}

/// E2B's `Sandbox` (create, connect, resume, fork).
fn sandbox_json(sbx: &Sandboxes, r: &Record) -> serde_json::Value {
    serde_json::json!({
        "templateID": r.template,
        "sandboxID": r.id,
        "clientID": "spore",
        "alias": r.template,
        "envdVersion": envd::ENVD_VERSION,
        "envdAccessToken": r.access_token,
        "trafficAccessToken": null,
        "domain": sbx.domain,
    })
}

/// E2B's `ListedSandbox`.
fn listed_json(r: &Record) -> serde_json::Value {
    serde_json::json!({
        "templateID": r.template,
        "sandboxID": r.id,
        "clientID": "spore",
        "alias": r.template,
        "startedAt": crate::clock::iso_ms(r.started_at_ms),
        "endAt": crate::clock::iso_ms(r.end_at_ms),
        "cpuCount": r.cpu_count,
        "memoryMB": r.memory_mib,
        "diskSizeMB": r.disk_mib,
        "state": r.state.as_str(),
        "envdVersion": envd::ENVD_VERSION,
        "metadata": r.metadata,
    })
}

/// A sandbox's log: E2B's v2 form (`logs`: entries) or its older one
/// (`logs`: lines, `logEntries`: entries).
async fn logs(
    sbx: &Sandboxes,
    account: &str,
    id: &str,
    query: &str,
    v2: bool,
) -> Result<Response<Body>, SandboxError> {
    let got = sbx.log(account, id, &logs_query(query)?).await?;
    let entries: Vec<_> = got.iter().map(log_entry_json).collect();
    if v2 {
        return Ok(json(200, serde_json::json!({ "logs": entries })));
    }
    let lines: Vec<_> = got
        .iter()
        .map(|e| {
            serde_json::json!({
                "timestamp": crate::clock::iso_ms(e.at_ms),
                "line": e.message,
            })
        })
        .collect();
    Ok(json(
        200,
        serde_json::json!({ "logs": lines, "logEntries": entries }),
    ))
}

/// A logs request's query ([`events::Query`]).
fn logs_query(query: &str) -> Result<events::Query, SandboxError> {
    let pairs = form_pairs(query)
        .ok_or_else(|| SandboxError::BadRequest("invalid query: not form-encoded".into()))?;
    events::Query::from_pairs(pairs)
        .map_err(|e| SandboxError::BadRequest(format!("invalid query: {e}")))
}

/// E2B's `SandboxLogEntry`.
fn log_entry_json(e: &events::Event) -> serde_json::Value {
    serde_json::json!({
        "timestamp": crate::clock::iso_ms(e.at_ms),
        "level": e.level,
        "message": e.message,
        "fields": e.fields,
    })
}

/// E2B's `SandboxDetail`.
fn detail_json(sbx: &Sandboxes, r: &Record) -> serde_json::Value {
    let mut v = listed_json(r);
    v["envdAccessToken"] = r.access_token.clone().into();
    v["domain"] = serde_json::json!(sbx.domain);
    v["lifecycle"] = serde_json::json!({
        "autoResume": r.auto_resume,
        "onTimeout": if r.auto_pause { "pause" } else { "kill" },
    });
    // Whether it can reach beyond its own VM: a network and the NAT.
    let egress = r.egress();
    v["allowInternetAccess"] = (r.networked && egress.internet()).into();
    if r.networked && egress != Egress::default() {
        let list =
            |nets: &[ipnet::Ipv4Net]| nets.iter().map(ToString::to_string).collect::<Vec<_>>();
        v["network"] = serde_json::json!({
            "allowOut": list(&egress.allow),
            "denyOut": list(&egress.deny),
        });
    }
    v
}

async fn read_body(req: Request<Incoming>, pause_limit: Duration) -> Result<Bytes, SandboxError> {
    let collected = tokio::time::timeout(
        pause_limit,
        Limited::new(req.into_body(), MAX_BODY).collect(),
    )
    .await
    .map_err(|_| SandboxError::BadRequest("the request body did not arrive in time".into()))?
    .map_err(|e| SandboxError::BadRequest(format!("reading the request body: {e}")))?;
    Ok(collected.to_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_name_a_port_and_a_sandbox() {
        assert_eq!(
            host_target("8080-abc123.sbx.example.com", "sbx.example.com"),
            Some(("abc123".into(), 8080))
        );
        assert_eq!(
            host_target("49983-abc.sbx.test:3000", "sbx.test"),
            Some(("abc".into(), 49983))
        );
        assert_eq!(host_target("api.sbx.test", "sbx.test"), None);
        assert_eq!(host_target("x-abc.sbx.test", "sbx.test"), None);
        assert_eq!(host_target("80-a.b.sbx.test", "sbx.test"), None);
        assert_eq!(host_target("80-abc.other.test", "sbx.test"), None);
    }

    #[test]
    fn list_queries_are_parsed_as_the_sdk_sends_them() {
        // The SDK form-encodes the metadata, then the whole query again.
        let q = ListQuery::parse("metadata=run%3Dab%26suite%3Dspore&state=running,paused&limit=5")
            .unwrap();
        assert_eq!(
            q.metadata,
            vec![
                ("run".into(), "ab".into()),
                ("suite".into(), "spore".into())
            ]
        );
        assert_eq!(q.states, Some(vec![State::Running, State::Paused]));
        assert_eq!(q.limit, 5);
        assert!(ListQuery::parse("state=gone").is_err());
        assert!(ListQuery::parse("limit=0").is_err());
        assert!(ListQuery::parse("metadata=%zz").is_err());
    }

    #[test]
    fn internet_access_is_on_unless_either_way_of_denying_it_says_so() {
        let egress = |body: &str| {
            serde_json::from_str::<CreateBody>(body)
                .unwrap()
                .into_new()
                .map(|n| n.egress)
        };
        let internet = |body: &str| egress(body).map(|e| e.internet());
        assert!(internet(r#"{"templateID":"base"}"#).unwrap());
        assert!(internet(r#"{"templateID":"base","allow_internet_access":true}"#).unwrap());
        assert!(!internet(r#"{"templateID":"base","allow_internet_access":false}"#).unwrap());
        assert!(!internet(r#"{"templateID":"base","network":{"denyOut":["0.0.0.0/0"]}}"#).unwrap());
        assert!(!internet(
            r#"{"templateID":"base","allow_internet_access":true,"network":{"denyOut":["0.0.0.0/0"]}}"#
        )
        .unwrap());
        assert!(
            internet(r#"{"templateID":"base","network":{"allowPublicTraffic":true}}"#).unwrap()
        );
        let update = |body: &str| {
            serde_json::from_str::<NetworkUpdateBody>(body)
                .unwrap()
                .egress()
        };
        assert_eq!(update("{}").unwrap(), Egress::default());
        assert_eq!(
            update(r#"{"allow_internet_access":false}"#).unwrap(),
            Egress::closed()
        );
        assert_eq!(
            update(r#"{"denyOut":["0.0.0.0/0"]}"#).unwrap(),
            Egress::closed()
        );
        let some = update(r#"{"allowOut":["8.8.8.8"],"denyOut":["0.0.0.0/0"]}"#).unwrap();
        assert_eq!((some.allow.len(), some.internet()), (1, false));
        let closed_but =
            update(r#"{"allow_internet_access":false,"allowOut":["8.8.8.8"]}"#).unwrap();
        assert_eq!((closed_but.allow.len(), closed_but.internet()), (1, false));
        // Per-destination rules are taken.
        let rules = egress(
            r#"{"templateID":"base","network":{"allowOut":["1.1.1.1"],"denyOut":["10.0.0.0/8"]}}"#,
        )
        .unwrap();
        assert_eq!(
            (rules.allow.len(), rules.deny.len(), rules.internet()),
            (1, 1, true)
        );
        // What spore cannot enforce is refused, never ignored.
        for refused in [
            r#"{"templateID":"base","network":{"allowOut":["pypi.org"],"denyOut":["0.0.0.0/0"]}}"#,
            r#"{"templateID":"base","network":{"denyOut":["::/0"]}}"#,
            r#"{"templateID":"base","network":{"allowPublicTraffic":false}}"#,
            r#"{"templateID":"base","network":{"rules":{"api.example.com":[{"headers":{}}]}}}"#,
            r#"{"templateID":"base","network":{"egressProxy":{"address":"1.2.3.4:3128"}}}"#,
            r#"{"templateID":"base","network":{"maskRequestHost":"${PORT}-x.example.com"}}"#,
        ] {
            assert!(
                matches!(egress(refused), Err(SandboxError::BadRequest(_))),
                "{refused}"
            );
        }
    }

    #[test]
    fn timeouts_are_bounded() {
        assert_eq!(timeout_s(None).unwrap(), DEFAULT_TIMEOUT_S);
        assert_eq!(timeout_s(Some(60)).unwrap(), 60);
        assert!(timeout_s(Some(MAX_TIMEOUT_S + 1)).is_err());
    }
}
