//! The rules, one test per rule, mostly on tokio's paused clock and through a real
//! `tower::balance::p2c::Balance`: judging, ejection and return, the budget, hosts, weights, the
//! slow-call breaker, the detectors, events, reconfiguration, starvation and the detection scenarios.

#[path = "../support/mod.rs"]
mod support;

mod all_out;
mod all_out_and_pushback_edges;
mod balance;
mod compose;
mod compose_edges;
mod degraded;
mod detection;
mod detectors;
mod envoy_conformance;
mod events;
mod finagle;
mod grpc;
mod grpc_conformance;
mod health;
mod hosts;
mod invariants;
mod latency;
mod linkerd_conformance;
mod operator;
mod operator_edges;
mod operator_histories;
mod orca;
mod pushback;
mod rebuild;
mod reconfigure;
mod semantics;
mod signals_edges;
mod slow_call;
mod slow_start;
mod starvation;
mod weight;
