//! Holding back the first write of each status object until what it describes has settled.
//!
//! Through a cold start (or a take-over) a spoke's state moves for seconds: queued,
//! connecting, syncing, engaged, then its bindings getting ready. An object written mid-way
//! is then held back by the writer's interval ([`super::WriterOptions::min_interval`])
//! before it can say the spoke is ready, and the write itself was wasted. So the first write
//! of each object this process makes waits until its content has stopped moving; later
//! writes are the writer's business alone.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// When an object's first write is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FirstWriteOptions {
    /// How long the content must stay unchanged once nothing it describes is being engaged
    /// (in practice: across one pass of the status loop).
    pub settle: Duration,
    /// The longest a first write is held back, from when the loop first saw the object.
    pub within: Duration,
}

impl Default for FirstWriteOptions {
    fn default() -> Self {
        FirstWriteOptions {
            settle: Duration::from_secs(1),
            within: Duration::from_secs(30),
        }
    }
}

/// Where what an object describes stands, as far as its first write goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Still being engaged, with no outcome yet: held back up to the bound.
    Engaging,
    /// Past engaging: held back until the content has not changed for `settle`.
    Settling,
    /// An attempt failed: written at once. The failure is worth showing, and every retry
    /// changes the content (failure count, next retry), so it would never settle.
    Failed,
}

/// The objects whose first write this process holds back, by key.
#[derive(Debug)]
pub(crate) struct FirstWrites<C> {
    /// Objects held back, with what the last pass saw of them.
    held: HashMap<String, Held<C>>,
    /// Objects submitted at least once (never held back again while they stay).
    released: HashSet<String>,
    /// When the earliest object held back in this pass may be written.
    next_due: Option<Instant>,
}

impl<C> Default for FirstWrites<C> {
    fn default() -> Self {
        FirstWrites {
            held: HashMap::new(),
            released: HashSet::new(),
            next_due: None,
        }
    }
}

/// An object whose first write is held back.
#[derive(Debug)]
struct Held<C> {
    /// When the loop first saw it.
    first_seen: Instant,
    /// Its content as the last pass saw it.
    content: C,
    /// Since when `content` is unchanged.
    since: Instant,
}

impl<C> FirstWrites<C> {
    /// Whether `key`'s write is held back in this pass: never released by this process,
    /// and either [`Progress::Engaging`] or [`Progress::Settling`] with its content changed
    /// (`same` says no) less than `options.settle` before `now`; at the latest until
    /// `options.within` after the object was first seen. `content` is built only while the
    /// object is held back.
    pub(crate) fn holds(
        &mut self,
        key: &str,
        content: impl FnOnce() -> C,
        same: impl Fn(&C, &C) -> bool,
        progress: Progress,
        now: Instant,
        options: FirstWriteOptions,
    ) -> bool {
        if self.released.contains(key) {
            return false;
        }
        if progress == Progress::Failed {
            self.held.remove(key);
            self.released.insert(key.to_string());
            return false;
        }
        let content = content();
        let held = match self.held.get_mut(key) {
            Some(held) => {
                if !same(&held.content, &content) {
                    held.content = content;
                    held.since = now;
                }
                held
            }
            None => self.held.entry(key.to_string()).or_insert(Held {
                first_seen: now,
                content,
                since: now,
            }),
        };
        let latest = held.first_seen + options.within;
        let due = if progress == Progress::Engaging {
            latest
        } else {
            (held.since + options.settle).min(latest)
        };
        if now < due {
            self.next_due = Some(self.next_due.map_or(due, |d| d.min(due)));
            return true;
        }
        self.held.remove(key);
        self.released.insert(key.to_string());
        false
    }

    /// Starts a pass: forgets the objects `keep` says no to (gone from the fleet: one that
    /// comes back is held back again).
    pub(crate) fn begin_pass(&mut self, keep: impl Fn(&str) -> bool) {
        self.next_due = None;
        self.held.retain(|k, _| keep(k));
        self.released.retain(|k| keep(k));
    }

    /// When the earliest object held back in the last pass may be written.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.next_due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPTIONS: FirstWriteOptions = FirstWriteOptions {
        settle: Duration::from_secs(1),
        within: Duration::from_secs(30),
    };

    fn holds(w: &mut FirstWrites<u32>, key: &str, content: u32, p: Progress, at: Instant) -> bool {
        w.holds(key, || content, |a, b| a == b, p, at, OPTIONS)
    }

    use Progress::{Engaging, Failed, Settling};

    /// Engaging: held back until the bound, then released for good.
    #[test]
    fn an_engaging_object_is_held_back_until_the_bound_and_only_once() {
        let t0 = Instant::now();
        let mut w = FirstWrites::default();
        assert!(holds(&mut w, "a", 1, Engaging, t0));
        assert_eq!(w.next_due(), Some(t0 + OPTIONS.within));
        assert!(holds(
            &mut w,
            "a",
            2,
            Engaging,
            t0 + Duration::from_secs(29)
        ));
        assert!(
            !holds(&mut w, "a", 2, Engaging, t0 + OPTIONS.within),
            "bound"
        );
        assert!(
            !holds(&mut w, "a", 3, Engaging, t0 + OPTIONS.within),
            "released"
        );
    }

    /// Failed: written at once, and released for good (never held back again).
    #[test]
    fn a_failed_object_is_written_at_once() {
        let t0 = Instant::now();
        let mut w = FirstWrites::default();
        assert!(holds(&mut w, "a", 1, Engaging, t0));
        assert!(!holds(&mut w, "a", 2, Failed, t0), "failed");
        assert!(!holds(&mut w, "a", 3, Engaging, t0), "released");
        assert!(!holds(&mut w, "b", 1, Failed, t0), "failed at once");
    }

    /// Not engaging: written once its content has not changed for `settle`; a change
    /// starts the count again; a key that left and came back is held back again.
    #[test]
    fn a_settled_object_is_released_and_a_changed_one_waits_again() {
        let t0 = Instant::now();
        let s = OPTIONS.settle;
        let mut w = FirstWrites::default();
        assert!(holds(&mut w, "b", 1, Settling, t0), "just seen");
        assert_eq!(w.next_due(), Some(t0 + s));
        assert!(holds(&mut w, "b", 2, Settling, t0 + s), "changed");
        assert!(
            holds(&mut w, "b", 2, Settling, t0 + s + s / 2),
            "not settled yet"
        );
        assert!(!holds(&mut w, "b", 2, Settling, t0 + 2 * s), "settled");
        assert!(!holds(&mut w, "b", 3, Engaging, t0 + 2 * s), "released");
        w.begin_pass(|k| k == "a");
        assert_eq!(w.next_due(), None);
        assert!(
            holds(&mut w, "b", 3, Engaging, t0 + 3 * s),
            "left and came back"
        );
    }
}
