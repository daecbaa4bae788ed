//! Tags (`2017-03-31/tags/{ARN}`): TagResource, UntagResource and ListTags,
//! plus the `Tags` of CreateFunction and GetFunction, with Lambda's limits.
//! The resource is a function's unqualified ARN of this daemon (Lambda tags
//! neither versions nor aliases); every input is checked before anything is
//! stored, so a refused request changes nothing.

use std::sync::Arc;

use hyper::StatusCode;
use serde::Deserialize;

use super::error::{catalog_err, LambdaError};
use super::{empty_response, json_response, parse_json, Daemon, Req, Resp};
use crate::accounts::Account;
use crate::catalog::Function;
pub use crate::catalog::Tags;
use crate::config::REGION;

/// Lambda's limits.
const MAX_TAGS: usize = 50;
const MAX_KEY_CHARS: usize = 128;
const MAX_VALUE_CHARS: usize = 256;
/// Enough for 50 tags of the longest keys and values, JSON-escaped.
const BODY_LIMIT: usize = 1024 * 1024;

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct TagBody {
    tags: Option<Tags>,
}

/// A key or ARN as an error message shows it: cut after 40 characters.
fn shown(s: &str) -> String {
    if s.chars().count() <= 40 {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(40).collect::<String>())
    }
}

/// Lambda's pattern for keys and values: `[\p{L}\p{Z}\p{N}_.:/=+\-@]*`
/// (letters, spaces, digits of any script and these marks).
fn allowed_char(c: char) -> bool {
    c.is_alphanumeric() || (c.is_whitespace() && !c.is_control()) || "_.:/=+-@".contains(c)
}

fn check_key(key: &str) -> Result<(), LambdaError> {
    let n = key.chars().count();
    if n == 0 || n > MAX_KEY_CHARS {
        return Err(LambdaError::invalid(format!(
            "The tag key '{}' is {n} characters long: a tag key is 1 to {MAX_KEY_CHARS} characters",
            shown(key)
        )));
    }
    if key.get(..4).is_some_and(|p| p.eq_ignore_ascii_case("aws:")) {
        return Err(LambdaError::invalid(format!(
            "The tag key '{}' starts with 'aws:', a prefix reserved for AWS",
            shown(key)
        )));
    }
    if !key.chars().all(allowed_char) {
        return Err(LambdaError::invalid(format!(
            "The tag key '{}' has a character tags cannot have: only letters, digits, spaces and _ . : / = + - @",
            shown(key)
        )));
    }
    Ok(())
}

fn check_value(key: &str, value: &str) -> Result<(), LambdaError> {
    let n = value.chars().count();
    if n > MAX_VALUE_CHARS {
        return Err(LambdaError::invalid(format!(
            "The value of tag '{}' is {n} characters long: a tag value is at most {MAX_VALUE_CHARS} characters",
            shown(key)
        )));
    }
    if !value.chars().all(allowed_char) {
        return Err(LambdaError::invalid(format!(
            "The value of tag '{}' has a character tags cannot have: only letters, digits, spaces and _ . : / = + - @",
            shown(key)
        )));
    }
    Ok(())
}

/// Checks tags to be added: each key and value, and at most 50 in all once
/// added to the `existing` ones.
pub fn check(tags: &Tags, existing: &Tags) -> Result<(), LambdaError> {
    for (k, v) in tags {
        check_key(k)?;
        check_value(k, v)?;
    }
    let total = existing.len() + tags.keys().filter(|k| !existing.contains_key(*k)).count();
    if total > MAX_TAGS {
        return Err(LambdaError::invalid(format!(
            "A function has at most {MAX_TAGS} tags; these would make it {total}"
        )));
    }
    Ok(())
}

// Not control's `existing`: control calls this module (CreateFunction,
// GetFunction), and the modules of `api` import in one direction only.
fn existing(daemon: &Daemon, name: &str) -> Result<Function, LambdaError> {
    daemon
        .catalog
        .get(name)
        .map_err(catalog_err)?
        .ok_or_else(|| LambdaError::not_found(name))
}

fn not_found(arn: &str) -> LambdaError {
    LambdaError::new(
        StatusCode::NOT_FOUND,
        "ResourceNotFoundException",
        format!("Resource not found: {arn}"),
    )
}

