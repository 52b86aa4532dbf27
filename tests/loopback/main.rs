//! Real servers and clients on loopback: hyper and tonic servers, the README's stacks, a new user's
//! setup, network faults (refused, reset, black hole), the detectors and a pinned client.

#[path = "../support/mod.rs"]
mod support;

mod detectors_loopback;
mod hyper_servers;
mod network_faults;
mod new_user;
mod pinned_client;
mod tonic_servers;
