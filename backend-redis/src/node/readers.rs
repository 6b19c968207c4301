//! The read (shared) side of a lock's read-write form on one node; its write side is the lock
//! itself. Readers share the lock's queue and fencing counter, and hold in the lock's
//! `Readers` set; a reader's release and extend go through [`Node::release`] and
//! [`Node::extend`], by the lease's handle ([`READER`](super::READER)).

use lockcore::{AcquireOptions, LockName, OwnerId, Result};

use super::replies;
use super::{AcquireReply, Mode, Node, protocol_error};

impl Node {
    /// One run of the acquire script for a shared (read) hold of `name` for `owner`, in
    /// [`Mode::Try`] or [`Mode::Wait`] (a [`Mode::Member`] waits as `Wait` does). The exclusive
    /// lock of `name` is its write lock: a reader is granted while the lock is free and no writer
    /// is queued ahead of it; readers and writers share one queue, in arrival order. The token
    /// comes from the lock's own fence counter; a grant's lease must carry
    /// [`READER`](super::READER) as its handle. The reply must echo `owner`.
    ///
    /// # Cancel safety
    /// Not cancel safe on its own: a dropped call may still grant a read hold or queue `owner`;
    /// callers arm a clean-up that runs [`cancel_shared`](Node::cancel_shared).
    ///
    /// # Errors
    /// [`Error::Backend`](lockcore::Error::Backend) for a store failure or a reply that does not
    /// decode.
    pub async fn acquire_shared(
        &self,
        name: &LockName,
        owner: OwnerId,
        opts: &AcquireOptions,
        mode: Mode,
        min_token: u64,
    ) -> Result<AcquireReply> {
        self.acquire_as(name, owner, opts, mode.unvoted(), min_token, true)
            .await
    }

    /// Leaves the queue and frees any read hold of `name` granted to `owner` (the undo of an
    /// [`acquire_shared`](Node::acquire_shared) whose caller went away), then wakes the head
    /// waiter if the lock is free; `true` when a read hold was freed.
    ///
    /// # Cancel safety
    /// The undo either ran on the server or not.
    ///
    /// # Errors
    /// [`Error::Backend`](lockcore::Error::Backend) for a store failure.
    pub async fn cancel_shared(&self, name: &LockName, owner: OwnerId) -> Result<bool> {
        let call = self.cancel_call(name, owner, false, None, true);
        let value = self.run("cancel read acquire", name, &call).await?;
        replies::parse_flag(&value)
            .map_err(|e| protocol_error("cancel read acquire", Some(name), e))
    }
}
