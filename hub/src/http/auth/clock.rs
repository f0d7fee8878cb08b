//! Time source of the auth caches, injectable so tests advance time without sleeping.

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// A wall clock. Absolute (`SystemTime`) because token expiry (`exp`) is absolute.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current time.
    fn now(&self) -> SystemTime;
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told to (tests).
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<SystemTime>,
}

impl ManualClock {
    /// A clock reading the current system time until advanced.
    pub fn new() -> Self {
        Self::at(SystemTime::now())
    }

    /// A clock reading `t` until advanced.
    pub fn at(t: SystemTime) -> Self {
        Self { now: Mutex::new(t) }
    }

    /// Move the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        let mut now = self.now.lock().unwrap_or_else(|p| p.into_inner());
        *now += d;
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        *self.now.lock().unwrap_or_else(|p| p.into_inner())
    }
}
