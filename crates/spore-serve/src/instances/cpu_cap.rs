//! An instance's CPU cap (its memory's share, as Lambda gives CPU) comes
//! with the end of its first invocation: its start — a boot, restore or
//! clone, and what is left of it in that invocation (copy-on-write faults,
//! a restore's working set) — runs unthrottled, as Lambda's init does.

use std::time::{Duration, Instant};

use super::Instance;
use crate::instance_conn::{InvokeError, InvokeResult};

/// How long a new instance's first invocation runs before its CPU is capped
/// at its share (what is left of its start — copy-on-write faults, a
/// restore's working set — runs unthrottled, as Lambda's init does; a long
/// first invocation is capped from then on).
pub(super) const UNCAPPED_FIRST_INVOCATION: Duration = Duration::from_millis(100);

/// When an instance's CPU cap comes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Cap {
    /// A warm instance: capped already.
    Capped,
    /// A new instance that may serve again: capped when this invocation
    /// ends or [`UNCAPPED_FIRST_INVOCATION`] into it.
    AfterFirst,
    /// A new instance ended after this invocation (keep-alive 0, a
    /// provisioned one): capped only if it runs past
    /// [`UNCAPPED_FIRST_INVOCATION`].
    IfLong,
}

/// Runs one invocation on `inst` within `timeout`, capping a new
/// instance's CPU as `cap` says.
pub(super) async fn invoke_capped(
    inst: &mut Instance,
    cap: Cap,
    timeout: Duration,
    request_id: &str,
    payload: &[u8],
    deadline_ms: u64,
) -> Result<Result<InvokeResult, InvokeError>, tokio::time::error::Elapsed> {
    let started = Instant::now();
    let invoke = inst.conn.invoke(request_id, payload, deadline_ms);
    tokio::pin!(invoke);
    if cap != Cap::Capped {
        let boost = UNCAPPED_FIRST_INVOCATION.min(timeout);
        let early = tokio::time::timeout(boost, &mut invoke).await;
        if let Ok(done) = early {
            if cap == Cap::AfterFirst {
                inst.vmm.cap_cpu();
            }
            return Ok(done);
        }
        inst.vmm.cap_cpu();
    }
    tokio::time::timeout(timeout.saturating_sub(started.elapsed()), invoke).await
}
