//! What every long-running `kleym` command (`kleym hub`, `kleym spoke`) sets up the same
//! way to be observed: the log subscriber ([`logging`]) and the plain-HTTP health servers
//! (`/healthz`, `/readyz`, `/metrics` on `--metrics-addr`, the probes alone on
//! `--health-addr`; [`health`]) and the file naming the addresses they got
//! ([`listen_addrs`], `--listen-addrs-file`). One home, so the two commands cannot drift apart.

pub mod health;
pub mod listen_addrs;
pub mod logging;
