//! One file per subcommand: its flags and its entry point.

pub(crate) mod bench;
pub(crate) mod check;
pub(crate) mod compare;
pub(crate) mod migrate;
pub(crate) mod run;
pub(crate) mod soak;
pub(crate) mod status;
