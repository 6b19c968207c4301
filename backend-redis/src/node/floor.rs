//! The bench floors on one node: the least acquire and release (`SET NX PX`, or the fenced
//! script of `SET NX PX` + `INCR`; then a compare-and-delete) that `dlock bench` measures the
//! lock against, on keys of their own under the prefix.

use lockcore::{Error, LockName, OwnerId, Result};
use redis::Value;

use super::scripts::{self, Call};
use super::{FloorHold, Node, backend_error};
use crate::BACKEND;

impl Node {
    /// The bench floor's acquire, plain (`SET NX PX`) or fenced (one script: `SET NX PX` +
    /// `INCR` of a fence counter), on keys of its own under the prefix.
    ///
    /// # Cancel safety
    /// A dropped call may leave the floor's key until its 10 s ttl.
    ///
    /// # Errors
    /// [`Error::Backend`] for a store failure, or (retryable) when the floor's key was held.
    pub async fn floor_acquire(&self, name: &LockName, fenced: bool) -> Result<FloorHold> {
        let s = &self.shared;
        let base = format!("{{{}:floor:{}}}", s.prefix, name.escaped());
        let key = format!("{base}:lock");
        let value = OwnerId::random().to_string();
        let taken = if fenced {
            let take = Call::on(&scripts::FLOOR_FENCED, &[&key, &format!("{base}:fence")])
                .arg(value.as_str())
                .arg(10_000);
            let reply = s.store.eval(&take).await;
            reply.map(|r| r != Value::Int(0))
        } else {
            let mut set = redis::cmd("SET");
            set.arg(&key).arg(&value).arg("NX").arg("PX").arg(10_000);
            s.store.query(&set).await.map(|r| r != Value::Nil)
        };
        match taken.map_err(|e| backend_error("floor acquire", Some(name), e))? {
            true => Ok(FloorHold { key, value }),
            false => Err(Error::backend(
                BACKEND,
                "floor acquire",
                Some(name),
                true,
                "the floor key was held",
            )),
        }
    }

    /// The bench floor's compare-and-delete of `hold`.
    ///
    /// # Cancel safety
    /// The delete either ran on the server or not.
    ///
    /// # Errors
    /// [`Error::Backend`] for a store failure.
    pub async fn floor_delete(&self, name: &LockName, hold: &FloorHold) -> Result<()> {
        let del = Call::on(&scripts::FLOOR_DELETE, &[&hold.key]).arg(hold.value.as_str());
        self.run("floor delete", name, &del).await?;
        Ok(())
    }
}
