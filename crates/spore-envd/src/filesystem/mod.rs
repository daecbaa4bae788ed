//! The `filesystem.Filesystem` service. (Being written.)

pub mod watch;

use hyper::body::Incoming;
use hyper::{Request, Response};

use crate::connect::Body;
use crate::state::Ctx;

/// Serves `/filesystem.Filesystem/<method>`; `None` for a method it does not have.
pub async fn route(_ctx: Ctx, _method: &str, _req: Request<Incoming>) -> Option<Response<Body>> {
    None
}
