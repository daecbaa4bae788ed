//! `/files`: downloads and uploads. (Being written.)

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};

use crate::api;
use crate::connect::Body;
use crate::state::Ctx;

pub async fn download(_ctx: Ctx, _req: Request<Incoming>) -> Response<Body> {
    api::error(StatusCode::NOT_IMPLEMENTED, "not yet")
}

pub async fn upload(_ctx: Ctx, _req: Request<Incoming>) -> Response<Body> {
    api::error(StatusCode::NOT_IMPLEMENTED, "not yet")
}