/// The function a tag request's resource names: the path segment,
/// percent-decoded, must be `arn:aws:lambda:REGION:ACCOUNT:function:NAME`.
/// Another region's or account's ARN, or a resource spore has none of
/// (code signing configurations, event source mappings, …), is not found
/// here; anything that is not such an ARN is invalid.
fn resource_function(caller: &Account, segment: &str) -> Result<String, LambdaError> {
    let arn = super::percent_decode(segment).ok_or_else(|| {
        LambdaError::invalid("The resource ARN is not valid percent-encoded UTF-8")
    })?;
    let invalid = || {
        LambdaError::invalid(format!(
            "1 validation error detected: Value '{}' at 'resource' failed to satisfy constraint: Member must be a function ARN (arn:aws:lambda:{REGION}:{}:function:NAME)",
            shown(&arn),
            caller.id
        ))
    };
    let parts: Vec<&str> = arn.split(':').collect();
    let ["arn", partition, "lambda", region, account, kind, rest @ ..] = parts.as_slice() else {
        return Err(invalid());
    };
    if !partition.starts_with("aws") || rest.is_empty() {
        return Err(invalid());
    }
    match *kind {
        "function" => {}
        "code-signing-config"
        | "event-source-mapping"
        | "capacity-provider"
        | "network-connector" => return Err(not_found(&arn)),
        _ => return Err(invalid()),
    }
    if (*region, *account) != (REGION, caller.id.as_str()) {
        return Err(not_found(&arn));
    }
    let (name, qualifier) = match rest {
        [name] => (*name, None),
        [name, qualifier] => (*name, Some(*qualifier)),
        _ => return Err(invalid()),
    };
    super::check_name(name)?;
    if qualifier.is_some() {
        return Err(LambdaError::invalid(format!(
            "Tags on function versions and aliases are not supported: name the function's ARN without a qualifier (not '{}')",
            shown(&arn)
        )));
    }
    Ok(caller.key(name))
}

/// `TagResource`: adds tags, replacing the values of keys the function has.
pub async fn tag(
    daemon: &Arc<Daemon>,
    caller: &Account,
    resource: &str,
    req: Req,
) -> Result<Resp, LambdaError> {
    let name = resource_function(caller, resource)?;
    let body = super::body_within(&req, BODY_LIMIT, "TagResource")?;
    let b: TagBody = parse_json(&body)?;
    let tags = b
        .tags
        .ok_or_else(|| LambdaError::invalid("Tags is required"))?;
    let _admin = daemon.admin.lock().await;
    let f = existing(daemon, &name)?;
    let old = daemon.catalog.tags(&f.name).map_err(catalog_err)?;
    check(&tags, &old)?;
    daemon
        .catalog
        .add_tags(&f.name, &tags)
        .map_err(catalog_err)?;
    Ok(empty_response(StatusCode::NO_CONTENT))
}

/// `UntagResource`: the keys are the query's `tagKeys` (repeated).
pub async fn untag(
    daemon: &Arc<Daemon>,
    caller: &Account,
    resource: &str,
    req: &Req,
) -> Result<Resp, LambdaError> {
    let name = resource_function(caller, resource)?;
    let keys = query_tag_keys(req.uri().query().unwrap_or(""))?;
    let _admin = daemon.admin.lock().await;
    let f = existing(daemon, &name)?;
    daemon
        .catalog
        .remove_tags(&f.name, &keys)
        .map_err(catalog_err)?;
    Ok(empty_response(StatusCode::NO_CONTENT))
}

/// The checked `tagKeys` of a query: at least one.
fn query_tag_keys(query: &str) -> Result<Vec<String>, LambdaError> {
    let mut keys = Vec::new();
    for kv in query.split('&') {
        let Some(raw) = kv.strip_prefix("tagKeys=") else {
            continue;
        };
        let key = super::percent_decode(raw)
            .ok_or_else(|| LambdaError::invalid("A tag key is not valid percent-encoded UTF-8"))?;
        check_key(&key)?;
        keys.push(key);
    }
    if keys.is_empty() {
        return Err(LambdaError::invalid(
            "TagKeys is required: name at least one tag key to remove (?tagKeys=KEY)",
        ));
    }
    Ok(keys)
}

/// `ListTags`.
pub fn list(daemon: &Arc<Daemon>, caller: &Account, resource: &str) -> Result<Resp, LambdaError> {
    let f = existing(daemon, &resource_function(caller, resource)?)?;
    let tags = daemon.catalog.tags(&f.name).map_err(catalog_err)?;
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({ "Tags": tags }),
    ))
}

