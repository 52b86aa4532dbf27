//! What the self-checking examples share: the servers' request counts and the table they print
//! after each phase. Not an example itself (Cargo builds only `examples/*.rs` as examples).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tower_outlier::{EndpointStatus, Monitor};

/// A demo server: its name, its address and how many requests it has received. Each example
/// starts its own kind (`impl Counted { async fn start(..) }` in the example).
pub struct Counted {
    pub name: &'static str,
    pub addr: SocketAddr,
    pub received: Arc<AtomicUsize>,
}

/// How many requests each server has received so far.
pub fn received(servers: &[Counted]) -> Vec<usize> {
    servers
        .iter()
        .map(|s| s.received.load(Ordering::SeqCst))
        .collect()
}

/// How many requests each server has received since `before`.
pub fn since(servers: &[Counted], before: &[usize]) -> Vec<usize> {
    received(servers)
        .iter()
        .zip(before)
        .map(|(now, then)| now - then)
        .collect()
}

/// The monitor's status for the endpoint whose key prints as `key`.
pub fn status(monitor: &Monitor, key: &str) -> Option<EndpointStatus> {
    monitor.snapshot().get(key).map(|e| e.status)
}

/// Whether the endpoint is ejected and will stay so for at least `margin`.
pub fn certainly_ejected(monitor: &Monitor, key: &str, margin: Duration) -> bool {
    monitor.snapshot().get(key).is_some_and(|e| {
        e.status == EndpointStatus::Ejected && e.next_check_in.is_some_and(|t| t > margin)
    })
}

/// One line per server: what it received in this phase, then what the layer thinks of it.
/// `who` and `what` name the columns ("server" and "requests", say).
pub fn print_table(
    servers: &[Counted],
    counts: &[usize],
    monitor: &Monitor,
    who: &str,
    what: &str,
) {
    let snapshot = monitor.snapshot();
    println!(
        "{:<8} {:<16} {:>8}  {:<9} {:>10} {:>14}  {:>10}",
        who, "address", what, "status", "error rate", "failed/calls", "next check"
    );
    for (server, n) in servers.iter().zip(counts) {
        let key = format!("{:?}", server.addr);
        let Some(e) = snapshot.get(&key) else {
            println!("{:<8} {:<16} {:>8}  (not tracked)", server.name, key, n);
            continue;
        };
        let window = e.windows.first().map(|w| w.counts).unwrap_or_default();
        let next = e
            .next_check_in
            .map_or_else(|| "-".to_string(), |t| format!("{t:.1?}"));
        println!(
            "{:<8} {:<16} {:>8}  {:<9} {:>9.1}% {:>14}  {:>10}",
            server.name,
            key,
            n,
            format!("{:?}", e.status),
            e.error_rate * 100.0,
            format!("{}/{}", window.failures, window.calls),
            next
        );
    }
}
