//! When the detector must act next: trial ends and recovery checks, by deadline.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use tokio::time::Instant;

/// The deadlines of trials and recovery checks, earliest first, each with its entry's id.
///
/// A deadline is never removed when its entry's status changes or the entry goes: a popped
/// deadline counts only if its entry still has it. Setting one is O(log n), and a wake-up costs
/// O(log n) per deadline it finds due, however many endpoints there are. Stale deadlines are
/// dropped wholesale when they outnumber the live ones.
#[derive(Default)]
pub(crate) struct Deadlines {
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
}

impl Deadlines {
    pub(crate) fn push(&mut self, at: Instant, id: u64) {
        self.heap.push(Reverse((at, id)));
    }

    /// The earliest deadline that is still current, dropping stale ones on the way.
    pub(crate) fn next(&mut self, current: impl Fn(u64, Instant) -> bool) -> Option<Instant> {
        while let Some(&Reverse((at, id))) = self.heap.peek() {
            if current(id, at) {
                return Some(at);
            }
            self.heap.pop();
        }
        None
    }

    /// The ids of the entries whose current deadline is at or before `now`, in id order (the
    /// order endpoints were discovered).
    pub(crate) fn pop_due(
        &mut self,
        now: Instant,
        current: impl Fn(u64, Instant) -> bool,
    ) -> Vec<u64> {
        let mut due = Vec::new();
        while let Some(&Reverse((at, id))) = self.heap.peek() {
            if at > now {
                break;
            }
            self.heap.pop();
            if current(id, at) {
                due.push(id);
            }
        }
        due.sort_unstable();
        due.dedup();
        due
    }

    /// Rebuilds from the current deadlines once the heap holds more than twice as many as there
    /// are endpoints (each has at most one), so churn cannot grow it without bound. The rebuild
    /// is O(n) and comes at most once per n stale deadlines.
    pub(crate) fn compact(
        &mut self,
        endpoints: usize,
        current: impl FnOnce() -> Vec<(Instant, u64)>,
    ) {
        if self.heap.len() > 2 * endpoints + 64 {
            self.heap = current().into_iter().map(Reverse).collect();
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
        deadlines.push(at(start, 30), 1);
        deadlines.push(at(start, 10), 2);
        deadlines.push(at(start, 20), 3);
        assert_eq!(deadlines.next(|_, _| true), Some(at(start, 10)));
        // Entry 2 has moved on: its deadline is stale and dropped.
        assert_eq!(deadlines.next(|id, _| id != 2), Some(at(start, 20)));
        assert_eq!(deadlines.next(|_, _| false), None);
    }

    #[test]
    fn due_deadlines_pop_in_discovery_order_once_each() {
        let start = Instant::now();
        let mut deadlines = Deadlines::default();
        deadlines.push(at(start, 5), 7);
        deadlines.push(at(start, 1), 9);
        deadlines.push(at(start, 5), 7);
        deadlines.push(at(start, 3), 4);
        deadlines.push(at(start, 50), 1);
        let current = |id: u64, _| id != 4;
        assert_eq!(deadlines.pop_due(at(start, 10), current), vec![7, 9]);
        assert_eq!(deadlines.pop_due(at(start, 10), current), Vec::<u64>::new());
        assert_eq!(deadlines.next(|_, _| true), Some(at(start, 50)));
    }

    #[test]
    fn stale_deadlines_are_dropped_once_they_outnumber_the_endpoints() {
        let start = Instant::now();
        let mut deadlines = Deadlines::default();
        for ms in 0..200 {
            deadlines.push(at(start, ms), 1);
        }
        deadlines.compact(100, || unreachable!("200 is not over 2 × 100 + 64"));
        deadlines.compact(10, || vec![(at(start, 199), 1)]);
        assert_eq!(deadlines.pop_due(at(start, 1000), |_, _| true), vec![1]);
        assert_eq!(deadlines.next(|_, _| true), None);
    }
}
