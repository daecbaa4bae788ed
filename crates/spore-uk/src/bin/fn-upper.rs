//! fn-upper: a `spore serve` function that answers its payload with ASCII
//! letters upper-cased (the "new code" of update tests).
#![no_std]
#![no_main]

extern crate alloc;

use spore_uk::function::{self, Context, Response};
use spore_uk::{flog, BootInfo};

spore_uk::entry!(main);

fn main(info: &BootInfo) -> i32 {
    function::serve(info, handle)
}

fn handle(event: &[u8], ctx: &Context) -> Response {
    flog!("fn-upper: request {}", ctx.request_id);
    Ok(event.to_ascii_uppercase())
}
