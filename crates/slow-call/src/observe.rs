//! Where state changes are told: off the task whose call changed the state.
//!
//! A change is found on a caller's path (a completion that trips the breaker, an admission that
//! starts a probe). Logging it through `tracing` (whose subscriber may lock, allocate or write to a
//! file) and running user observers there would put that cost, and any stall, on the caller; so
//! the change is handed, without a lock, to one thread per process that logs it and runs the
//! observers, in the order the changes were made. The thread starts at the first change; if it
//! cannot be started, changes are told where they happen, as a fallback.

use std::sync::mpsc::{self, Sender, SyncSender};
use std::sync::{Arc, OnceLock};

use crate::breaker::{panic_text, Observer, StateChange};
use crate::config::Strategy;

/// What the thread is sent.
enum Message {
    Change {
        observers: Arc<[Observer]>,
        change: StateChange,
        strategy: Strategy,
    },
    /// Answered once every change sent before it is told.
    Flush(SyncSender<()>),
}

thread_local! {
    // An observer that waits for the observers would wait for itself.
    static ON_OBSERVER_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The thread's inbox, or `None` if the thread could not be started.
fn inbox() -> Option<&'static Sender<Message>> {
    static INBOX: OnceLock<Option<Sender<Message>>> = OnceLock::new();
    INBOX
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel::<Message>();
            let started = std::thread::Builder::new()
                .name("tower-outlier-breaker-observers".into())
                .spawn(move || {
                    ON_OBSERVER_THREAD.set(true);
                    for message in rx {
                        match message {
                            Message::Change {
                                observers,
                                change,
                                strategy,
                            } => tell(&observers, &change, strategy),
                            Message::Flush(done) => {
                                let _ = done.send(());
                            }
                        }
                    }
                });
            match started {
                Ok(_) => Some(tx),
                Err(error) => {
                    tracing::warn!(
                        target: "tower_outlier::breaker",
                        %error,
                        "could not start the thread that tells breaker state changes: told on the callers' tasks"
                    );
                    None
                }
            }
        })
        .as_ref()
}

/// Tells `change` off the caller's task (or, without the thread, here).
pub(crate) fn changed(observers: &Arc<[Observer]>, change: StateChange, strategy: Strategy) {
    match inbox() {
        Some(inbox) => {
            // The receiver lives as long as the process; a send fails only if its thread died,
            // which catching every observer's panic prevents.
            if let Err(mpsc::SendError(Message::Change {
                observers,
                change,
                strategy,
            })) = inbox.send(Message::Change {
                observers: observers.clone(),
                change,
                strategy,
            }) {
                tell(&observers, &change, strategy);
            }
        }
        None => tell(observers, &change, strategy),
    }
}

/// Waits until every breaker state change made so far, by any breaker of the process, has been
/// logged and told to its observers.
///
/// Observers ([`CircuitBreakerLayer::on_state_change`](crate::CircuitBreakerLayer::on_state_change),
/// [`SlowCallPolicy::on_state_change`](crate::SlowCallPolicy::on_state_change)) run on a thread
/// of their own, not on the task whose call changed the state; a test or a shutdown that needs
/// them to have run calls this. It blocks the calling thread for as long as the observers still
/// to run take (called by an observer, it returns at once).
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use std::time::Duration;
/// use tower_outlier_core::{FailureKind, Observation, Outcome};
/// use tower_outlier_slow_call::{
///     wait_for_state_observers, Admission, Breaker, BreakerConfig, Observer, State,
/// };
///
/// let seen = Arc::new(Mutex::new(Vec::new()));
/// let record = seen.clone();
/// let observer: Observer = Arc::new(move |change| record.lock().unwrap().push(change.to));
/// let config = BreakerConfig::error_count(0)
///     .min_requests(1)
///     .open_duration(Duration::from_secs(5))
///     .build()?;
/// let breaker = Breaker::with_observers(config, Arc::new([observer]));
/// let failed = Observation {
///     outcome: Outcome::Failure(FailureKind::Transport),
///     latency: Duration::ZERO,
/// };
/// breaker.complete(breaker.acquire(0), &failed, 0);
/// wait_for_state_observers();
/// assert_eq!(*seen.lock().unwrap(), [State::Open]);
/// # Ok::<(), tower_outlier_core::ConfigError>(())
/// ```
pub fn wait_for_state_observers() {
    if ON_OBSERVER_THREAD.get() {
        // Called by an observer: the changes before its own are told already.
        return;
    }
    let Some(inbox) = inbox() else {
        // Told where they happened: nothing is pending.
        return;
    };
    let (done, answered) = mpsc::sync_channel(1);
    if inbox.send(Message::Flush(done)).is_ok() {
        let _ = answered.recv();
    }
}

/// Logs `change` and runs the observers, each under `catch_unwind`.
fn tell(observers: &[Observer], change: &StateChange, strategy: Strategy) {
    tracing::info!(
        target: "tower_outlier::breaker",
        from = %change.from,
        to = %change.to,
        value = change.value,
        strategy = %crate::breaker::StrategyDisplay(strategy),
        "circuit breaker state changed"
    );
    for observer in observers {
        // Observers are user code: a panic is caught and logged, and the next one still runs
        // (and so does the thread, for every later change).
        let observe = std::panic::AssertUnwindSafe(|| observer(change));
        if let Err(panic) = std::panic::catch_unwind(observe) {
            tracing::error!(
                target: "tower_outlier::breaker",
                from = %change.from,
                to = %change.to,
                panic = panic_text(&*panic),
                "a state observer panicked"
            );
        }
    }
}
