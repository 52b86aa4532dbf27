//! Finagle's `successRateWithinDuration`: dead when a time-weighted moving average of the
//! success rate falls below the bar.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tower_outlier_core::{
    check_ratio, duration_to_nanos, Comparison, ConfigError, Description, EndpointPolicy,
    Judgement, Nanos, Observation, Outcome, OutlierPolicy, OwnTiming, Reason, RecoverySchedule,
    Signal, Window, WindowShape,
};

use crate::accrual::MarkDead;
use crate::{seeds, EqualJitter};

/// Finagle's `FailureAccrualPolicy.successRateWithinDuration(rate, window, backoff,
/// min_requests)`.
///
/// Each endpoint's success rate is an exponentially weighted moving average over time: a call
/// moves it toward 1 (success) or 0 (failure) by `1 − e^(−Δt / window)`, `Δt` the time since the
/// last call, so that `window` is the mean lifetime of an observation (its first call sets it).
/// A failure marks the endpoint dead, for the next time of its [`EqualJitter`] back-off, when
/// the average is below `rate`, at least `min_requests` calls came in the last `window` (in five
/// slices), and the endpoint has been judged for a whole `window` since its first call or its
/// revival. It asks the layer for no calls: the average moves with time, and calls pulled to a
/// failing endpoint would only fail (the balancer's next call to it is judged). As in Finagle,
/// only a failure marks dead; after the time out nothing is forgotten
/// until its first success revives it (the average, the count and the back-off start again).
///
/// An endpoint that begins to fail every call crosses 0.8 after `window · ln(1/0.8)`, 6.7 s of
/// the default 30 s, however many calls it gets (Finagle's source says "about 6 seconds":
/// `window · (1 − rate)`, the line's first-order approximation).
///
/// ```
/// use std::time::Duration;
/// use tower_outlier_finagle::SuccessRateAccrual;
///
/// let policy = SuccessRateAccrual::new(0.8, Duration::from_secs(30))?.min_requests(5);
/// assert_eq!(policy.required_success_rate(), 0.8);
/// # Ok::<(), tower_outlier_core::ConfigError>(())
/// ```
#[derive(Debug)]
pub struct SuccessRateAccrual {
    required: f64,
    window: Duration,
    min_requests: u64,
    backoff: EqualJitter,
    seeds: seeds::Seeds,
    // The request count's: the window in five slices, as Finagle's.
    shape: WindowShape,
}

impl SuccessRateAccrual {
    /// Name in logs, snapshots and reasons.
    pub const NAME: &'static str = "success-rate-ema";

    /// Dead below `required` (in `[0, 1]`) over `window` (at least 5 ms), with Finagle's
    /// back-off and minimum of 5 requests.
    pub fn new(required: f64, window: Duration) -> Result<Self, ConfigError> {
        let required = check_ratio("required_success_rate", required)?;
        if window < Duration::from_millis(5) {
            return Err(ConfigError::new(
                "window",
                format!("{window:?}"),
                "at least 5 ms",
            ));
        }
        let shape = WindowShape::new(window, 5)?;
        Ok(SuccessRateAccrual {
            shape,
            required,
            window,
            min_requests: 5,
            backoff: EqualJitter::finagle(),
            seeds: seeds::Seeds::random(),
        })
    }

    /// Calls the endpoint must have had in the last window to be marked dead.
    pub fn min_calls(mut self, min_calls: u64) -> Self {
        self.min_requests = min_calls;
        self
    }

    /// Sets the fewest calls: [`min_calls`](Self::min_calls).
    #[deprecated(
        since = "0.2.0",
        note = "renamed `min_calls`, as in the other policies"
    )]
    pub fn min_requests(self, min_requests: u64) -> Self {
        self.min_calls(min_requests)
    }

    /// The back-off to mark endpoints dead by.
    pub fn backoff(mut self, backoff: EqualJitter) -> Self {
        self.backoff = backoff;
        self
    }

    /// The back-off's jitter drawn from `seed`: the same calls give the same times.
    pub fn seeded(mut self, seed: u64) -> Self {
        self.seeds = seeds::Seeds::new(seed);
        self
    }

    /// The success rate below which an endpoint is marked dead.
    pub fn required_success_rate(&self) -> f64 {
        self.required
    }

    /// The average's mean lifetime of an observation, and the span of the request count.
    pub fn window(&self) -> Duration {
        self.window
    }
}

impl OutlierPolicy for SuccessRateAccrual {
    type Endpoint = SuccessRateEndpoint;

    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn new_endpoint(&self) -> SuccessRateEndpoint {
        SuccessRateEndpoint {
            required: self.required,
            window_nanos: duration_to_nanos(self.window),
            window_millis: self.window.as_secs_f64() * 1e3,
            min_requests: self.min_requests,
            average: AtomicU64::new(NO_AVERAGE),
            since: AtomicU64::new(Nanos::MAX),
            requests: self.shape.window(),
            mark: MarkDead::new(self.backoff, self.seeds.next()),
        }
    }

    /// Keeps the average, its time base, the request count (taken over by the new window) and
    /// the back-off's place.
    fn new_endpoint_from(&self, previous: &SuccessRateEndpoint, now: Nanos) -> SuccessRateEndpoint {
        let next = self.new_endpoint();
        next.average
            .store(previous.average.load(Ordering::Relaxed), Ordering::Relaxed);
        next.since
            .store(previous.since.load(Ordering::Relaxed), Ordering::Relaxed);
        next.requests.absorb(&previous.requests, now);
        next.mark.carry_from(&previous.mark);
        next
    }

