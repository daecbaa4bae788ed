//! cpuid: prints the CPUID leaf named by `leaf=` (hex, default 1) and
//! `subleaf=` (hex, default 0) as one line,
//! `cpuid 0x1/0x0: eax=… ebx=… ecx=… edx=…`, `rounds=N` times (default 1)
//! 100 ms apart, then exits 0. The host tests use it to see what a
//! `PUT /cpu-config` left in the table the guest reads, before and after a
//! snapshot restore.
#![no_std]
#![no_main]

use spore_uk::{println, BootInfo};

spore_uk::entry!(main);

fn hex_arg(key: &str, default: u32) -> Result<u32, ()> {
    match spore_uk::arg(key) {
        None => Ok(default),
        Some(v) => u32::from_str_radix(v.trim_start_matches("0x"), 16).map_err(|_| ()),
    }
}

fn main(_info: &BootInfo) -> i32 {
    let (Ok(leaf), Ok(subleaf)) = (hex_arg("leaf", 1), hex_arg("subleaf", 0)) else {
        println!("leaf= and subleaf= take hexadecimal numbers");
        return 1;
    };
    let rounds = match spore_uk::arg("rounds").map(str::parse::<u32>) {
        None => 1,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            println!("rounds= takes a number");
            return 1;
        }
    };
    for i in 0..rounds {
        let r = core::arch::x86_64::__cpuid_count(leaf, subleaf);
        println!(
            "cpuid {leaf:#x}/{subleaf:#x}: eax={:#010x} ebx={:#010x} ecx={:#010x} edx={:#010x} round {i}",
            r.eax, r.ebx, r.ecx, r.edx
        );
        if i + 1 < rounds {
            // WAIT may end early (any device interrupt): sleep it out.
            let start = spore_uk::clock::Instant::now();
            while start.elapsed_us().is_some_and(|us| us < 100_000) {
                spore_uk::wait(100_000);
            }
        }
    }
    0
}
