//! What a backend's author needs beside [`DistributedLock`](crate::DistributedLock), and an
//! application does not: URL parsing and option checks, keeping secrets out
//! of messages, the acquire loop the extension traits run, and clean-ups that must finish after
//! a cancelled call.

pub use crate::acquire::{Access, acquire, lock_name};
pub use crate::cleanup::spawn_cleanup;
pub use crate::options::{check_ttl, default_drift, option_duration};
pub use crate::redact::{scrub, secrets_of};
pub use crate::semaphore::{check_permits, permits_mismatch};
pub use crate::url_parts::{ENCODE_HINT, UrlError, UrlParts};
