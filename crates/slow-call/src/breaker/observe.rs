//! Where state changes are told: off the task whose call changed the state.
//!
//! A change is found on a caller's path (a completion that trips the breaker, an admission that
//! starts a probe). Logging it through `tracing` (whose subscriber may lock, allocate or write to a
//! file) and running user observers there would put that cost, and any stall, on the caller; so
//! the change is handed, without a lock, to one thread per process that logs it and runs the
//! observers, in the order the changes were handed over. The observers run inside the caller's
//! tokio runtime (its handle entered, so `tokio::spawn` works) and its `tracing` span. The thread
//! starts at the first change; if it cannot be started, changes are told where they happen.
//!
//! One thread for every breaker of the process: an observer that blocks holds back every later
//! change of every breaker (the changes wait in the thread's queue). Observers must be quick, or
//! hand their work to a task of their own; one that takes over a second is logged.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, Sender, SyncSender};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tower_outlier_core::{drop_panic, panic_message};

use super::{Observer, StateChange};
use crate::config::Strategy;

/// What the thread is sent.
enum Message {
    Change {
        observers: Arc<[Observer]>,
        change: StateChange,
        strategy: Strategy,
        /// Where the change was made: the caller's runtime and span.
        runtime: Option<tokio::runtime::Handle>,
        span: tracing::Span,
    },
    /// Answered once every change sent before it is told.
    Flush(SyncSender<()>),
    /// The same, for a task that must not block its runtime.
    FlushAsync(futures::channel::oneshot::Sender<()>),
}

/// How long an observer may run before it is logged as slow.
const SLOW_OBSERVER: Duration = Duration::from_secs(1);

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
                        // Nothing a message does may end the thread (a panicking subscriber, a
                        // panic payload that panics when dropped): later changes would be lost.
                        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| deliver(message))) {
                            drop_panic(panic);
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

fn deliver(message: Message) {
    match message {
        Message::Change {
            observers,
            change,
            strategy,
            runtime,
            span,
        } => {
            let _runtime = runtime.as_ref().map(tokio::runtime::Handle::enter);
            span.in_scope(|| tell(&observers, &change, strategy));
        }
        Message::Flush(done) => {
            let _ = done.send(());
        }
        Message::FlushAsync(done) => {
            let _ = done.send(());
        }
    }
}

/// Tells `change` off the caller's task (or, without the thread, here).
pub(crate) fn changed(observers: &Arc<[Observer]>, change: StateChange, strategy: Strategy) {
    match inbox() {
        Some(inbox) => {
            // The receiver lives as long as the process; a send fails only if its thread died,
            // which catching everything it runs prevents.
            let message = Message::Change {
                observers: observers.clone(),
                change,
                strategy,
                runtime: tokio::runtime::Handle::try_current().ok(),
                span: tracing::Span::current(),
            };
            if let Err(mpsc::SendError(Message::Change {
                observers,
                change,
                strategy,
                ..
            })) = inbox.send(message)
            {
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
/// to run take (called by an observer, it returns at once). On a tokio runtime whose tasks the
/// observers wait for (an observer that `blocking_send`s to a task of a current-thread runtime),
/// use [`state_observers_told`] instead: blocking the runtime's thread would wait for ever.
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

/// Resolves once every breaker state change made so far has been logged and told to its
/// observers: [`wait_for_state_observers`] for async code, without blocking the runtime.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// tower_outlier_slow_call::state_observers_told().await;
/// # }
/// ```
pub async fn state_observers_told() {
    if ON_OBSERVER_THREAD.get() {
        return;
    }
    let Some(inbox) = inbox() else {
        return;
    };
    let (done, answered) = futures::channel::oneshot::channel();
    if inbox.send(Message::FlushAsync(done)).is_ok() {
        let _ = answered.await;
    }
}

/// Logs `change` and runs the observers, each under `catch_unwind`.
fn tell(observers: &[Observer], change: &StateChange, strategy: Strategy) {
    tracing::info!(
        target: "tower_outlier::breaker",
        from = %change.from,
        to = %change.to,
        value = change.value,
        strategy = %super::StrategyDisplay(strategy),
        "circuit breaker state changed"
    );
    for observer in observers {
        // Observers are user code: a panic is caught and logged, and the next one still runs
        // (and so does the thread, for every later change).
        // Real time on the observers' own thread, for the warning only (nothing is judged by it).
        #[allow(clippy::disallowed_methods)]
        let started = Instant::now();
        let observed = catch_unwind(AssertUnwindSafe(|| observer(change)));
        if let Err(panic) = observed {
            tracing::error!(
                target: "tower_outlier::breaker",
                from = %change.from,
                to = %change.to,
                panic = panic_message(&*panic),
                "a state observer panicked"
            );
            drop_panic(panic);
        }
        let took = started.elapsed();
        if took > SLOW_OBSERVER {
            tracing::warn!(
                target: "tower_outlier::breaker",
                ?took,
                "a state observer ran for over a second: every breaker's later changes waited for it"
            );
        }
    }
}
