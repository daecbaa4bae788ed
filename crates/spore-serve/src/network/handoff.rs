//! A jailed clone's tap: it may not enter its network namespace, so the
//! daemon opens `/dev/net/tun` there and hands the descriptor over a Unix
//! socket the clone connects to (`PUT /clone`'s `tun_socket_template`).

use std::time::Duration;

/// How long a clone has to fetch its tap's descriptor.
pub(crate) const TUN_HANDOFF_LIMIT: Duration = Duration::from_secs(30);

/// How long each of `count` clones made by one `PUT /clone` has: the VMM
/// makes them one after another, each fetching its descriptor as it is
/// made, so the last one comes `count` clones later (measured: 100 forks of
/// a sandbox under nested emulation reached the 75th after 30 s).
pub(crate) fn handoff_limit(count: u32) -> Duration {
    TUN_HANDOFF_LIMIT + Duration::from_secs(2) * count
}

/// Listens on `sock` (owned by the clone's `user`, so that it may connect)
/// for one connection, which gets `tun` with `SCM_RIGHTS`; the socket goes
/// when it was served or after `limit`.
pub(crate) fn give_tun(
    sock: &std::path::Path,
    tun: std::fs::File,
    user: &crate::jail::User,
    limit: Duration,
) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(sock);
    let listener = tokio::net::UnixListener::bind(sock)
        .map_err(|e| anyhow::anyhow!("listening on {}: {e}", sock.display()))?;
    std::os::unix::fs::chown(sock, Some(user.uid), Some(user.gid))
        .map_err(|e| anyhow::anyhow!("giving {} to the clone's user: {e}", sock.display()))?;
    let sock = sock.to_path_buf();
    tokio::spawn(async move {
        let sent = match tokio::time::timeout(limit, listener.accept()).await {
            Ok(Ok((stream, _))) => send_fd(stream, &tun),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no clone came for it",
            )),
        };
        if let Err(e) = sent {
            tracing::warn!(
                "{}: the clone's tap descriptor was not given: {e}",
                sock.display()
            );
        }
        let _ = std::fs::remove_file(&sock);
    });
    Ok(())
}

/// Sends `file`'s descriptor over `stream` (one byte, `SCM_RIGHTS`).
fn send_fd(stream: tokio::net::UnixStream, file: &std::fs::File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;

    use vmm_sys_util::sock_ctrl_msg::ScmSocket as _;
    let stream = stream.into_std()?;
    stream.set_nonblocking(false)?;
    stream
        .send_with_fd(&[1u8][..], file.as_raw_fd())
        .map(|_| ())
        .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))
}