    fn recovery(&self) -> RecoverySchedule {
        // The endpoint's back-off times each ejection; this is the layer's probe timeout.
        RecoverySchedule::fixed(self.backoff.start())
    }

    fn trial_period(&self) -> Duration {
        self.backoff.start()
    }
}

/// The average and the time of its last call, in one word so that two calls racing each move it
/// once: the average as an `f32` in the high half, the millisecond of the last call (since the
/// endpoint's first call or revival, wrapping) in the low half.
const NO_AVERAGE: u64 = u64::MAX;

fn unpack(word: u64) -> (f64, u32) {
    (f64::from(f32::from_bits((word >> 32) as u32)), word as u32)
}

fn pack(average: f64, millis: u32) -> u64 {
    (u64::from((average as f32).to_bits()) << 32) | u64::from(millis)
}

/// [`SuccessRateAccrual`]'s state for one endpoint.
#[derive(Debug)]
pub struct SuccessRateEndpoint {
    required: f64,
    window_nanos: Nanos,
    window_millis: f64,
    min_requests: u64,
    average: AtomicU64,
    // When the endpoint's first call (or first after its revival) came: `Nanos::MAX` before.
    since: AtomicU64,
    requests: Window,
    mark: MarkDead,
}

impl SuccessRateEndpoint {
    /// The average now (1 before any call).
    pub fn success_rate(&self) -> f64 {
        match self.average.load(Ordering::Relaxed) {
            NO_AVERAGE => 1.0,
            word => unpack(word).0,
        }
    }

    /// Moves the average toward `x` (1 or 0) at `now`; the average after.
    fn update(&self, x: f64, now: Nanos) -> f64 {
        let mut since = self.since.load(Ordering::Relaxed);
        if since == Nanos::MAX {
            since = match self.since.compare_exchange(
                Nanos::MAX,
                now,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => now,
                Err(first) => first,
            };
        }
        let millis = (now.saturating_sub(since) / 1_000_000) as u32;
        let mut word = self.average.load(Ordering::Relaxed);
        loop {
            let average = if word == NO_AVERAGE {
                x
            } else {
                let (average, last) = unpack(word);
                // Two racing calls: the later stamp may be written first.
                let elapsed = millis.wrapping_sub(last);
                if elapsed == 0 || elapsed > u32::MAX / 2 {
                    // No time has passed: the weight of the new call is 1 − e⁰ = 0, and the
                    // word stays as it is (no write, so cores calling at once share it).
                    return average;
                }
                let w = (-f64::from(elapsed) / self.window_millis).exp();
                x * (1.0 - w) + average * w
            };
            match self.average.compare_exchange_weak(
                word,
                pack(average, millis),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return average,
                Err(now_word) => word = now_word,
            }
        }
    }

    fn revive(&self) {
        self.average.store(NO_AVERAGE, Ordering::Relaxed);
        self.since.store(Nanos::MAX, Ordering::Relaxed);
        self.requests.clear();
    }
}

impl EndpointPolicy for SuccessRateEndpoint {
    #[inline]
    fn record(&self, observation: &Observation, now: Nanos) -> Signal {
        match observation.outcome {
            Outcome::Success => {
                if self.mark.succeeded() {
                    self.revive();
                }
                self.update(1.0, now);
                self.requests.record(now, false, false);
                Signal::None
            }
            Outcome::Failure(_) => {
                let average = self.update(0.0, now);
                self.requests.record(now, true, false);
                let since = self.since.load(Ordering::Relaxed);
                if average < self.required
                    && now.saturating_sub(since) >= self.window_nanos
                    && self.requests.counts(now).calls >= self.min_requests
                {
                    self.mark.fire();
                    Signal::Evaluate
                } else {
                    Signal::None
                }
            }
            Outcome::Cancelled | Outcome::NotSent => Signal::None,
        }
    }

    fn judge(&self, now: Nanos) -> Judgement {
        if !self.mark.fired() {
            return Judgement::Healthy;
        }
        Judgement::Outlier(Reason {
            policy: SuccessRateAccrual::NAME,
            measure: "success rate (moving average)",
            value: self.success_rate(),
            threshold: self.required,
            comparison: Comparison::Below,
            counts: self.requests.counts(now),
        })
    }

    fn describe(&self, now: Nanos) -> Description {
        Description {
            counts: self.requests.counts(now),
            ..Description::default()
        }
    }

    fn reset(&self) {
        self.mark.readmitted();
    }

    fn own_timing(&self) -> Option<&dyn OwnTiming> {
        Some(self)
    }
}

impl OwnTiming for SuccessRateEndpoint {
    fn check_at(&self, now: Nanos) -> Option<Nanos> {
        self.mark.mark_dead(now)
    }

    fn check_after_failed_probe(&self, _: u32, now: Nanos) -> Option<Nanos> {
        Some(self.mark.next(now))
    }

    fn ejection_refused(&self, _: Nanos) {
        self.mark.refused();
    }

    fn reset_backoff(&self) {
        self.mark.reset_backoff();
    }
}
