//! The `speedups` option: which speed-ups a client uses (see `crate::speedup`). Each only makes
//! waits or statements cheaper; with none of them every operation keeps the same guarantees.

use std::fmt;
use std::str::FromStr;

use lockcore::Error;

/// One speed-up that the `speedups` option can switch off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Speedup {
    /// `doorbell`: a release wakes the head of the queue in another process of the same Linux
    /// host at once (MySQL, SQLite). Off: that waiter finds the release at its next poll.
    Doorbell,
    /// `sqlite-write-queue`: SQLite's writers queue in arrival order (keep-alive writes first),
    /// in the process and between processes, rather than meeting in SQLite's busy handler.
    SqliteWriteQueue,
    /// `connection-cache`: a connection whose statement completed is kept for the next
    /// statement, sparing the pool's ping. Off: every statement takes one from the pool.
    ConnectionCache,
    /// `hand-over`: the release of a lock granted from the queue hands the row to the first
    /// live waiter in the same statement, and a permit's release grants the freed permit to a
    /// waiter of this process. Off: the release frees the row or permit, and the waiter takes it
    /// with its own statement.
    HandOver,
    /// `background-dequeue`: after a hand-over on MySQL, the new holder deletes its waiter row
    /// in the background. Off: it deletes it before its acquire returns.
    BackgroundDequeue,
    /// `mysql-procedures`: on MySQL, a semaphore's grant, join and hand-over run as stored
    /// procedures (one round trip each) where the account may create them. Off: their
    /// statements are sent one by one.
    MysqlProcedures,
}

impl Speedup {
    /// Every speed-up, in the order the option lists them.
    pub const ALL: [Speedup; 6] = [
        Speedup::Doorbell,
        Speedup::SqliteWriteQueue,
        Speedup::ConnectionCache,
        Speedup::HandOver,
        Speedup::BackgroundDequeue,
        Speedup::MysqlProcedures,
    ];

    /// The name the `speedups` option gives it.
    pub fn name(self) -> &'static str {
        match self {
            Speedup::Doorbell => "doorbell",
            Speedup::SqliteWriteQueue => "sqlite-write-queue",
            Speedup::ConnectionCache => "connection-cache",
            Speedup::HandOver => "hand-over",
            Speedup::BackgroundDequeue => "background-dequeue",
            Speedup::MysqlProcedures => "mysql-procedures",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl fmt::Display for Speedup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The speed-ups a client uses: [`Speedups::ALL`] by default, [`Speedups::NONE`] for the plain
/// path that every speed-up must agree with.
///
/// Written in a URL as `speedups=all`, `speedups=none`, or a comma list of `-name` that takes
/// those away from all (`speedups=-doorbell,-connection-cache`); `Display` writes the same form.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Speedups(u8);

impl Speedups {
    /// Every speed-up (the default).
    pub const ALL: Speedups = Speedups((1 << Speedup::ALL.len()) - 1);
    /// None: the plain path.
    pub const NONE: Speedups = Speedups(0);

    /// Whether `speedup` is on.
    pub fn contains(self, speedup: Speedup) -> bool {
        self.0 & speedup.bit() != 0
    }

    /// These, with `speedup` on.
    #[must_use]
    pub fn with(self, speedup: Speedup) -> Self {
        Speedups(self.0 | speedup.bit())
    }

    /// These, with `speedup` off.
    #[must_use]
    pub fn without(self, speedup: Speedup) -> Self {
        Speedups(self.0 & !speedup.bit())
    }

    /// Reads the option's value (see [`Speedups`]); the reason it is refused otherwise.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        match text {
            "all" => return Ok(Speedups::ALL),
            "none" => return Ok(Speedups::NONE),
            _ => {}
        }
        let mut on = Speedups::ALL;
        for item in text.split(',') {
            let found = item
                .strip_prefix('-')
                .and_then(|name| Speedup::ALL.into_iter().find(|s| s.name() == name));
            match found {
                Some(speedup) => on = on.without(speedup),
                None => return Err(Self::usage(item)),
            }
        }
        Ok(on)
    }

    /// Why `item` is refused, with what is accepted.
    fn usage(item: &str) -> String {
        let names: Vec<&str> = Speedup::ALL.iter().map(|s| s.name()).collect();
        format!(
            "option `speedups`: {item:?} is not a speed-up to remove; use all (default), none, \
             or a comma list of -name with the names {}",
            names.join(", ")
        )
    }
}

impl Default for Speedups {
    fn default() -> Self {
        Speedups::ALL
    }
}

impl FromStr for Speedups {
    type Err = Error;

    /// As the `speedups` option reads it (see [`Speedups`]).
    fn from_str(text: &str) -> Result<Self, Error> {
        Speedups::parse(text).map_err(|why| Error::invalid_config("sql", why))
    }
}

impl fmt::Display for Speedups {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Speedups::ALL => f.write_str("all"),
            Speedups::NONE => f.write_str("none"),
            on => {
                let off = Speedup::ALL.into_iter().filter(|s| !on.contains(*s));
                let off: Vec<String> = off.map(|s| format!("-{s}")).collect();
                f.write_str(&off.join(","))
            }
        }
    }
}

impl fmt::Debug for Speedups {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Speedups({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_values_parse_and_print_back() {
        assert_eq!(Speedups::parse("all"), Ok(Speedups::ALL));
        assert_eq!(Speedups::parse("none"), Ok(Speedups::NONE));
        let some = Speedups::parse("-doorbell,-mysql-procedures").unwrap();
        assert!(!some.contains(Speedup::Doorbell));
        assert!(!some.contains(Speedup::MysqlProcedures));
        assert!(some.contains(Speedup::HandOver));
        assert_eq!(some.to_string(), "-doorbell,-mysql-procedures");
        for speedup in Speedup::ALL {
            let one = format!("-{speedup}");
            let parsed = Speedups::parse(&one).unwrap();
            assert_eq!(parsed, Speedups::ALL.without(speedup), "{one}");
            assert_eq!(parsed.to_string(), one);
            assert_eq!(parsed.with(speedup), Speedups::ALL);
        }
        let every: Vec<String> = Speedup::ALL.iter().map(|s| format!("-{s}")).collect();
        assert_eq!(Speedups::parse(&every.join(",")), Ok(Speedups::NONE));
        assert_eq!(Speedups::ALL.to_string(), "all");
        assert_eq!(Speedups::NONE.to_string(), "none");
        assert_eq!("none".parse::<Speedups>().unwrap(), Speedups::NONE);
        assert_eq!(Speedups::default(), Speedups::ALL);
    }

    #[test]
    fn bad_values_are_refused_with_the_valid_names() {
        for bad in [
            "",
            "doorbell",
            "-bell",
            "-doorbell,",
            "all,-doorbell",
            "ALL",
            "-Doorbell",
        ] {
            let why = Speedups::parse(bad).expect_err(bad);
            assert!(why.contains("sqlite-write-queue"), "{bad}: {why}");
            assert!(why.contains("mysql-procedures"), "{bad}: {why}");
        }
        let err = "-x".parse::<Speedups>().unwrap_err();
        assert!(matches!(err, Error::InvalidConfig { .. }), "{err:?}");
    }
}
