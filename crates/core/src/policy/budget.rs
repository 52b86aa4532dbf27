//! How many endpoints may be out at once, and when an ejected one is checked again.

use std::time::Duration;

use crate::error::{check_nonzero_duration, check_ratio, ConfigError};

/// How `n × max ratio` becomes a number of endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetFloor {
    /// Round down, and eject none when that is below one (EDAS: "if the result is less than 1,
    /// no instance is removed"). Envoy's rule too: an ejection is allowed while
    /// `(ejected + 1) / n` stays within the ratio.
    Zero,
    /// Round down, and eject one when that is below one (HSF: "if the result is less than 1, one
    /// instance is removed"; Envoy's `always_eject_one_host`).
    One,
    /// Round up: an ejection is allowed while fewer than `n × ratio` are ejected (gRPC checks
    /// `ejected / n < ratio` before each ejection), so any ratio above zero allows one.
    RoundUp,
}

/// How many endpoints may be ejected at once: `floor(n × max_ratio)`, with [`BudgetFloor`]
/// deciding the case where that is below one. `n` counts every endpoint the upstream holds.
///
/// ```
/// use tower_outlier_core::{EjectionBudget, BudgetFloor};
///
/// let edas = EjectionBudget::new(0.6, BudgetFloor::Zero).unwrap();
/// assert_eq!(edas.max_ejected(6), 3); // 6 × 60 % = 3.6 → 3
/// assert_eq!(EjectionBudget::new(0.2, BudgetFloor::Zero).unwrap().max_ejected(4), 0);
/// assert_eq!(EjectionBudget::new(0.2, BudgetFloor::One).unwrap().max_ejected(4), 1);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EjectionBudget {
    max_ratio: f64,
    floor: BudgetFloor,
}

impl EjectionBudget {
    /// A budget of `max_ratio` (in `[0, 1]`) of the endpoints.
    pub fn new(max_ratio: f64, floor: BudgetFloor) -> Result<Self, ConfigError> {
        Ok(EjectionBudget {
            max_ratio: check_ratio("max_ejection_ratio", max_ratio)?,
            floor,
        })
    }

    /// A budget usable in constants: `None` when `max_ratio` is outside `[0, 1]`.
    pub const fn const_new(max_ratio: f64, floor: BudgetFloor) -> Option<Self> {
        if max_ratio >= 0.0 && max_ratio <= 1.0 {
            Some(EjectionBudget { max_ratio, floor })
        } else {
            None
        }
    }

    /// The configured ratio.
    pub fn max_ratio(&self) -> f64 {
        self.max_ratio
    }

    /// The configured floor rule.
    pub fn floor(&self) -> BudgetFloor {
        self.floor
    }

    /// How many of `endpoints` may be ejected at once (before the last-endpoint rule).
    pub fn max_ejected(&self, endpoints: usize) -> usize {
        // The small epsilon keeps 10 × 0.3 (2.9999999999999996 in binary) from flooring to 2.
        let exact = endpoints as f64 * self.max_ratio;
        if self.floor == BudgetFloor::RoundUp {
            return ((exact - 1e-9).ceil().max(0.0) as usize).min(endpoints);
        }
        let raw = (exact + 1e-9).floor() as usize;
        if raw == 0 && endpoints > 0 && self.floor == BudgetFloor::One && self.max_ratio > 0.0 {
            1
        } else {
            raw.min(endpoints)
        }
    }
}

