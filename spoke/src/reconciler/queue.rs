//! A deduplicating work queue keyed by binding (`namespace/name`).
//!
//! Semantics (the same as client-go's workqueue, which is why they are safe):
//! - a key is queued at most once, however often it is enqueued before a worker takes it;
//! - a key is never processed by two workers at once: enqueueing a key that is in flight
//!   marks it dirty, and it is queued again when the worker calls [`WorkQueue::done`];
//! - delayed requeues ([`WorkQueue::enqueue_after`]) keep only the earliest deadline.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Identity of a binding: namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// Namespace of the binding.
    pub namespace: String,
    /// Name of the binding.
    pub name: String,
}

impl ObjectKey {
    /// Builds a key.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[derive(Default)]
struct State {
    queue: VecDeque<ObjectKey>,
    queued: HashSet<ObjectKey>,
    in_flight: HashSet<ObjectKey>,
    dirty: HashSet<ObjectKey>,
    delayed: HashMap<ObjectKey, Instant>,
    closed: bool,
}

impl State {
    /// Gives back the room of the emptied queue. A cold start queues every binding of a
    /// spoke at once, and the queue and its set kept that room (about 13 KB per spoke of
    /// 100 bindings) for as long as the spoke was engaged; refilling from empty costs a
    /// few small allocations.
    fn release_room(&mut self) {
        debug_assert!(self.queue.is_empty() && self.queued.is_empty());
        self.queue = VecDeque::new();
        self.queued = HashSet::new();
    }
}

/// The work queue; cheap to clone (shared state).
#[derive(Clone, Default)]
pub struct WorkQueue {
    state: Arc<Mutex<State>>,
    notify: Arc<Notify>,
}

impl WorkQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means a panic elsewhere; the sets stay consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `key` now (no-op if already queued; deferred if in flight).
    pub fn enqueue(&self, key: ObjectKey) {
        let mut st = self.lock();
        if st.closed {
            return;
        }
        st.delayed.remove(&key);
        if st.in_flight.contains(&key) {
            st.dirty.insert(key);
            return;
        }
        if st.queued.insert(key.clone()) {
            st.queue.push_back(key);
            drop(st);
            self.notify.notify_one();
        }
    }

    /// Queues every key of `keys`.
    pub fn enqueue_all(&self, keys: impl IntoIterator<Item = ObjectKey>) {
        for k in keys {
            self.enqueue(k);
        }
    }

    /// Queues `key` after `delay`, unless it gets queued sooner; keeps the earliest deadline.
    pub fn enqueue_after(&self, key: ObjectKey, delay: Duration) {
        let deadline = Instant::now() + delay;
        {
            let mut st = self.lock();
            if st.closed || st.queued.contains(&key) {
                return;
            }
            match st.delayed.get(&key) {
                Some(existing) if *existing <= deadline => return,
                _ => {
                    st.delayed.insert(key.clone(), deadline);
                }
            }
        }
        let this = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(deadline).await;
            let due = {
                let mut st = this.lock();
                match st.delayed.get(&key) {
                    Some(d) if *d == deadline => {
                        st.delayed.remove(&key);
                        true
                    }
                    _ => false,
                }
            };
            if due {
                this.enqueue(key);
            }
        });
    }

    /// Waits for the next key; `None` once the queue is closed.
    pub async fn next(&self) -> Option<ObjectKey> {
        loop {
            let notified = self.notify.notified();
            {
                let mut st = self.lock();
                if st.closed {
                    return None;
                }
                if let Some(key) = st.queue.pop_front() {
                    st.queued.remove(&key);
                    st.in_flight.insert(key.clone());
                    // Wake another worker if more work is waiting.
                    if !st.queue.is_empty() {
                        self.notify.notify_one();
                    } else {
                        st.release_room();
                    }
                    return Some(key);
                }
            }
            notified.await;
        }
    }

    /// Marks `key` processed; re-queues it if it was enqueued while in flight.
    pub fn done(&self, key: &ObjectKey) {
        let requeue = {
            let mut st = self.lock();
            st.in_flight.remove(key);
            st.dirty.remove(key)
        };
        if requeue {
            self.enqueue(key.clone());
        }
    }

    /// Closes the queue: workers' [`WorkQueue::next`] return `None`.
    pub fn close(&self) {
        self.lock().closed = true;
        self.notify.notify_waiters();
    }

    /// Number of keys waiting (not in flight, not delayed).
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    /// True when no key is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when nothing is waiting, in flight or delayed.
    pub fn is_idle(&self) -> bool {
        let st = self.lock();
        st.queue.is_empty() && st.in_flight.is_empty() && st.delayed.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(n: &str) -> ObjectKey {
        ObjectKey::new("ns", n)
    }

    #[tokio::test]
    async fn deduplicates_pending_keys() {
        let q = WorkQueue::new();
        q.enqueue(k("a"));
        q.enqueue(k("a"));
        q.enqueue(k("b"));
        assert_eq!(q.len(), 2);
        assert_eq!(q.next().await, Some(k("a")));
        assert_eq!(q.next().await, Some(k("b")));
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn an_emptied_queue_gives_its_room_back() {
        let q = WorkQueue::new();
        for i in 0..100 {
            q.enqueue(k(&format!("b{i}")));
        }
        assert!(q.lock().queue.capacity() >= 100);
        for _ in 0..99 {
            q.next().await.unwrap();
        }
        assert!(q.lock().queue.capacity() >= 100, "kept while work waits");
        q.next().await.unwrap();
        let room = {
            let st = q.lock();
            (st.queue.capacity(), st.queued.capacity())
        };
        assert_eq!(room, (0, 0));
        q.enqueue(k("again"));
        assert_eq!(q.next().await, Some(k("again")), "usable after");
    }

    #[tokio::test]
    async fn in_flight_key_is_deferred_until_done() {
        let q = WorkQueue::new();
        q.enqueue(k("a"));
        let got = q.next().await.unwrap();
        q.enqueue(k("a"));
        assert!(
            q.is_empty(),
            "an in-flight key must not be handed out twice"
        );
        q.done(&got);
        assert_eq!(q.len(), 1);
        assert_eq!(q.next().await, Some(k("a")));
        q.done(&k("a"));
        assert!(q.is_idle());
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_requeue_fires_once_with_earliest_deadline() {
        let q = WorkQueue::new();
        q.enqueue_after(k("a"), Duration::from_secs(10));
        q.enqueue_after(k("a"), Duration::from_secs(1));
        assert!(q.is_empty());
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(q.len(), 1);
        assert_eq!(q.next().await, Some(k("a")));
        q.done(&k("a"));
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert!(q.is_idle(), "the superseded later deadline must not fire");
    }

    #[tokio::test]
    async fn close_releases_waiters() {
        let q = WorkQueue::new();
        let q2 = q.clone();
        let waiter = tokio::spawn(async move { q2.next().await });
        tokio::task::yield_now().await;
        q.close();
        assert_eq!(waiter.await.unwrap(), None);
    }
}
