//! Single-flight: concurrent callers asking for the same key share one computation.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// How a [`SingleFlight::run`] call got its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `cached` answered under the lock (a computation finished meanwhile).
    Cached,
    /// Joined a computation another caller started.
    Joined,
    /// Started the computation.
    Led,
}

type Waiters<K, V> = Mutex<HashMap<K, watch::Receiver<Option<V>>>>;

/// Computations under way, by key. The computation runs in its own task, so a caller that
/// gives up (request cancelled) does not cancel it for the others.
#[derive(Debug)]
pub struct SingleFlight<K, V> {
    inflight: Waiters<K, V>,
}

impl<K, V> SingleFlight<K, V>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// No computation under way.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            inflight: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, watch::Receiver<Option<V>>>> {
        self.inflight.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The value for `key`: `cached()` (checked under the lock, since a computation may have
    /// stored its result and left just before), else the computation under way, else
    /// `work()` spawned. `None` if the computation died without an answer (it panicked).
    /// `work` must store its result where `cached` finds it before it returns, or later
    /// callers will start a new computation (which is what errors want: no caching).
    pub async fn run<Fut>(
        self: &Arc<Self>,
        key: K,
        cached: impl FnOnce() -> Option<V>,
        work: impl FnOnce() -> Fut,
    ) -> Option<(V, Source)>
    where
        Fut: Future<Output = V> + Send + 'static,
    {
        let (mut rx, source) = {
            let mut map = self.lock();
            if let Some(v) = cached() {
                return Some((v, Source::Cached));
            }
            if let Some(rx) = map.get(&key) {
                (rx.clone(), Source::Joined)
            } else {
                let (tx, rx) = watch::channel(None);
                map.insert(key.clone(), rx.clone());
                let fut = work();
                let guard = Leave {
                    flight: self.clone(),
                    key,
                };
                tokio::spawn(async move {
                    let v = fut.await;
                    drop(guard);
                    let _ = tx.send(Some(v));
                });
                (rx, Source::Led)
            }
        };
        let v = rx.wait_for(Option::is_some).await.ok()?.clone()?;
        Some((v, source))
    }

    /// Computations under way.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no computation is under way.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Removes the key when the computation ends, however it ends (even by panic), so the key
/// never waits on a dead computation.
struct Leave<K: Eq + Hash, V> {
    flight: Arc<SingleFlight<K, V>>,
    key: K,
}

impl<K: Eq + Hash, V> Drop for Leave<K, V> {
    fn drop(&mut self) {
        self.flight
            .inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn concurrent_callers_share_one_computation() {
        let flight = SingleFlight::<&str, u32>::new();
        let runs = Arc::new(AtomicUsize::new(0));
        let calls = (0..20).map(|_| {
            let runs = runs.clone();
            let flight = flight.clone();
            async move {
                flight
                    .run(
                        "k",
                        || None,
                        move || async move {
                            runs.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            7
                        },
                    )
                    .await
            }
        });
        let out = futures::future::join_all(calls).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert!(out.iter().all(|o| o.map(|(v, _)| v) == Some(7)));
        assert_eq!(
            out.iter()
                .filter(|o| matches!(o, Some((_, Source::Led))))
                .count(),
            1
        );
        assert!(flight.is_empty());
    }

    #[tokio::test]
    async fn a_panicking_computation_frees_the_key() {
        let flight = SingleFlight::<&str, u32>::new();
        let r = flight
            .run("k", || None, || async { panic!("boom (on purpose)") })
            .await;
        assert_eq!(r, None);
        assert!(flight.is_empty());
        let r = flight.run("k", || None, || async { 1 }).await;
        assert_eq!(r, Some((1, Source::Led)));
        let r = flight.run("k", || Some(2), || async { 1 }).await;
        assert_eq!(r, Some((2, Source::Cached)));
    }
}
