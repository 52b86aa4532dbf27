//! Enforcement shared by every detector: the enforcement percentage's dice, and how long an
//! ejection lasts under each system's semantics.

use std::time::Duration;

pub(crate) use tower_outlier_core::Dice;
use tower_outlier_core::{duration_to_nanos, Nanos};

use crate::config::{DetectorConfig, DetectorSemantics};

/// When an endpoint ejected at `now` comes back, and the ejection counter after this ejection.
///
/// * Envoy: the multiplier grows while `base × m < max + base`; the endpoint comes back on the
///   first interval tick at or after `now + min(base × m, max) + jitter`, the jitter a whole
///   number of milliseconds up to `max_ejection_time_jitter`.
/// * gRPC: the multiplier grows on every ejection; the endpoint comes back on the first tick at
///   or after `now + min(base × m, max(base, max))`. (grpc-go un-ejects once the time is past
///   the end; its timer is re-armed after each run, so its ticks fall just after the multiples of
///   the interval and the first one at or after the end already is.)
/// * linkerd: `ejections` counts the failed probes of this trip; the back-off is
///   `min(base × 2^n, max)`, lengthened by up to `jitter` of itself but never beyond `max`.
///
/// `last_tick` is the time of the last interval tick, or before the first one the time the
/// layer's interval timer started (its ticks are that time plus whole intervals); `None` only
/// for a policy no layer runs, when the endpoint comes back at the exact time.
pub(crate) fn ejection_end(
    config: &DetectorConfig,
    ejections: u32,
    now: Nanos,
    last_tick: Option<Nanos>,
    dice: &Dice,
) -> (Nanos, u32) {
    let base = config.base_ejection_time;
    let max = config.max_ejection_time;
    let interval = duration_to_nanos(config.running_interval());
    match config.semantics {
        DetectorSemantics::Envoy => {
            let grows = base.saturating_mul(ejections) < max.saturating_add(base);
            let multiplier = if grows { ejections + 1 } else { ejections };
            let jitter_ms =
                u64::try_from(config.max_ejection_time_jitter.as_millis()).unwrap_or(u64::MAX);
            let jitter = match jitter_ms.checked_add(1) {
                Some(1) => Duration::ZERO,
                Some(bound) => Duration::from_millis(dice.next() % bound),
                None => Duration::from_millis(dice.next()),
            };
            let length = base
                .saturating_mul(multiplier)
                .min(max)
                .saturating_add(jitter);
            let due = now.saturating_add(duration_to_nanos(length));
            (align(due, last_tick, interval), multiplier)
        }
        DetectorSemantics::Grpc => {
            let multiplier = ejections.saturating_add(1);
            let length = base.saturating_mul(multiplier).min(max.max(base));
            let due = now.saturating_add(duration_to_nanos(length));
            (align(due, last_tick, interval), multiplier)
        }
        DetectorSemantics::Linkerd => {
            let doubled = 2u32
                .checked_pow(ejections)
                .map_or(max, |factor| base.saturating_mul(factor));
            let backoff = doubled.min(max);
            let extra = backoff
                .mul_f64(config.backoff_jitter * dice.unit())
                .min(max.saturating_sub(backoff));
            let due = now.saturating_add(duration_to_nanos(backoff.saturating_add(extra)));
            (due, ejections.saturating_add(1))
        }
    }
}

