//! Sentinel's `DegradeRule` JSON: any text is read into rules or refused with an error, never a
//! panic; an accepted rule builds a breaker.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tower_outlier_slow_call::{parse_degrade_rules, Breaker};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(rules) = parse_degrade_rules(text) {
        for rule in rules {
            let breaker = Breaker::new(rule.config().clone());
            let _ = breaker.acquire(0);
        }
    }
});
