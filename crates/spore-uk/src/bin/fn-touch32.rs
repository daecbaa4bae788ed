//! fn-touch32: a `spore serve` function that writes 32 MiB of heap on init
//! (a function with a real working set, for `spore bench serve`), then
//! answers `{"echo":<payload>,"touched_mib":32}` after checking one page's pattern.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::vec::Vec;

use spore_uk::function::{self, Context, FunctionError, Response};
use spore_uk::BootInfo;

spore_uk::entry!(main);

const MIB: usize = 1 << 20;

fn main(info: &BootInfo) -> i32 {
    let mut data: Vec<u8> = Vec::new();
    if data.try_reserve_exact(32 * MIB).is_err() {
        spore_uk::println!("fn-touch32: cannot allocate 32 MiB");
        return 1;
    }
    // Every page written with a pattern, kept for the instance's life.
    data.resize(32 * MIB, 0);
    for (i, page) in data.chunks_mut(4096).enumerate() {
        page[0] = i as u8;
    }
    function::serve(info, move |event, ctx: &Context| -> Response {
        // One page per invocation is checked (not all 32 MiB: the bench
        // measures start paths, not the handler's memory bandwidth).
        let page = (ctx.served as usize * 7919) % (data.len() / 4096);
        if data[page * 4096] != page as u8 {
            return Err(FunctionError::new("Corrupt", "a page lost its pattern"));
        }
        let mut out = Vec::new();
        out.extend_from_slice(b"{\"echo\":");
        out.extend_from_slice(event);
        out.extend_from_slice(b",\"touched_mib\":32}");
        Ok(out)
    })
}
