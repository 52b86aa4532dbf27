//! Real servers and clients on loopback: hyper and tonic servers, the README's stacks, a new user's
//! setup, network faults (refused, reset, black hole), the detectors and a pinned client.

#[path = "../support/mod.rs"]
mod support;

mod connection;
mod detectors_loopback;
mod gray_returns;
mod health_watch;
mod health_watch_faults;
mod hyper_servers;
mod idle_buffer;
mod idle_checks;
mod load_shed;
mod network_faults;
mod new_user;
mod orca_weights;
mod pinned_client;
mod rebuild;
mod tonic_servers;

/// Tests that time a recovery or count calls against a deadline take turns. Run beside each other
/// (the half-open peer's 16 MB uploads, four callers spinning on a black hole) they stall one
/// another's loopback calls by milliseconds, which on two cores is enough for a p2c balancer to
/// starve a healthy endpoint for the latency estimate's decay time (see the restart test), as it
/// would on any machine that busy: the tests measure the layer, not the neighbours.
static TIMED: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Waits for this test's turn among the timed ones; the turn lasts as long as the guard.
pub(crate) async fn timed_turn() -> tokio::sync::MutexGuard<'static, ()> {
    TIMED.lock().await
}
