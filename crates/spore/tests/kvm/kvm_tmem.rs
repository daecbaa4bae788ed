//! Host-KVM tier: the tmem API of a running microVM (`GET`/`PUT /tmem`).
//! The guest-side calls are covered in-process by the device tests in
//! `spore-vmm` (real guest memory) and end to end by the unikernel tmem
//! client's tests; here the point is the API against a real VMM process.

use crate::common::*;

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[test]
fn kvm_tmem_api_before_and_after_start() {
    require_kvm();
    let dir = Scratch::new("tmem-api");
    let sock = dir.path("api.sock");
    let child = spawn_vmm(&sock);

    let (code, body) = http(&sock, "GET", "/tmem", None);
    assert_eq!(code, 200, "{body}");
    let j = json(&body);
    assert_eq!(j["enabled"], true);
    assert_eq!(j["quota_bytes"], 256u64 << 20);
    assert_eq!(j["compression"], "none");

    // Bad bodies: unknown field, unknown compression, empty update.
    for bad in [r#"{"quota":1}"#, r#"{"compression":"zip"}"#, "{}"] {
        let (code, body) = http(&sock, "PUT", "/tmem", Some(bad));
        assert_eq!(code, 400, "{bad}: {body}");
        assert!(body.contains("fault_message"), "{body}");
    }
    let (code, body) = http(
        &sock,
        "PUT",
        "/tmem",
        Some(r#"{"quota_bytes": 1048576, "compression": "lz4"}"#),
    );
    assert_eq!(code, 204, "{body}");

    let boot = format!(
        r#"{{"kernel_image_path": "{}", "boot_args": "secs=60"}}"#,
        uk_image("idle").display()
    );
    assert_eq!(http(&sock, "PUT", "/boot-source", Some(&boot)).0, 204);
    assert_eq!(
        http(
            &sock,
            "PUT",
            "/actions",
            Some(r#"{"action_type": "InstanceStart"}"#)
        )
        .0,
        204
    );

    let j = json(&http(&sock, "GET", "/tmem", None).1);
    assert_eq!(j["enabled"], true);
    assert_eq!(j["quota_bytes"], 1u64 << 20);
    assert_eq!(j["compression"], "lz4");
    for counter in [
        "objects",
        "bytes_used",
        "bytes_stored",
        "puts",
        "gets",
        "refused",
    ] {
        assert_eq!(j[counter], 0, "{counter} in {j}");
    }

    // Running: the quota can move both ways; compression is fixed.
    let (code, body) = http(&sock, "PUT", "/tmem", Some(r#"{"compression": "none"}"#));
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("quota_bytes"), "{body}");
    assert_eq!(
        http(&sock, "PUT", "/tmem", Some(r#"{"quota_bytes": 4194304}"#)).0,
        204
    );
    assert_eq!(
        json(&http(&sock, "GET", "/tmem", None).1)["quota_bytes"],
        4u64 << 20
    );
    assert_eq!(
        http(&sock, "PUT", "/tmem", Some(r#"{"quota_bytes": 0}"#)).0,
        204
    );
    assert_eq!(json(&http(&sock, "GET", "/tmem", None).1)["quota_bytes"], 0);
    assert!(http(&sock, "GET", "/", None).1.contains("Running"));

    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(128 + libc::SIGTERM),
        "stderr: {}",
        stderr_of(&out)
    );
}

/// A hand-assembled ring-3 program for the unikernel boot protocol: real
/// tmem calls through real KVM port-I/O exits, with no dependency on the
/// unikernel runtime. It exits through the signal port with 42 when every
/// check passed, or with the number of the failed check (100 + status for
/// the first PUT, 200 + status for the hostile one).
mod guest {
    pub const LOAD: u64 = 0x20_0000;
    const BLOCKS: u64 = LOAD + 0x1000;
    const KEY: u64 = LOAD + 0x1200;
    const VALUE: u64 = LOAD + 0x2000;
    const BUF: u64 = LOAD + 0x3000;
    const TMEM_PORT: u32 = 0x518;
    const SIGNAL_PORT: u32 = 0x510;

    /// A guest address as a 32-bit operand: the program and its data live
    /// in the first MiBs of guest memory.
    fn abs32(addr: u64) -> u32 {
        u32::try_from(addr).expect("the program's addresses are below 4 GiB")
    }

    struct Asm {
        code: Vec<u8>,
        /// Positions of rel32 fields that jump to the failure handler.
        to_fail: Vec<usize>,
    }

    impl Asm {
        fn b(&mut self, bytes: &[u8]) {
            self.code.extend_from_slice(bytes);
        }
        fn imm(&mut self, op: &[u8], v: u32) {
            self.b(op);
            self.b(&v.to_le_bytes());
        }
        fn mov_eax(&mut self, v: u32) {
            self.imm(&[0xb8], v);
        }
        fn mov_ebx(&mut self, v: u32) {
            self.imm(&[0xbb], v);
        }
        fn mov_edx(&mut self, v: u32) {
            self.imm(&[0xba], v);
        }
        /// mov eax, dword [abs]
        fn load_eax(&mut self, addr: u64) {
            self.imm(&[0x8b, 0x04, 0x25], abs32(addr));
        }
        /// Calls tmem with the block at `addr`.
        fn call(&mut self, addr: u64) {
            self.mov_eax(abs32(addr >> 4));
            self.mov_edx(TMEM_PORT);
            self.b(&[0xef]); // out dx, eax
        }
        /// cmp eax, v; jne fail (exit code in ebx, set before).
        fn expect_eax(&mut self, v: u32) {
            self.imm(&[0x3d], v);
            self.b(&[0x0f, 0x85]);
            self.to_fail.push(self.code.len());
            self.b(&[0; 4]);
        }
        fn exit_with_ebx(&mut self) {
            self.b(&[0x89, 0xd8]); // mov eax, ebx
            self.imm(&[0x0d], 0x0100_0000); // or eax, EXIT << 24
            self.mov_edx(SIGNAL_PORT);
            self.b(&[0xef, 0xeb, 0xfe]); // out dx, eax; jmp $
        }
    }

    fn block(op: u32, key_len: u64, value_addr: u64, value_len: u64) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[0..4].copy_from_slice(&op.to_le_bytes());
        b[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        for (o, v) in [(16, KEY), (24, key_len), (32, value_addr), (40, value_len)] {
            b[o..o + 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// The loadable segment: code, then request blocks, key and value.
    pub fn segment() -> Vec<u8> {
        let mut a = Asm {
            code: Vec::new(),
            to_fail: Vec::new(),
        };
        let status = |i: u64| BLOCKS + 64 * i + 4;
        // 1: PUT 4 KiB; on failure exit 100 + status.
        a.call(BLOCKS);
        a.load_eax(status(0));
        a.b(&[0x8d, 0x58, 0x64]); // lea ebx, [rax + 100]
        a.expect_eax(0);
        // 2: GET it back into BUF: status OK, value_len 4096, same bytes.
        a.mov_ebx(2);
        a.call(BLOCKS + 64);
        a.load_eax(status(1));
        a.expect_eax(0);
        a.mov_ebx(3);
        a.load_eax(BLOCKS + 64 + 40);
        a.expect_eax(4096);
        a.mov_ebx(4);
        a.imm(&[0xbe], abs32(VALUE)); // mov esi, VALUE
        a.imm(&[0xbf], abs32(BUF)); // mov edi, BUF
        a.imm(&[0xb9], 4096); // mov ecx, 4096
        a.b(&[0xf3, 0xa6]); // repe cmpsb
        a.mov_eax(0);
        a.b(&[0x0f, 0x95, 0xc0]); // setne al
        a.expect_eax(0);
        // 5: INVALIDATE, then 6: GET answers NOT_FOUND.
        a.mov_ebx(5);
        a.call(BLOCKS + 128);
        a.load_eax(status(2));
        a.expect_eax(0);
        a.mov_ebx(6);
        a.call(BLOCKS + 192);
        a.load_eax(status(3));
        a.expect_eax(1);
        // 7: a block far outside RAM: only `in` answers, BAD_ADDRESS.
        a.mov_ebx(7);
        a.mov_eax(0xffff_fff0);
        a.mov_edx(TMEM_PORT);
        a.b(&[0xef, 0xed]); // out dx, eax; in eax, dx
        a.expect_eax(4);
        // 8: a hostile PUT whose value straddles the end of RAM: BAD_ADDRESS.
        a.call(BLOCKS + 256);
        a.load_eax(status(4));
        a.b(&[0x8d, 0x98, 200, 0, 0, 0]); // lea ebx, [rax + 200]
        a.expect_eax(4);
        // Success.
        a.mov_ebx(42);
        a.exit_with_ebx();
        let fail = a.code.len();
        a.exit_with_ebx();
        for pos in std::mem::take(&mut a.to_fail) {
            let rel =
                i32::try_from(fail as i64 - (pos as i64 + 4)).expect("a jump within the segment");
            a.code[pos..pos + 4].copy_from_slice(&rel.to_le_bytes());
        }
        assert!(a.code.len() < 0x1000);

        let mut seg = a.code;
        seg.resize(0x1000, 0xcc);
        let blocks = [
            block(1, 1, VALUE, 4096),
            block(2, 1, BUF, 4096),
            block(3, 1, 0, 0),
            block(2, 1, BUF, 4096),
            // 64 MiB of RAM: the value starts 16 bytes before its end.
            block(1, 1, (64 << 20) - 16, 4096),
        ];
        for b in blocks {
            seg.extend_from_slice(&b);
        }
        assert!(seg.len() <= 0x1200);
        seg.resize(0x1200, 0);
        seg.push(b'k');
        seg.resize(0x2000, 0);
        seg.extend((0..4096u32).map(|i| u8::try_from((i * 7 + i / 256) % 256).expect("below 256")));
        seg.resize(0x4000, 0);
        seg
    }

    /// A static ELF with the spore note around `segment()`.
    pub fn elf() -> Vec<u8> {
        let seg = segment();
        let mut note = Vec::new();
        for w in [6u32, 4, 0x5350_0001] {
            note.extend_from_slice(&w.to_le_bytes());
        }
        note.extend_from_slice(b"spore\0\0\0");
        note.extend_from_slice(&1u32.to_le_bytes());
        let phoff = 64u64;
        let seg_off = 0x1000u64;
        let note_off = seg_off + seg.len() as u64;
        let mut out = Vec::new();
        out.extend_from_slice(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0");
        out.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
        out.extend_from_slice(&62u16.to_le_bytes()); // EM_X86_64
        out.extend_from_slice(&1u32.to_le_bytes());
        out.extend_from_slice(&LOAD.to_le_bytes()); // entry
        out.extend_from_slice(&phoff.to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        for h in [64u16, 56, 2, 64, 0, 0] {
            out.extend_from_slice(&h.to_le_bytes());
        }
        let phdr = |out: &mut Vec<u8>, p_type: u32, flags: u32, off: u64, addr: u64, len: u64| {
            out.extend_from_slice(&p_type.to_le_bytes());
            out.extend_from_slice(&flags.to_le_bytes());
            for v in [off, addr, addr, len, len, 0x1000] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        };
        phdr(&mut out, 1, 7, seg_off, LOAD, seg.len() as u64);
        phdr(&mut out, 4, 4, note_off, 0, note.len() as u64);
        out.resize(usize::try_from(seg_off).expect("a small file offset"), 0);
        out.extend_from_slice(&seg);
        out.extend_from_slice(&note);
        out
    }
}

#[test]
fn kvm_tmem_calls_from_a_ring3_guest() {
    require_kvm();
    let dir = Scratch::new("tmem-guest");
    let image = dir.path("tmem-probe");
    std::fs::write(&image, guest::elf()).unwrap();
    let out = spore()
        .args(["run", "--mem", "64M", "--kernel"])
        .arg(&image)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(42),
        "guest check failed (see kvm_tmem.rs guest::segment); stderr: {}",
        stderr_of(&out)
    );
    // Without a pool, the first PUT answers DISABLED (8): exit 108.
    let out = spore()
        .args(["run", "--mem", "64M", "--no-tmem", "--kernel"])
        .arg(&image)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(108), "stderr: {}", stderr_of(&out));
    // A 1 KiB quota refuses the 4 KiB PUT: QUOTA_EXCEEDED (3), exit 103.
    let out = spore()
        .args(["run", "--mem", "64M", "--tmem-quota", "1K", "--kernel"])
        .arg(&image)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(103), "stderr: {}", stderr_of(&out));
}
