//! Test kit: real servers as child processes and a fault-injecting TCP proxy.
