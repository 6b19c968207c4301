//! dlock facade
