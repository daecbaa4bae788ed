//! Function URLs: `curl` reaches a function over plain HTTP, its request
//! arrives as Lambda's payload 2.0 event and its answer goes back as HTTP
//! (status, headers, cookies, base64 bodies), by path prefix or host name;
//! AWS_IAM URLs need a signature, unknown ones are 403, bad configuration
//! gets Lambda's errors.

use std::process::Command;

use crate::common::serve::Daemon;
use crate::common::{require_kvm, Scratch};

/// `curl -s -i ARGS`: (status, headers lowercased, body).
fn curl(args: &[&str]) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let out = Command::new("curl")
        .args(["-s", "-i", "--max-time", "30"])
        .args(args)
        .output()
        .expect("running curl");
    assert!(
        out.status.success(),
        "curl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let split = out
        .stdout
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a header block");
    let head = String::from_utf8_lossy(&out.stdout[..split]).to_string();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, out.stdout[split + 4..].to_vec())
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

fn create_url(d: &Daemon, name: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let r = d.request(
        "POST",
        &format!("/2021-10-31/functions/{name}/url"),
        body.to_string().as_bytes(),
        &[],
    );
    (
        r.status,
        serde_json::from_slice(&r.body).unwrap_or_default(),
    )
}

#[test]
fn kvm_serve_function_urls_through_curl() {
    require_kvm();
    let dir = Scratch::new("urls");
    let d = Daemon::start(&dir.path("state"), &["--url-listen", "127.0.0.1:0"]);
    let url_addr = d.url_addr.clone().expect("the daemon printed url_listen");
    assert_eq!(
        d.create("web", "fn-echo", serde_json::json!({})).status,
        201
    );
    let http = serde_json::json!({ "Environment": { "Variables": { "ECHO_HTTP": "1" } } });
    assert_eq!(d.create("page", "fn-echo", http).status, 201);

    let (status, cfg) = create_url(
        &d,
        "web",
        serde_json::json!({ "AuthType": "NONE", "Cors": { "AllowOrigins": ["https://app.example"], "AllowMethods": ["POST"] } }),
    );
    assert_eq!(status, 201, "{cfg}");
    let url = cfg["FunctionUrl"].as_str().unwrap_or_default().to_string();
    assert!(
        url.starts_with(&format!("http://{url_addr}/")) && url.ends_with('/'),
        "{url}"
    );
    let url_id = url
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_string();

    // The request as Lambda's payload 2.0 event; the echo as a 200 JSON body.
    let (status, headers, body) = curl(&[
        &format!("{url}some/path?x=1&y=a%20b&x=2"),
        "-H",
        "Cookie: a=1; b=2",
        "-H",
        "X-Thing: v",
        "-H",
        "Origin: https://app.example",
        "-H",
        "Content-Type: application/json",
        "-d",
        r#"{"k":"v"}"#,
    ]);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(
        header(&headers, "access-control-allow-origin"),
        Some("https://app.example")
    );
    assert!(header(&headers, "x-amzn-requestid").is_some());
    let echoed: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    let ev = &echoed["echo"];
    assert_eq!(ev["version"], "2.0");
    assert_eq!(ev["rawPath"], "/some/path");
    assert_eq!(ev["rawQueryString"], "x=1&y=a%20b&x=2");
    assert_eq!(
        ev["queryStringParameters"],
        serde_json::json!({ "x": "1,2", "y": "a b" })
    );
    assert_eq!(ev["cookies"], serde_json::json!(["a=1", "b=2"]));
    assert_eq!(ev["headers"]["x-thing"], "v");
    assert!(ev["headers"].get("cookie").is_none());
    assert_eq!(ev["body"], r#"{"k":"v"}"#);
    assert_eq!(ev["isBase64Encoded"], false);
    assert_eq!(ev["requestContext"]["http"]["method"], "POST");
    assert_eq!(ev["requestContext"]["http"]["sourceIp"], "127.0.0.1");
    assert_eq!(ev["requestContext"]["apiId"], url_id.as_str());
    // A binary body arrives base64.
    let (_, _, body) = curl(&[
        &url,
        "-H",
        "Content-Type: application/octet-stream",
        "--data-binary",
        "\u{1}\u{2}",
    ]);
    let ev: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(ev["echo"]["isBase64Encoded"], true);
    assert_eq!(ev["echo"]["body"], "AQI=");
    // A CORS preflight is answered without the function.
    let (status, headers, _) = curl(&[
        "-X",
        "OPTIONS",
        &url,
        "-H",
        "Origin: https://app.example",
        "-H",
        "Access-Control-Request-Method: POST",
    ]);
    assert_eq!(status, 200);
    assert_eq!(
        header(&headers, "access-control-allow-methods"),
        Some("POST")
    );
    // By host name instead of path prefix.
    let (status, _, body) = curl(&[
        &format!("http://{url_addr}/by/host"),
        "-H",
        &format!("Host: {url_id}.lambda-url.us-east-1.example.com"),
    ]);
    assert_eq!(status, 200);
    let ev: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(ev["echo"]["rawPath"], "/by/host");
    // A function error is 502; a URL nobody configured is 403.
    let (status, _, _) = curl(&[&format!("{url}?fail=boom")]);
    assert_eq!(status, 502);
    let (status, _, _) = curl(&[&format!("http://{url_addr}/{}/", "a".repeat(32))]);
    assert_eq!(status, 403);

    // A function answering {statusCode, headers, cookies, body (base64)}.
    let (status, cfg) = create_url(&d, "page", serde_json::json!({ "AuthType": "NONE" }));
    assert_eq!(status, 201, "{cfg}");
    let page = cfg["FunctionUrl"].as_str().unwrap_or_default().to_string();
    let (status, headers, body) = curl(&[&format!("{page}hello")]);
    assert_eq!(status, 201);
    assert_eq!(header(&headers, "x-echo"), Some("1"));
    assert_eq!(header(&headers, "set-cookie"), Some("seen=1; Path=/"));
    let ev: serde_json::Value = serde_json::from_slice(&body).expect("the event, decoded");
    assert_eq!(ev["rawPath"], "/hello");

    bad_configuration_is_refused(&d);

    // AWS_IAM without the daemon's --auth keys: refused, never public.
    let r = d.request(
        "PUT",
        "/2021-10-31/functions/page/url",
        br#"{"AuthType":"AWS_IAM"}"#,
        &[],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(curl(&[&page]).0, 403);
    // Deleted: the URL is gone.
    assert_eq!(
        d.request("DELETE", "/2021-10-31/functions/web/url", b"", &[])
            .status,
        204
    );
    assert_eq!(curl(&[&url]).0, 403);
    let r = d.request("GET", "/2021-10-31/functions/web/url", b"", &[]);
    assert_eq!(r.status, 404, "{}", r.text());
}

fn bad_configuration_is_refused(d: &Daemon) {
    for (name, q, body, status) in [
        ("web", "", serde_json::json!({ "AuthType": "NONE" }), 409),
        ("web", "", serde_json::json!({ "AuthType": "OPEN" }), 400),
        ("web", "", serde_json::json!({}), 400),
        (
            "web",
            "",
            serde_json::json!({ "AuthType": "NONE", "InvokeMode": "RESPONSE_STREAM" }),
            400,
        ),
        (
            "web",
            "?Qualifier=1",
            serde_json::json!({ "AuthType": "NONE" }),
            400,
        ),
        (
            "web",
            "?Qualifier=nope",
            serde_json::json!({ "AuthType": "NONE" }),
            404,
        ),
        ("nobody", "", serde_json::json!({ "AuthType": "NONE" }), 404),
    ] {
        let r = d.request(
            "POST",
            &format!("/2021-10-31/functions/{name}/url{q}"),
            body.to_string().as_bytes(),
            &[],
        );
        assert_eq!(r.status, status, "{name}{q} {body}: {}", r.text());
    }
    let r = d.request("GET", "/2021-10-31/functions/web/urls", b"", &[]);
    let list: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
    assert_eq!(
        list["FunctionUrlConfigs"].as_array().map(Vec::len),
        Some(1),
        "{list}"
    );
}
