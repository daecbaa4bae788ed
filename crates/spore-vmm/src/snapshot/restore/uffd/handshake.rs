//! The external handler's handshake, as Firecracker makes it: the VMM
//! connects to the handler's Unix socket and sends the guest RAM layout
//! (JSON, [`RegionMapping`] per region) with the userfaultfd as
//! `SCM_RIGHTS`; the handler receives both ([`receive_from_vmm`]).

use std::os::unix::net::UnixStream;
use std::path::Path;

use serde::{Deserialize, Serialize};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use super::{Uffd, UffdError, HUGE_PAGE, PAGE};

/// One guest RAM region as a handler sees it, in Firecracker's message
/// shape (`GuestRegionUffdMapping`): host address in the VMM, size, and
/// offset in the memory file, and the page size the handler must fill in
/// (4 KiB, or 2 MiB for hugetlbfs RAM).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionMapping {
    pub base_host_virt_addr: u64,
    pub size: u64,
    pub offset: u64,
    /// Bytes per page: every fill is one whole, aligned page of this size.
    pub page_size: u64,
    /// Firecracker's older name for `page_size`, in KiB.
    pub page_size_kib: u64,
}

impl RegionMapping {
    pub fn new(base_host_virt_addr: u64, size: u64, offset: u64, page_size: u64) -> Self {
        Self {
            base_host_virt_addr,
            size,
            offset,
            page_size,
            page_size_kib: page_size / 1024,
        }
    }

    /// A layout from a VMM is outside input: only 4 KiB and 2 MiB pages,
    /// with the region's address, size and file offset on page boundaries.
    pub(super) fn check(&self) -> std::io::Result<()> {
        let p = self.page_size;
        if p != PAGE && p != HUGE_PAGE {
            return Err(std::io::Error::other(format!(
                "region at {:#x}: page_size {p} is neither 4096 nor 2 MiB",
                self.base_host_virt_addr
            )));
        }
        if (self.base_host_virt_addr | self.size | self.offset) & (p - 1) != 0 {
            return Err(std::io::Error::other(format!(
                "region at {:#x} (size {}, offset {}) is not aligned to its {p}-byte pages",
                self.base_host_virt_addr, self.size, self.offset
            )));
        }
        Ok(())
    }
}

/// Hands the uffd and the layout to an external handler listening on
/// `sock`. The connection is returned to be kept open while the VM lives:
/// the handler may take its closing as the VMM's exit.
pub fn send_to_handler(
    sock: &Path,
    uffd: &Uffd,
    regions: &[RegionMapping],
) -> Result<UnixStream, UffdError> {
    let path = sock.display().to_string();
    let stream = UnixStream::connect(sock).map_err(|source| UffdError::Connect {
        path: path.clone(),
        source,
    })?;
    let body = serde_json::to_vec(regions).map_err(|e| UffdError::Send {
        path: path.clone(),
        source: std::io::Error::other(e),
    })?;
    stream
        .send_with_fd(&body[..], uffd.as_raw_fd())
        .map_err(|e| UffdError::Send {
            path,
            source: std::io::Error::from_raw_os_error(e.errno()),
        })?;
    Ok(stream)
}

/// Receives a uffd and layout sent by [`send_to_handler`] (or Firecracker).
pub fn receive_from_vmm(stream: &UnixStream) -> std::io::Result<(Uffd, Vec<RegionMapping>)> {
    let mut buf = vec![0u8; 64 * 1024];
    let (n, fd) = stream
        .recv_with_fd(&mut buf)
        .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
    let fd = fd.ok_or_else(|| std::io::Error::other("the VMM sent no userfaultfd"))?;
    let regions: Vec<RegionMapping> = serde_json::from_slice(&buf[..n])
        .map_err(|e| std::io::Error::other(format!("bad memory layout message: {e}")))?;
    Ok((Uffd::from_file(fd), regions))
}
