//! ioctl request numbers in the type the C library's `ioctl` takes: `c_int` in
//! musl (the static guest tools), `c_ulong` in glibc (host builds and tests).

/// `request` as the C library's `ioctl` request type (`libc::Ioctl`).
#[allow(
    clippy::cast_possible_truncation,
    clippy::unnecessary_cast,
    reason = "Linux encodes an ioctl request in 32 bits (_IOC: number, type, size, direction), \
              so musl's int holds it; glibc's type is unsigned long itself"
)]
pub const fn request(request: libc::c_ulong) -> libc::Ioctl {
    request as libc::Ioctl
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_request_keeps_its_value() {
        // RNDRESEEDCRNG, _IO('R', 0x07).
        assert_eq!(super::request(0x5207), 0x5207);
    }
}
