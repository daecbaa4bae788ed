//! The `process.Process` service. (Being written.)

use hyper::body::Incoming;
use hyper::{Request, Response};

use crate::connect::Body;
use crate::state::Ctx;

/// The processes envd started.
#[derive(Default)]
pub struct Processes {}

/// Serves `/process.Process/<method>`; `None` for a method it does not have.
pub async fn route(_ctx: Ctx, _method: &str, _req: Request<Incoming>) -> Option<Response<Body>> {
    None
}