/// The first tick of the series `last_tick + k × interval` at or after `due`.
fn align(due: Nanos, last_tick: Option<Nanos>, interval: Nanos) -> Nanos {
    let Some(tick) = last_tick else {
        return due;
    };
    if due < tick {
        return due;
    }
    let ticks = (due - tick).div_ceil(interval);
    tick.saturating_add(ticks.saturating_mul(interval))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    #[test]
    fn envoy_grows_to_the_cap_and_stops_one_step_past_it() {
        let config = DetectorConfig::envoy().build().unwrap();
        let dice = Dice::new(1);
        let mut m = 0;
        let mut lengths = Vec::new();
        for _ in 0..13 {
            let (end, next) = ejection_end(&config, m, 0, Some(0), &dice);
            lengths.push(end / S);
            m = next;
        }
        // 30 s × 1..10, capped at 300 s; the multiplier stops at 11 (30 × 11 ≥ 300 + 30).
        assert_eq!(
            lengths,
            vec![30, 60, 90, 120, 150, 180, 210, 240, 270, 300, 300, 300, 300]
        );
        assert_eq!(m, 11);
    }

    #[test]
    fn envoy_comes_back_on_the_first_tick_at_or_after_the_end() {
        let config = DetectorConfig::envoy().build().unwrap();
        let dice = Dice::new(1);
        // Ejected 3 s after a tick: 33 s later is not a tick, the next one is 40 s after it.
        let (end, _) = ejection_end(&config, 0, 3 * S, Some(0), &dice);
        assert_eq!(end, 40 * S);
        // Ejected on a tick: 30 s later is one.
        let (end, _) = ejection_end(&config, 0, 10 * S, Some(10 * S), &dice);
        assert_eq!(end, 40 * S);
        // Before the first tick there is no series to align to.
        let (end, _) = ejection_end(&config, 0, 3 * S, None, &dice);
        assert_eq!(end, 33 * S);
    }

    #[test]
    fn envoy_jitter_stays_within_its_bound() {
        let config = DetectorConfig::envoy()
            .max_ejection_time_jitter(Duration::from_millis(2500))
            .interval(Duration::from_millis(1))
            .build()
            .unwrap();
        let dice = Dice::new(7);
        let ends: Vec<Nanos> = (0..200)
            .map(|_| ejection_end(&config, 0, 0, Some(0), &dice).0)
            .collect();
        assert!(ends
            .iter()
            .all(|end| (30 * S..=32_500_000_000).contains(end)));
        assert!(ends.iter().any(|end| *end > 31 * S), "the jitter is used");
    }

    #[test]
    fn grpc_grows_without_the_envoy_stop() {
        let config = DetectorConfig::grpc().build().unwrap();
        let dice = Dice::new(1);
        let (end, m) = ejection_end(&config, 0, 0, Some(0), &dice);
        assert_eq!((end, m), (30 * S, 1));
        let (end, m) = ejection_end(&config, 20, 0, Some(0), &dice);
        assert_eq!((end, m), (300 * S, 21));
    }

    #[test]
    fn huge_durations_saturate_instead_of_panicking() {
        let config = DetectorConfig::envoy()
            .base_ejection_time(Duration::from_secs(315_576_000_000))
            .max_ejection_time_jitter(Duration::from_secs(315_576_000_000))
            .build()
            .unwrap();
        let dice = Dice::new(1);
        let (end, _) = ejection_end(&config, u32::MAX, Nanos::MAX - 5, Some(0), &dice);
        assert_eq!(end, Nanos::MAX);
        let linkerd = DetectorConfig::linkerd()
            .max_ejection_time(Duration::from_secs(315_576_000_000))
            .build()
            .unwrap();
        assert!(ejection_end(&linkerd, 200, 0, None, &dice).0 > 0);
    }

    #[test]
    fn linkerd_backs_off_exponentially_with_bounded_jitter() {
        let plain = DetectorConfig::linkerd()
            .backoff_jitter(0.0)
            .build()
            .unwrap();
        let dice = Dice::new(3);
        let lengths: Vec<Nanos> = (0..9)
            .map(|n| ejection_end(&plain, n, 0, Some(0), &dice).0 / S)
            .collect();
        assert_eq!(lengths, vec![1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(ejection_end(&plain, u32::MAX, 0, None, &dice).0, 60 * S);
        let jittered = DetectorConfig::linkerd().build().unwrap();
        for n in 0..8 {
            let end = ejection_end(&jittered, n, 0, None, &dice).0;
            let backoff = (S << n).min(60 * S);
            assert!(end >= backoff && end <= (backoff + backoff / 2).min(60 * S));
        }
    }

    #[test]
    fn dice_honour_the_percentage() {
        let dice = Dice::new(42);
        assert!((0..1000).all(|_| dice.enforce(100)));
        assert!((0..1000).all(|_| !dice.enforce(0)));
        let hits = (0..10_000).filter(|_| dice.enforce(30)).count();
        assert!((2700..3300).contains(&hits), "{hits}");
        let again = Dice::new(42);
        let first = Dice::new(42);
        assert_eq!(again.next(), first.next(), "seeded");
    }
}
