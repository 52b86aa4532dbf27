//! The rules, one test per rule, mostly on tokio's paused clock and through a real
//! `tower::balance::p2c::Balance`: judging, ejection and return, the budget, hosts, weights, the
//! slow-call breaker, the detectors, events, reconfiguration, starvation and the detection scenarios.

#[path = "../support/mod.rs"]
mod support;

mod all_out;
mod balance;
mod blame;
mod cadence;
mod cadence_crossings;
mod compose;
mod compose_members;
mod connection;
mod connection_metrics;
mod crossings;
mod degraded;
mod detection;
mod detectors;
mod dry_run_crossings;
mod envoy_conformance;
mod events;
mod fail_fast_guard;
mod finagle;
mod gray_returns;
mod grpc;
mod grpc_conformance;
mod health;
mod health_crossings;
mod hosts;
mod idle_checks;
mod idle_crossings;
mod invariants;
mod latency;
mod linkerd_conformance;
mod operator;
mod operator_histories;
mod orca;
mod override_crossings;
mod panic_set;
mod pushback;
mod pushback_bounds;
mod rebuild;
mod rebuild_crossings;
mod reconfigure;
mod semantics;
mod slow_call;
mod slow_start;
mod slow_start_crossings;
mod starvation;
mod weight;
