//! A node's operations on the counting semaphore of a lock's name: an object apart from the
//! lock, with keys of its own under the same hash tag (`SEM_KEYS`) and its own fencing counter.
//! A permit's release and extend go through [`Node::release`] and [`Node::extend`], by the
//! lease's handle ([`PERMIT`](super::PERMIT)).

use lockcore::{AcquireOptions, LockName, OwnerId, Result};

use super::replies::{self, PermitAnswer};
use super::scripts::{self, Key, SEM_KEYS};
use super::{AttemptReply, Mode, Node, SemaphoreReply, protocol_error};

impl Node {
    /// One run of the semaphore's acquire script for a permit of `name` with `permits` permits,
    /// for `owner` in `mode` ([`Mode::Try`], or [`Mode::Wait`]: a [`Mode::Member`] waits as
    /// `Wait` does), with token minimum `min_token` (0 = none). The semaphore is its own object, apart
    /// from the lock `name`, with its own queue and fencing counter; a grant's lease must carry
    /// [`PERMIT`](super::PERMIT) as its handle. The reply must echo `owner`.
    ///
    /// `queued` says that an earlier attempt of `owner` was answered with a place in the queue:
    /// a release may have handed it a permit since (see `lua/sem_release.lua`), and the reply is
    /// then [`AttemptReply::Handed`], whose lease runs from that earlier attempt.
    ///
    /// # Cancel safety
    /// Not cancel safe on its own: a dropped call may still grant a permit or queue `owner`;
    /// callers arm a clean-up that runs [`cancel_permit`](Node::cancel_permit).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](lockcore::Error::InvalidArgument) (lockcore's `permits_mismatch`)
    /// when the semaphore is in use with another count (nothing changed then);
    /// [`Error::Backend`](lockcore::Error::Backend) for a store failure or a reply that does not
    /// decode.
    // One argument per script input, as `acquire` has; a struct would only rename them.
    #[allow(clippy::too_many_arguments)]
    pub async fn acquire_permit(
        &self,
        name: &LockName,
        owner: OwnerId,
        opts: &AcquireOptions,
        mode: Mode,
        min_token: u64,
        permits: u32,
        queued: bool,
    ) -> Result<AttemptReply> {
        let call = self
            .queued_call(
                &scripts::SEM_ACQUIRE,
                &SEM_KEYS,
                name,
                owner,
                opts,
                mode.unvoted(),
                min_token,
            )
            .arg(permits)
            .arg(if queued { "1" } else { "0" })
            // What a release that hands this waiter a permit tags its message with.
            .arg(
                self.shared
                    .hub
                    .secret_of(&owner.to_string())
                    .unwrap_or_default(),
            );
        let value = self.run("acquire permit", name, &call).await?;
        match replies::parse_permit(&value, owner)
            .map_err(|e| protocol_error("acquire permit", Some(name), e))?
        {
            PermitAnswer::Acquire(reply) => Ok(reply),
            PermitAnswer::Counted(recorded) => Err(lockcore::backend_support::permits_mismatch(
                name, recorded, permits,
            )),
        }
    }

    /// Leaves the semaphore's queue and frees any permit of `name` granted to `owner` (the undo
    /// of a permit acquire whose caller went away), then wakes the head waiter if a permit is
    /// free; `true` when a permit was freed.
    ///
    /// # Cancel safety
    /// The undo either ran on the server or not.
    ///
    /// # Errors
    /// [`Error::Backend`](lockcore::Error::Backend) for a store failure.
    pub async fn cancel_permit(&self, name: &LockName, owner: OwnerId) -> Result<bool> {
        let s = &self.shared;
        let call = self
            .keys(name)
            .call(
                &scripts::SEM_CANCEL,
                &[
                    Key::SemHolders,
                    Key::SemQueue,
                    Key::SemAlive,
                    Key::SemCount,
                    Key::SemTerms,
                ],
            )
            .owner_arg(owner)
            .arg(s.client.as_str())
            .arg(&*self.wakes_of(name));
        let value = self.run("cancel permit acquire", name, &call).await?;
        replies::parse_flag(&value)
            .map_err(|e| protocol_error("cancel permit acquire", Some(name), e))
    }

    /// The semaphore `name` on this node: its live permits (oldest grant first), fence counter,
    /// recorded count and waiters. Read-only: expired permits and dead waiters are not reported.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is written.
    ///
    /// # Errors
    /// [`Error::Backend`](lockcore::Error::Backend) for a store failure or a reply that does not
    /// decode.
    pub async fn inspect_semaphore(&self, name: &LockName) -> Result<SemaphoreReply> {
        let call = self.keys(name).call(
            &scripts::SEM_INSPECT,
            &[
                Key::SemHolders,
                Key::SemFence,
                Key::SemQueue,
                Key::SemAlive,
                Key::SemCount,
            ],
        );
        let value = self.run("inspect semaphore", name, &call).await?;
        replies::parse_sem_inspect(&value)
            .map_err(|e| protocol_error("inspect semaphore", Some(name), e))
    }
}
