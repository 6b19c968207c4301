//! SQL backend (in progress).
