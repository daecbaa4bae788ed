//! Snapshot state of a virtio-blk device: which drive it is and what disk
//! it showed the guest. The disk's blocks are not in the snapshot (they are
//! in the image and its copy-on-write overlay); the state only lets a
//! restore refuse a disk the guest would not recognise.

use serde::{Deserialize, Serialize};

use super::{Block, BlockError};
use crate::config::DriveConfig;
use crate::host::lock;
use crate::persist::Persist;
use crate::rate_limiter::{RateLimiter, RateLimiterState};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockState {
    pub drive_id: String,
    pub capacity_sectors: u64,
    pub read_only: bool,
    /// The drive's token buckets as they were (Firecracker keeps them too).
    pub rate_limiter: RateLimiterState,
}

#[derive(Debug, thiserror::Error)]
pub enum BlockStateError {
    #[error(transparent)]
    Open(#[from] BlockError),
    #[error("drive {drive_id}: the snapshot's disk has {field} {saved}, this one {actual}")]
    Mismatch {
        drive_id: String,
        field: &'static str,
        saved: String,
        actual: String,
    },
}

impl Persist for Block {
    type State = BlockState;
    /// The drive as the VM's configuration describes it.
    type Args = DriveConfig;
    type Error = BlockStateError;

    fn save(&self) -> BlockState {
        BlockState {
            drive_id: self.id().to_string(),
            capacity_sectors: self.capacity_sectors(),
            read_only: self.read_only(),
            rate_limiter: lock(self.limiter()).save(),
        }
    }

    fn restore(drive: DriveConfig, state: &BlockState) -> Result<Self, BlockStateError> {
        let mut block = Block::open(&drive)?;
        block.set_limiter(RateLimiter::restore(&state.rate_limiter).map_err(BlockError::Timer)?);
        let saved = Persist::save(&block);
        for (field, was, is) in [
            ("drive id", state.drive_id.clone(), saved.drive_id.clone()),
            (
                "capacity in sectors",
                state.capacity_sectors.to_string(),
                saved.capacity_sectors.to_string(),
            ),
            (
                "read-only",
                state.read_only.to_string(),
                saved.read_only.to_string(),
            ),
        ] {
            if was != is {
                return Err(BlockStateError::Mismatch {
                    drive_id: drive.drive_id,
                    field,
                    saved: was,
                    actual: is,
                });
            }
        }
        Ok(block)
    }
}
