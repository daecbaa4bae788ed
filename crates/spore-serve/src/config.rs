//! What the daemon says about where it runs: the one region and account
//! every ARN names and every guest is told (spore is one host, not AWS).

pub const REGION: &str = "us-east-1";
pub const ACCOUNT: &str = "000000000000";

/// The ARN of function `name`.
pub fn function_arn(name: &str) -> String {
    format!("arn:aws:lambda:{REGION}:{ACCOUNT}:function:{name}")
}
