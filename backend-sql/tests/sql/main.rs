//! SQL-specific tests on real databases: SQLite files, and the kit's PostgreSQL and MariaDB
//! servers (a fresh database per test), in one test binary so that the kit starts each server
//! once. Most properties run on all three dialects (`per_dialect!`).

#[macro_use]
mod support;

mod accounts;
mod connections;
mod hand_over;
mod locks;
mod read_write;
mod semaphores;
