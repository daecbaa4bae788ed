//! `spore serve` driven by the Lambda ecosystem's own clients, pinned
//! (`tests/serve/requirements.txt`) and installed by the test setup into a
//! cached virtualenv (`scripts/ensure-pyclients.sh`): boto3
//! (`tests/serve/boto3_scenario.py`, run by `tests/serve/boto3_coverage.py`,
//! which holds docs/serve/lambda-api.md's table to botocore's Lambda model and
//! to the operations the scenario called) and the AWS CLI.

use std::process::Command;

use crate::common;
use crate::common::fc::repo_root;
use crate::common::serve::Daemon;
use crate::common::{require_kvm, Scratch};

pub(crate) fn client_venv() -> std::path::PathBuf {
    let out = Command::new(repo_root().join("scripts/ensure-pyclients.sh"))
        .output()
        .expect("running scripts/ensure-pyclients.sh");
    assert!(
        out.status.success(),
        "ensure-pyclients: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// `aws lambda ARGS` against `endpoint`, with throwaway credentials and no
/// configuration of the host's.
fn aws_lambda(venv: &std::path::Path, endpoint: &str, args: &[&str]) -> std::process::Output {
    Command::new(venv.join("bin/aws"))
        .arg("lambda")
        .args(args)
        .args(["--endpoint-url", endpoint, "--region", "us-east-1"])
        .env("AWS_ACCESS_KEY_ID", "AKIDSPORETEST")
        .env("AWS_SECRET_ACCESS_KEY", "spore-test-secret")
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .output()
        .expect("running aws lambda")
}

/// The boto3 scenario under the coverage walk (every operation of botocore's
/// model in the doc's table, every ✓ one called), then the AWS CLI, then
/// the tags the scenario left, after a restart.
#[test]
fn kvm_serve_boto3_and_aws_cli() {
    require_kvm();
    let venv = client_venv();
    let dir = Scratch::new("serve-clients");
    let d = Daemon::start(&dir.path("state"), &[]);
    let endpoint = format!("http://{}", d.addr);

    let out = Command::new(venv.join("bin/python"))
        .arg(repo_root().join("tests/serve/boto3_coverage.py"))
        .arg("--doc")
        .arg(repo_root().join("docs/serve/lambda-api.md"))
        .args(["--endpoint", &endpoint])
        .arg("--echo-elf")
        .arg(common::uk_image("fn-echo"))
        .arg("--upper-elf")
        .arg(common::uk_image("fn-upper"))
        .output()
        .expect("running the boto3 scenario");
    assert!(
        out.status.success(),
        "boto3 scenario or coverage failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // The AWS CLI invokes the function the scenario left.
    let response = dir.path("response.json");
    let out = aws_lambda(
        &venv,
        &endpoint,
        &[
            "invoke",
            "--function-name",
            "cli-echo",
            "--payload",
            r#"{"from":"aws-cli"}"#,
            response.to_str().expect("a UTF-8 scratch path"),
        ],
    );
    assert!(
        out.status.success(),
        "aws lambda invoke failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("aws prints JSON");
    assert_eq!(meta["StatusCode"], 200, "{meta}");
    assert_eq!(meta["ExecutedVersion"], "$LATEST", "{meta}");
    let body: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&response).unwrap()).unwrap();
    assert_eq!(body["echo"]["from"], "aws-cli", "{body}");

    let out = aws_lambda(&venv, &endpoint, &["list-functions"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list["Functions"][0]["FunctionName"], "cli-echo");

    // Tags live in the catalogue: a restarted daemon still has them.
    drop(d);
    let d = Daemon::start(&dir.path("state"), &[]);
    let endpoint = format!("http://{}", d.addr);
    let arn = "arn:aws:lambda:us-east-1:000000000000:function:cli-echo";
    let out = aws_lambda(&venv, &endpoint, &["list-tags", "--resource", arn]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tags: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(tags, serde_json::json!({ "Tags": { "made-by": "boto3" } }));
    let out = aws_lambda(
        &venv,
        &endpoint,
        &["tag-resource", "--resource", arn, "--tags", "aws:x=y"],
    );
    assert!(!out.status.success(), "an aws: key is refused");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("InvalidParameterValueException"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn kvm_serve_sigv4_auth() {
    require_kvm();
    let venv = client_venv();
    let dir = Scratch::new("serve-auth");
    let keys = dir.path("keys.toml");
    std::fs::write(
        &keys,
        "[[keys]]\naccess_key_id = \"AKIDSPORE\"\nsecret_access_key = \"s3cr3t/key+example\"\n",
    )
    .unwrap();
    let d = Daemon::start(&dir.path("state"), &["--auth", keys.to_str().unwrap()]);
    let out = Command::new(venv.join("bin/python"))
        .arg(repo_root().join("tests/serve/boto3_auth.py"))
        .args(["--endpoint", &format!("http://{}", d.addr)])
        .arg("--echo-elf")
        .arg(common::uk_image("fn-echo"))
        .args(["--key", "AKIDSPORE", "--secret", "s3cr3t/key+example"])
        .output()
        .expect("running the boto3 auth scenario");
    assert!(
        out.status.success(),
        "boto3 auth scenario failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Unsigned: refused, and nothing runs.
    let r = d.invoke("signed", b"{}");
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(r.error_type(), Some("MissingAuthenticationTokenException"));
}

/// Two accounts on one daemon (issue 30 item 1): boto3 with B's key cannot
/// see or touch A's functions (every answer as for a missing function), the
/// same name lives in both, metrics are per account, and A's concurrency and
/// function limits and B's memory limit hold (tests/serve/accounts_scenario.py).
#[test]
fn kvm_serve_accounts_through_boto3() {
    require_kvm();
    let venv = client_venv();
    let dir = Scratch::new("serve-accounts");
    let keys = dir.path("keys.toml");
    std::fs::write(
        &keys,
        "[[keys]]\naccess_key_id = \"AKIDA\"\nsecret_access_key = \"secret-a\"\n\
         account_id = \"111111111111\"\nconcurrency = 2\nfunctions = 3\n\
         [[keys]]\naccess_key_id = \"AKIDB\"\nsecret_access_key = \"secret-b\"\n\
         account_id = \"222222222222\"\nmemory = \"384M\"\n",
    )
    .unwrap();
    let d = Daemon::start(&dir.path("state"), &["--auth", keys.to_str().unwrap()]);
    let out = Command::new(venv.join("bin/python"))
        .arg(repo_root().join("tests/serve/accounts_scenario.py"))
        .args(["--endpoint", &format!("http://{}", d.addr)])
        .arg("--echo-elf")
        .arg(common::uk_image("fn-echo"))
        .output()
        .expect("running the accounts scenario");
    assert!(
        out.status.success(),
        "accounts scenario failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprint!("{}", String::from_utf8_lossy(&out.stdout));
}

/// A keys file with a duplicate access key or a bad account id: the daemon
/// refuses to start, with one line saying which.
#[test]
fn serve_refuses_bad_keys_files() {
    let dir = Scratch::new("serve-bad-keys");
    for (text, says) in [
        (
            "[[keys]]\naccess_key_id = \"K\"\nsecret_access_key = \"s\"\n\
             [[keys]]\naccess_key_id = \"K\"\nsecret_access_key = \"t\"\n",
            "access key K is given twice",
        ),
        (
            "[[keys]]\naccess_key_id = \"K\"\nsecret_access_key = \"s\"\naccount_id = \"12345\"\n",
            "not 12 digits",
        ),
    ] {
        let keys = dir.path("keys.toml");
        std::fs::write(&keys, text).unwrap();
        let out = common::spore()
            .args(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
            .arg(dir.path("state"))
            .arg("--auth")
            .arg(&keys)
            .output()
            .expect("running spore serve");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "started with {text}");
        assert!(err.contains(says), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
}
