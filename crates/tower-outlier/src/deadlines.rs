//! When the detector must act next: trial ends and recovery checks, by deadline.

use std::cmp::{Ordering, Reverse};
use std::collections::binary_heap::{BinaryHeap, PeekMut};

use tokio::time::Instant;

/// The deadlines of trials and recovery checks, earliest first, each with its entry's key and id.
///
/// A deadline is never removed when its entry's status changes or the entry goes: a popped
/// deadline counts only if its entry still has it. Setting one is O(log n), and a wake-up costs
/// O(log n) per deadline it finds due, however many endpoints there are. Stale deadlines are
/// dropped wholesale when they outnumber the live ones.
///
/// Each deadline names its entry by key (so finding the entry takes no map of its own) and by id
/// (an entry removed and inserted again under the same key has a new one, and none of the old
/// entry's deadlines).
pub(crate) struct Deadlines<K> {
    heap: BinaryHeap<Reverse<Deadline<K>>>,
}

struct Deadline<K> {
    at: Instant,
    id: u64,
    key: K,
}

// Ordered by time, then by id; the key plays no part (it need not be ordered).
impl<K> Ord for Deadline<K> {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.id).cmp(&(other.at, other.id))
    }
}

impl<K> PartialOrd for Deadline<K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<K> PartialEq for Deadline<K> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl<K> Eq for Deadline<K> {}

impl<K> Default for Deadlines<K> {
    fn default() -> Self {
        Deadlines {
            heap: BinaryHeap::new(),
        }
    }
}

impl<K> Deadlines<K> {
    pub(crate) fn push(&mut self, at: Instant, key: K, id: u64) {
        self.heap.push(Reverse(Deadline { at, id, key }));
    }

    /// The earliest deadline that is still current, dropping stale ones on the way.
    pub(crate) fn next(&mut self, current: impl Fn(&K, u64, Instant) -> bool) -> Option<Instant> {
        while let Some(Reverse(deadline)) = self.heap.peek() {
            if current(&deadline.key, deadline.id, deadline.at) {
                return Some(deadline.at);
            }
            self.heap.pop();
        }
        None
    }

    /// The keys of the entries whose current deadline is at or before `now`, in id order (the
    /// order endpoints were discovered).
    pub(crate) fn pop_due(
        &mut self,
        now: Instant,
        current: impl Fn(&K, u64, Instant) -> bool,
    ) -> Vec<K> {
        let mut due = Vec::new();
        while let Some(next) = self.heap.peek_mut() {
            if next.0.at > now {
                break;
            }
            let Reverse(deadline) = PeekMut::pop(next);
            if current(&deadline.key, deadline.id, deadline.at) {
                due.push((deadline.id, deadline.key));
            }
        }
        due.sort_unstable_by_key(|(id, _)| *id);
        due.dedup_by_key(|(id, _)| *id);
        due.into_iter().map(|(_, key)| key).collect()
    }

    /// Rebuilds from the current deadlines once the heap holds more than twice as many as there
    /// are endpoints (each has at most one), so churn cannot grow it without bound. The rebuild
    /// is O(n) and comes at most once per n stale deadlines.
    pub(crate) fn compact(
        &mut self,
        endpoints: usize,
        current: impl FnOnce() -> Vec<(Instant, K, u64)>,
    ) {
        if self.heap.len() > 2 * endpoints + 64 {
            self.heap = current()
                .into_iter()
                .map(|(at, key, id)| Reverse(Deadline { at, id, key }))
                .collect();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(start: Instant, ms: u64) -> Instant {
        start + Duration::from_millis(ms)
    }

    #[test]
    fn the_earliest_current_deadline_comes_first() {
        let start = Instant::now();
        let mut deadlines = Deadlines::default();
        deadlines.push(at(start, 30), "a", 1);
        deadlines.push(at(start, 10), "b", 2);
        deadlines.push(at(start, 20), "c", 3);
        assert_eq!(deadlines.next(|_, _, _| true), Some(at(start, 10)));
        // Entry 2 has moved on: its deadline is stale and dropped.
        assert_eq!(deadlines.next(|_, id, _| id != 2), Some(at(start, 20)));
        assert_eq!(deadlines.next(|_, _, _| false), None);
    }

    #[test]
    fn due_deadlines_pop_in_discovery_order_once_each() {
        let start = Instant::now();
        let mut deadlines = Deadlines::default();
        deadlines.push(at(start, 5), "g", 7);
        deadlines.push(at(start, 1), "i", 9);
        deadlines.push(at(start, 5), "g", 7);
        deadlines.push(at(start, 3), "d", 4);
        deadlines.push(at(start, 50), "a", 1);
        let current = |_: &&str, id: u64, _| id != 4;
        assert_eq!(deadlines.pop_due(at(start, 10), current), vec!["g", "i"]);
        assert!(deadlines.pop_due(at(start, 10), current).is_empty());
        assert_eq!(deadlines.next(|_, _, _| true), Some(at(start, 50)));
    }

    #[test]
    fn stale_deadlines_are_dropped_once_they_outnumber_the_endpoints() {
        let start = Instant::now();
        let mut deadlines = Deadlines::default();
        for ms in 0..200 {
            deadlines.push(at(start, ms), "a", 1);
        }
        deadlines.compact(100, || unreachable!("200 is not over 2 × 100 + 64"));
        deadlines.compact(10, || vec![(at(start, 199), "a", 1)]);
        assert_eq!(
            deadlines.pop_due(at(start, 1000), |_, _, _| true),
            vec!["a"]
        );
        assert_eq!(deadlines.next(|_, _, _| true), None);
    }
}