/// What the layer does when the rules would leave the balancer no endpoint to pick: the choice
/// each system makes differently, and every layer makes explicitly.
///
/// ```
/// use tower_outlier_core::WhenAllOut;
///
/// let envoy = WhenAllOut::panic_below(0.5).unwrap();
/// assert!(envoy.panics(2, 5), "2 of 5 healthy is below half: all five get traffic");
/// assert!(!envoy.panics(3, 5));
/// assert!(WhenAllOut::panic_below(1.5).is_err());
/// assert_eq!(WhenAllOut::default(), WhenAllOut::KeepLast);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[non_exhaustive]
pub enum WhenAllOut {
    /// Never eject the last endpoint the balancer can pick: it stays in and takes the traffic
    /// (EDAS and HSF; SOFARPC and Sentinel never empty a service either). The default, and the
    /// recommendation: a fleet the rules would empty is more likely failing as a whole than
    /// failing everywhere at once, and callers get whatever it still answers.
    #[default]
    KeepLast,
    /// Eject the last one too. With none to pick, calls fail at once when the balancer is behind
    /// the layer's fail-fast guard (gRPC: a pick with every address ejected fails UNAVAILABLE;
    /// linkerd: requests fail fast while every endpoint's breaker is open); without the guard
    /// they wait until an endpoint is back (gRPC's wait-for-ready).
    FailFast,
    /// Envoy's `healthy_panic_threshold`: while fewer than this share of the endpoints are
    /// healthy (neither ejected nor unready), the balancer gets every endpoint, ejected ones
    /// included, and ejections go on being decided and timed as usual. The last endpoint may be
    /// ejected (the fleet then panics); 0 turns panic off, and an emptied set then waits as
    /// [`FailFast`](Self::FailFast) without its guard.
    PanicBelow(f64),
}

impl WhenAllOut {
    /// [`PanicBelow`](Self::PanicBelow) `healthy` (a share in `[0, 1]`): Envoy's default is 0.5.
    pub fn panic_below(healthy: f64) -> Result<Self, ConfigError> {
        Ok(WhenAllOut::PanicBelow(check_ratio(
            "healthy_panic_threshold",
            healthy,
        )?))
    }

    /// Whether `healthy` of `endpoints` puts the fleet in panic.
    pub fn panics(&self, healthy: usize, endpoints: usize) -> bool {
        match *self {
            WhenAllOut::PanicBelow(threshold) => {
                endpoints > 0 && (healthy as f64) < threshold * endpoints as f64 - 1e-9
            }
            WhenAllOut::KeepLast | WhenAllOut::FailFast => false,
        }
    }

    /// Whether the last endpoint the balancer can pick is kept in.
    pub fn keeps_last(&self) -> bool {
        matches!(self, WhenAllOut::KeepLast)
    }
}

/// The linear recovery schedule of EDAS and HSF: the first check one `unit` after ejection, each
/// failed check one `unit` longer than the last, up to `max_multiple` units, and back to one unit
/// once the endpoint recovers.
///
/// ```
/// use std::time::Duration;
/// use tower_outlier_core::RecoverySchedule;
///
/// let edas = RecoverySchedule::new(Duration::from_secs(30), 20).unwrap();
/// assert_eq!(edas.delay(0), Duration::from_secs(30));
/// assert_eq!(edas.delay(1), Duration::from_secs(60));
/// // After 20 failed checks, every check is 20 × 30 s = 10 min apart.
/// assert_eq!(edas.delay(20), Duration::from_secs(600));
/// assert_eq!(edas.delay(1000), Duration::from_secs(600));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecoverySchedule {
    unit: Duration,
    max_multiple: u32,
}

impl RecoverySchedule {
    /// A schedule of `unit` steps capped at `max_multiple` units. Both must be non-zero.
    pub fn new(unit: Duration, max_multiple: u32) -> Result<Self, ConfigError> {
        check_nonzero_duration("recovery_unit", unit)?;
        if max_multiple == 0 {
            return Err(ConfigError::new("max_recovery_multiple", 0, "at least 1"));
        }
        Ok(RecoverySchedule { unit, max_multiple })
    }

    /// The same wait, `unit` (at least one nanosecond), before every check: no growth.
    pub fn fixed(unit: Duration) -> Self {
        RecoverySchedule {
            unit: unit.max(Duration::from_nanos(1)),
            max_multiple: 1,
        }
    }

    /// The recovery unit.
    pub fn unit(&self) -> Duration {
        self.unit
    }

    /// The cap, in units.
    pub fn max_multiple(&self) -> u32 {
        self.max_multiple
    }

    /// The wait before the next check, after `failed_checks` consecutive failed checks.
    pub fn delay(&self, failed_checks: u32) -> Duration {
        let multiple = failed_checks.saturating_add(1).min(self.max_multiple);
        self.unit.saturating_mul(multiple)
    }
}
