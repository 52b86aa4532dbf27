//! The health watches the adaptor runs, one per endpoint whose probe watches
//! ([`Probe::watch`](crate::probe::Probe::watch)): polled in the adaptor's task, as its probes are,
//! stopped when the upstream removes the endpoint or gives its key a new service.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::{AbortHandle, Abortable, FutureExt};
use futures::stream::{FuturesUnordered, StreamExt};

use crate::probe::{Health, HealthStream};

type Next<K> = Pin<Box<dyn Future<Output = (K, u64, Read, HealthStream, u32)> + Send>>;

/// What one read of a watch gave.
enum Read {
    Word(Health),
    /// The stream ended, or panicked (user code: contained, logged).
    Gone,
}

/// Words in a row a watch may give without its stream ever making the adaptor wait: past this it
/// waits [`READY_PAUSE`] on a timer, so that a stream that is always ready cannot keep the
/// balancer from its calls (nor make its task wake itself).
const READY_STREAK: u32 = 16;

/// How long a watch that gave [`READY_STREAK`] words in a row waits before its next.
const READY_PAUSE: std::time::Duration = std::time::Duration::from_millis(10);

pub(super) struct Watches<K> {
    running: FuturesUnordered<Abortable<Next<K>>>,
    // The watch in force for each key: its generation, and how to stop its next read.
    current: HashMap<K, (u64, AbortHandle)>,
    generations: u64,
}

impl<K> Default for Watches<K> {
    fn default() -> Self {
        Watches {
            running: FuturesUnordered::new(),
            current: HashMap::new(),
            generations: 0,
        }
    }
}

impl<K> Watches<K>
where
    K: Hash + Eq + Clone + std::fmt::Debug + Send + 'static,
{
    /// Watches `key` with `stream`, in place of any watch it had.
    pub(super) fn start(&mut self, key: K, stream: HealthStream) {
        self.stop(&key);
        self.generations += 1;
        self.read(key, self.generations, stream, 0);
    }

    /// Stops `key`'s watch, if it has one.
    pub(super) fn stop(&mut self, key: &K) {
        if let Some((_, abort)) = self.current.remove(key) {
            abort.abort();
        }
    }

    /// Reads the next word of `stream`, the watch of `key` in its `generation`, which has given
    /// `streak` words in a row without waiting.
    fn read(&mut self, key: K, generation: u64, mut stream: HealthStream, streak: u32) {
        let (abort, registration) = AbortHandle::new_pair();
        self.current.insert(key.clone(), (generation, abort));
        let next: Next<K> = Box::pin(async move {
            let mut streak = streak;
            if streak >= READY_STREAK {
                tokio::time::sleep(READY_PAUSE).await;
                streak = 0;
            }
            let mut waited = false;
            let word = futures::future::poll_fn(|cx| {
                let polled = stream.poll_next_unpin(cx);
                waited |= polled.is_pending();
                polled
            });
            // The stream is user code: one that panics ends its watch, logged.
            let next = std::panic::AssertUnwindSafe(word).catch_unwind().await;
            let streak = if waited { 0 } else { streak + 1 };
            let read = match next {
                Ok(Some(health)) => Read::Word(health),
                Ok(None) => {
                    tracing::info!(
                        target: "tower_outlier",
                        endpoint = ?key,
                        "a health watch ended: its word no longer stands, the endpoint's calls judge it"
                    );
                    Read::Gone
                }
                Err(panic) => {
                    tracing::error!(
                        target: "tower_outlier",
                        endpoint = ?key,
                        panic = tower_outlier_core::panic_message(&*panic),
                        "a health watch panicked: its word no longer stands, the endpoint's calls judge it"
                    );
                    tower_outlier_core::drop_panic(panic);
                    Read::Gone
                }
            };
            (key, generation, read, stream, streak)
        });
        self.running.push(Abortable::new(next, registration));
    }

    /// The next word of a watch in force, if one came: `Pending` otherwise, with this task's
    /// waker registered by every watch. A watch that ended or panicked gives up its word: it
    /// says [`Health::Serving`], and the endpoint's calls judge it (a last word of not serving
    /// would otherwise hold the endpoint out for good, with no check of its own).
    pub(super) fn poll_word(&mut self, cx: &mut Context<'_>) -> Poll<(K, Health)> {
        while let Poll::Ready(Some(done)) = self.running.poll_next_unpin(cx) {
            let Ok((key, generation, read, stream, streak)) = done else {
                continue;
            };
            if self.current.get(&key).map(|(g, _)| *g) != Some(generation) {
                continue;
            }
            match read {
                Read::Word(health) => {
                    self.read(key.clone(), generation, stream, streak);
                    return Poll::Ready((key, health));
                }
                Read::Gone => {
                    self.current.remove(&key);
                    return Poll::Ready((key, Health::Serving));
                }
            }
        }
        Poll::Pending
    }
}
