//! Parsers for flag values that every subcommand shares; each refuses bad input before
//! anything connects.

use std::time::Duration;

use dlock::Wait;

pub(crate) fn parse_duration(text: &str) -> Result<Duration, dlock::Error> {
    dlock::parse_duration("duration", text)
}

/// A duration within the ttl bounds, refused before anything connects.
pub(crate) fn parse_ttl(text: &str) -> Result<Duration, dlock::Error> {
    let ttl = parse_duration(text)?;
    dlock::backend_support::check_ttl(ttl)?;
    Ok(ttl)
}

pub(crate) fn parse_wait(text: &str) -> Result<Wait, dlock::Error> {
    Wait::parse(text)
}

/// A semaphore's count, 1 ..= `MAX_PERMITS`, refused before anything connects.
pub(crate) fn parse_permits(text: &str) -> Result<u32, dlock::Error> {
    let permits = text.parse::<u32>().map_err(|_| {
        dlock::Error::invalid_argument(
            "permits",
            format!("`{text}` is not a count; give a whole number of permits, e.g. 4"),
        )
    })?;
    dlock::backend_support::check_permits(permits)?;
    Ok(permits)
}
