//! The lanes' protocol (calls in flight counted by reference counts across an endpoint's handles)
//! under every interleaving loom finds, with the reference counts on loom's atomics.
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" cargo test -p tower-outlier-core --test loom_lanes --release
//! ```
//!
//! What the lanes' documentation states: a reader's sum counts each call in flight at most once
//! and never one that completed before the read began; a lane's count is exact between its
//! handles' clones and drops; dropping a lane's last reference under the list's lock (a reader's
//! upgrade holding it) does not deadlock; once every lane is gone, none is counted alive and no
//! call in flight. Every actor runs in a spawned thread (loom 0.7 misses schedules where a spawned
//! thread runs before the spawning thread's next load).
#![cfg(loom)]

use std::sync::Arc;

use loom::thread;
use tower_outlier_core::lanes::{HasLanes, Lane, LaneArc, Lanes};

struct Endpoint {
    lanes: Lanes<Endpoint>,
}

impl HasLanes for Endpoint {
    fn lanes(&self) -> &Lanes<Self> {
        &self.lanes
    }
}

fn endpoint() -> Arc<Endpoint> {
    Arc::new(Endpoint {
        lanes: Lanes::new(),
    })
}

/// Every interleaving with at most `preemptions` preemptions (5: about 10 s for the four models).
fn model(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(preemptions);
    builder.check(f);
}

/// Two handles, each with its lane and one call in flight that completes on another thread, and a
/// reader summing: it sees at most the two calls, and none once both completed before it read.
#[test]
fn a_reader_counts_each_call_in_flight_at_most_once() {
    model(5, || {
        let endpoint = endpoint();
        let first = Lane::new(endpoint.clone());
        let second = Lane::new(endpoint.clone());
        let calls = [first.clone(), second.clone()];
        let completions: Vec<_> = calls
            .into_iter()
            .map(|call| thread::spawn(move || drop(call)))
            .collect();
        let reader = {
            let endpoint = endpoint.clone();
            thread::spawn(move || endpoint.lanes.in_flight())
        };
        let seen = reader.join().unwrap();
        assert!(seen <= 2, "{seen} calls in flight seen, at most 2 started");
        for completion in completions {
            completion.join().unwrap();
        }
        assert_eq!(endpoint.lanes.in_flight(), 0, "every call completed");
        assert_eq!(Lane::in_flight(&first), 0);
        assert_eq!(endpoint.lanes.live(), 2);
        drop((first, second));
        assert_eq!(endpoint.lanes.live(), 0, "both lanes gone");
    });
}

/// A lane's handle and its last call go on two threads while a reader upgrades the lane under the
/// list's lock: whichever lets go last runs the lane's last-reference step (possibly the reader,
/// under the lock), with no deadlock, and the lane is counted gone exactly once.
#[test]
fn the_last_reference_can_go_under_the_readers_lock() {
    model(5, || {
        let endpoint = endpoint();
        let lane = Lane::new(endpoint.clone());
        let call = lane.clone();
        let handle = thread::spawn(move || drop(lane));
        let completion = thread::spawn(move || drop(call));
        let reader = {
            let endpoint = endpoint.clone();
            thread::spawn(move || endpoint.lanes.in_flight())
        };
        assert!(reader.join().unwrap() <= 1);
        handle.join().unwrap();
        completion.join().unwrap();
        assert_eq!(endpoint.lanes.live(), 0, "the lane counted gone once");
        assert_eq!(endpoint.lanes.in_flight(), 0);
    });
}

/// A new lane made (pruning the list) while another lane's last reference goes and a reader sums:
/// the new lane is listed and counted, the old one pruned or skipped, never counted alive after.
#[test]
fn a_lane_made_while_another_goes_is_counted() {
    model(5, || {
        let endpoint = endpoint();
        let old = Lane::new(endpoint.clone());
        let dropper = thread::spawn(move || drop(old));
        let maker = {
            let endpoint = endpoint.clone();
            thread::spawn(move || {
                let lane = Lane::new(endpoint);
                let call = lane.clone();
                (lane, call)
            })
        };
        let reader = {
            let endpoint = endpoint.clone();
            thread::spawn(move || endpoint.lanes.in_flight())
        };
        assert!(reader.join().unwrap() <= 1);
        dropper.join().unwrap();
        let (lane, call): (LaneArc<Lane<Endpoint>>, LaneArc<Lane<Endpoint>>) =
            maker.join().unwrap();
        assert_eq!(endpoint.lanes.live(), 1, "only the new lane is alive");
        assert_eq!(endpoint.lanes.in_flight(), 1, "its call is in flight");
        drop(call);
        assert_eq!(endpoint.lanes.in_flight(), 0);
        drop(lane);
        assert_eq!(endpoint.lanes.live(), 0);
    });
}

/// A handle cloned (the clone holds its lane) while a call through it completes: the count is
/// the calls in flight, give or take the documented one while the clone is made, and exact after.
#[test]
fn a_handle_cloned_while_a_call_completes() {
    model(5, || {
        let endpoint = endpoint();
        let lane = Lane::new(endpoint.clone());
        let call = lane.clone();
        let cloner = {
            let lane = lane.clone();
            thread::spawn(move || {
                // What cloning a handle does: one more holder, one more reference.
                lane.hold();
                lane
            })
        };
        let completion = thread::spawn(move || drop(call));
        let reader = {
            let lane = lane.clone();
            thread::spawn(move || Lane::in_flight(&lane))
        };
        // The reader's own reference counts as one: the call, and one more while the clone is
        // made.
        let seen = reader.join().unwrap();
        assert!(seen <= 3, "{seen}");
        completion.join().unwrap();
        let clone = cloner.join().unwrap();
        assert_eq!(Lane::in_flight(&lane), 0, "exact once the clone is made");
        clone.release();
        drop(clone);
        assert_eq!(Lane::in_flight(&lane), 0);
        drop(lane);
        assert_eq!(endpoint.lanes.live(), 0);
    });
}