/// GetFunction's `Tags`, when the function has any.
pub fn add_to_function(
    daemon: &Daemon,
    name: &str,
    answer: &mut serde_json::Value,
) -> Result<(), LambdaError> {
    let tags = daemon.catalog.tags(name).map_err(catalog_err)?;
    if !tags.is_empty() {
        answer["Tags"] = serde_json::json!(tags);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(kv: &[(&str, &str)]) -> Tags {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn refused(r: Result<impl std::fmt::Debug, LambdaError>) -> String {
        let e = r.expect_err("refused");
        assert_eq!(
            (e.status, e.kind),
            (StatusCode::BAD_REQUEST, "InvalidParameterValueException")
        );
        e.message
    }

    #[test]
    fn keys_and_values_are_checked_as_lambda_does() {
        let none = Tags::new();
        check(
            &tags(&[("team", "spore"), ("empty", ""), ("ключ 1", "значение")]),
            &none,
        )
        .unwrap();
        check(&tags(&[("k/=+-@_.:", "v/=+-@_.: x")]), &none).unwrap();
        check(&tags(&[(&"k".repeat(128), &"v".repeat(256))]), &none).unwrap();
        assert!(refused(check(&tags(&[("", "v")]), &none)).contains("1 to 128"));
        refused(check(&tags(&[(&"k".repeat(129), "v")]), &none));
        refused(check(&tags(&[("k", &"v".repeat(257))]), &none));
        assert!(refused(check(&tags(&[("aws:x", "v")]), &none)).contains("aws:"));
        refused(check(&tags(&[("AWS:x", "v")]), &none));
        refused(check(&tags(&[("a\tb", "v")]), &none));
        refused(check(&tags(&[("k", "v;")]), &none));
        // A key cut inside a multi-byte character is no panic.
        check(&tags(&[("aaaé", "v")]), &none).unwrap();
    }

    #[test]
    fn at_most_fifty_tags_counting_those_kept() {
        let fifty: Tags = (0..50).map(|i| (format!("k{i}"), "v".into())).collect();
        check(&fifty, &Tags::new()).unwrap();
        // Replacing an existing key's value adds nothing.
        check(&tags(&[("k0", "new")]), &fifty).unwrap();
        assert!(refused(check(&tags(&[("k50", "v")]), &fifty)).contains("51"));
    }

    #[test]
    fn the_resource_is_an_unqualified_function_arn_of_this_daemon() {
        let me = Account::default_account();
        let resource_function = |s: &str| resource_function(&me, s);
        assert_eq!(
            resource_function("arn:aws:lambda:us-east-1:000000000000:function:echo").unwrap(),
            "echo"
        );
        assert_eq!(
            resource_function("arn%3Aaws%3Alambda%3Aus-east-1%3A000000000000%3Afunction%3Aecho")
                .unwrap(),
            "echo"
        );
        for other in [
            "arn:aws:lambda:us-east-1:123456789012:function:echo",
            "arn:aws:lambda:eu-west-1:000000000000:function:echo",
            "arn:aws:lambda:us-east-1:000000000000:event-source-mapping:1b2c3d4e-0000-0000-0000-000000000000",
            "arn:aws:lambda:us-east-1:000000000000:code-signing-config:csc-0123456789abcdef0",
        ] {
            let e = resource_function(other).unwrap_err();
            assert_eq!(
                (e.status, e.kind),
                (StatusCode::NOT_FOUND, "ResourceNotFoundException"),
                "{other}"
            );
        }
        for bad in [
            "echo",
            "000000000000:function:echo",
            "arn:aws:s3:us-east-1:000000000000:function:echo",
            "arn:aws:lambda:us-east-1:000000000000:layer:l",
            "arn:aws:lambda:us-east-1:000000000000:function:",
            "arn:aws:lambda:us-east-1:000000000000:function:..%2Fx",
            "arn:aws:lambda:us-east-1:000000000000:function:echo:$LATEST",
            "arn:aws:lambda:us-east-1:000000000000:function:echo:1:x",
            "%zz",
        ] {
            refused(resource_function(bad));
        }
    }

    #[test]
    fn untag_keys_come_from_the_query() {
        assert_eq!(
            query_tag_keys("tagKeys=a&tagKeys=b%20c&Other=x").unwrap(),
            vec!["a".to_string(), "b c".to_string()]
        );
        refused(query_tag_keys(""));
        refused(query_tag_keys("tagKeys=aws%3Ax"));
        refused(query_tag_keys("tagKeys=%zz"));
    }
}
