//! `spore api SOCK METHOD PATH [BODY]`: one request to a VMM's API socket
//! (what `curl --unix-socket` does), for scripts and hosts without curl.
//! Prints the response body; exits 1 on an HTTP error status. The request
//! itself is spore-vmm's client ([`spore_vmm::api::client`]), which the
//! other commands that talk to a VMM use too (through this module's
//! re-export).

use std::path::PathBuf;

use anyhow::bail;
use clap::Args;
pub(crate) use spore_vmm::api::client::request;

#[derive(Args, Debug)]
pub struct ApiArgs {
    /// The VMM's API socket.
    pub socket: PathBuf,
    /// GET, PUT or PATCH.
    pub method: String,
    /// e.g. /machine-config
    pub path: String,
    /// JSON body.
    pub body: Option<String>,
}

pub fn run(a: ApiArgs) -> anyhow::Result<u8> {
    let method = a.method.to_ascii_uppercase();
    if !matches!(method.as_str(), "GET" | "PUT" | "PATCH" | "DELETE" | "POST") {
        bail!("unknown HTTP method {:?}", a.method);
    }
    if !a.path.starts_with('/') || a.path.contains(char::is_whitespace) {
        bail!(
            "the path must start with / and contain no spaces: {:?}",
            a.path
        );
    }
    let body = a.body.unwrap_or_default();
    let (status, body) = request(&a.socket, &method, &a.path, &body)?;
    if !body.is_empty() {
        println!("{body}");
    }
    if status >= 400 {
        bail!("{method} {} -> HTTP {status}", a.path);
    }
    Ok(0)
}
