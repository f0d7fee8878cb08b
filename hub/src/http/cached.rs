//! [`Versioned`]: one value built from a versioned source (the fleet state's change
//! counter), kept until the version moves, so repeated requests between changes reuse it.

use std::sync::{Arc, Mutex};

/// The last value built and the source version it was built at.
///
/// The lock is held while building: concurrent requests after a change wait for one build
/// instead of each doing it (at 1000 spokes a build is a large fraction of a second).
pub struct Versioned<T> {
    slot: Mutex<Option<(u64, Arc<T>)>>,
}

impl<T> Default for Versioned<T> {
    fn default() -> Self {
        Self {
            slot: Mutex::new(None),
        }
    }
}

impl<T> std::fmt::Debug for Versioned<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let version = self
            .slot
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|(v, _)| *v);
        f.debug_struct("Versioned")
            .field("version", &version)
            .finish_non_exhaustive()
    }
}

impl<T> Versioned<T> {
    /// The value for `version`: the kept one if it was built at `version`, else `build()`
    /// (kept for the next call). Read `version` before reading the source `build` uses, so
    /// a change during the build leaves a newer version behind and is rebuilt next time.
    pub fn get_or_build(&self, version: u64, build: impl FnOnce() -> T) -> Arc<T> {
        // A panic in an earlier build leaves no half-built value behind: the slot is only
        // written after a build returns.
        let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((v, value)) = slot.as_ref()
            && *v == version
        {
            return value.clone();
        }
        let value = Arc::new(build());
        *slot = Some((version, value.clone()));
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_once_per_version() {
        let cache = Versioned::<String>::default();
        let mut builds = 0;
        let mut get = |v: u64| {
            cache.get_or_build(v, || {
                builds += 1;
                format!("built at {v}")
            })
        };
        assert_eq!(*get(1), "built at 1");
        assert_eq!(*get(1), "built at 1");
        assert_eq!(*get(2), "built at 2");
        assert_eq!(*get(2), "built at 2");
        // Any other version, even an older one, rebuilds.
        assert_eq!(*get(1), "built at 1");
        assert_eq!(builds, 3);
    }
}
