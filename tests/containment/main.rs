//! What the layer does when the world or user code misbehaves: readiness errors, discover errors,
//! classifiers, probes, callbacks and observers that panic, and the adversarial fuzzer.

#[path = "../support/mod.rs"]
mod support;

mod adversarial;
mod breaker_observers;
mod breaker_panics;
mod discover_errors;
mod readiness;
mod user_code_panics;
