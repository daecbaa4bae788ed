//! What the daemon says about where it runs: the one region every ARN
//! names and every guest is told (spore is one host, not AWS), and the
//! ARNs of functions, which carry their account.

use crate::accounts::{function_key, split_key};

pub const REGION: &str = "us-east-1";

/// The ARN of the function with catalogue key `key` (see
/// [`crate::accounts`]): its own account's.
pub fn function_arn(key: &str) -> String {
    let (account, name) = split_key(key);
    format!("arn:aws:lambda:{REGION}:{account}:function:{name}")
}

/// The function key an ARN this daemon wrote names (`arn:aws:lambda:
/// REGION:ACCOUNT:function:NAME`), for ARNs stored in the catalogue (event
/// destinations); never for ARNs a request gives, which are checked against
/// the caller's account in [`crate::api`].
pub fn key_of_arn(arn: &str) -> Option<String> {
    let (owner, name) = arn.rsplit_once(":function:")?;
    let account = owner.rsplit(':').next()?;
    Some(function_key(account, name))
}
