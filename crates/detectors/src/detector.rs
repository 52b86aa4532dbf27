//! The detectors by name, and what every endpoint state of one policy shares with it: the
//! configuration, the enforcement dice and the counters of what each detector found.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tower_outlier_core::{Comparison, Nanos};

use crate::config::DetectorConfig;
use crate::enforcement::Dice;

/// One of the detectors, for counters and reasons.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Detector {
    /// Consecutive 5xx (any failure, for services that are not HTTP).
    Consecutive5xx,
    /// Consecutive gateway failures (502, 503, 504).
    ConsecutiveGatewayFailure,
    /// Consecutive local-origin failures (with the origins split).
    ConsecutiveLocalOriginFailure,
    /// Success rate.
    SuccessRate,
    /// Failure percentage.
    FailurePercentage,
    /// Local-origin success rate (with the origins split).
    LocalOriginSuccessRate,
    /// Local-origin failure percentage (with the origins split).
    LocalOriginFailurePercentage,
}

impl Detector {
    /// Every detector, in the order of their counters.
    pub const ALL: [Detector; 7] = [
        Detector::Consecutive5xx,
        Detector::ConsecutiveGatewayFailure,
        Detector::ConsecutiveLocalOriginFailure,
        Detector::SuccessRate,
        Detector::FailurePercentage,
        Detector::LocalOriginSuccessRate,
        Detector::LocalOriginFailurePercentage,
    ];

    pub(crate) const CONSECUTIVE: [Detector; 3] = [
        Detector::Consecutive5xx,
        Detector::ConsecutiveGatewayFailure,
        Detector::ConsecutiveLocalOriginFailure,
    ];

    fn index(self) -> usize {
        self as usize
    }

    pub(crate) fn bit(self) -> u8 {
        1 << self.index()
    }

    pub(crate) fn from_bit(bits: u8) -> Detector {
        Detector::ALL[(bits.trailing_zeros() as usize).min(Detector::ALL.len() - 1)]
    }

    /// How its value crosses its threshold: a success rate falls below it, a streak or a
    /// failure percentage reaches it.
    pub fn comparison(self) -> Comparison {
        match self {
            Detector::SuccessRate | Detector::LocalOriginSuccessRate => Comparison::Below,
            _ => Comparison::AtOrAbove,
        }
    }

    /// What the detector measures, in words (the `measure` of its ejections' reasons).
    pub fn measure(self) -> &'static str {
        match self {
            Detector::Consecutive5xx => "consecutive 5xx",
            Detector::ConsecutiveGatewayFailure => "consecutive gateway failures",
            Detector::ConsecutiveLocalOriginFailure => "consecutive local-origin failures",
            Detector::SuccessRate => "success rate",
            Detector::FailurePercentage => "failure percentage",
            Detector::LocalOriginSuccessRate => "local-origin success rate",
            Detector::LocalOriginFailurePercentage => "local-origin failure percentage",
        }
    }
}

/// What each detector found and what became of it, as Envoy counts it: `detected` (Envoy's
/// `ejections_detected_*`), `enforced` (ejections made, `ejections_enforced_*`), `unenforced`
/// (detections its enforcement percentage let go) and `overflow` (ejections the layer refused:
/// the budget or the last endpoint; `ejections_overflow`, here per detector). A refused ejection
/// may still be made later, within one interval, when room appears.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DetectorStats {
    detected: [u64; 7],
    enforced: [u64; 7],
    unenforced: [u64; 7],
    overflow: [u64; 7],
}

impl DetectorStats {
    /// Outliers `detector` found.
    pub fn detected(&self, detector: Detector) -> u64 {
        self.detected[detector.index()]
    }

    /// Ejections `detector`'s findings made.
    pub fn enforced(&self, detector: Detector) -> u64 {
        self.enforced[detector.index()]
    }

    /// Findings its enforcement percentage let go.
    pub fn unenforced(&self, detector: Detector) -> u64 {
        self.unenforced[detector.index()]
    }

    /// Ejections the layer refused (the budget, or the last endpoint).
    pub fn overflow(&self, detector: Detector) -> u64 {
        self.overflow[detector.index()]
    }
}

pub(crate) struct Shared {
    pub(crate) config: DetectorConfig,
    pub(crate) name: &'static str,
    // The consecutive detectors' thresholds (0: off; the local-origin one only when split) and
    // which of them may eject (enforcement above 0): here, not copied into every endpoint.
    pub(crate) thresholds: [u32; 3],
    pub(crate) enforcing: [bool; 3],
    // Kept across reconfigurations: the dice go on, the counters keep counting.
    runtime: Arc<Runtime>,
}

pub(crate) struct Runtime {
    dice: Dice,
    detected: [AtomicU64; 7],
    enforced: [AtomicU64; 7],
    unenforced: [AtomicU64; 7],
    overflow: [AtomicU64; 7],
    // When the layer's interval timer started (`FleetPolicy::started`), `Nanos::MAX` before: the
    // tick series an ejection made before the first tick ends on. A policy shared by layers
    // started at different times aligns to the last one started.
    ticks_from: AtomicU64,
}

impl Shared {
    fn enforcement(&self, detector: Detector) -> u32 {
        let config = &self.config;
        match detector {
            Detector::Consecutive5xx => config.consecutive_5xx.enforcement,
            Detector::ConsecutiveGatewayFailure => config.consecutive_gateway_failure.enforcement,
            Detector::ConsecutiveLocalOriginFailure => {
                config.consecutive_local_origin_failure.enforcement
            }
            // linkerd's success-rate trigger has no enforcement percentage: it always trips.
            Detector::SuccessRate => config.success_rate.map_or_else(
                || u32::from(config.recent_success_rate.is_some()) * 100,
                |d| d.enforcement,
            ),
            Detector::LocalOriginSuccessRate => config
                .success_rate
                .map_or(0, |d| d.local_origin_enforcement),
            Detector::FailurePercentage => config.failure_percentage.map_or(0, |d| d.enforcement),
            Detector::LocalOriginFailurePercentage => config
                .failure_percentage
                .map_or(0, |d| d.local_origin_enforcement),
        }
    }

    /// Counts a detection and rolls its enforcement: whether to ask for the ejection.
    pub(crate) fn detected(&self, detector: Detector) -> bool {
        let runtime = &self.runtime;
        runtime.detected[detector.index()].fetch_add(1, Ordering::Relaxed);
        let enforce = runtime.dice.enforce(self.enforcement(detector));
        if !enforce {
            runtime.unenforced[detector.index()].fetch_add(1, Ordering::Relaxed);
        }
        enforce
    }

    pub(crate) fn ejected(&self, detector: Detector) {
        self.runtime.enforced[detector.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn overflowed(&self, detector: Detector) {
        self.runtime.overflow[detector.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// When the layer's interval timer started, if it has.
    pub(crate) fn ticks_from(&self) -> Option<Nanos> {
        match self.runtime.ticks_from.load(Ordering::Relaxed) {
            Nanos::MAX => None,
            at => Some(at),
        }
    }

    pub(crate) fn dice(&self) -> &Dice {
        &self.runtime.dice
    }

    /// The detectors' shared state for `config`, counting and rolling dice in `runtime`.
    pub(crate) fn new(config: DetectorConfig, runtime: Arc<Runtime>) -> Self {
        let name = config.policy_name();
        let thresholds = [
            config.consecutive_5xx.threshold,
            config.consecutive_gateway_failure.threshold,
            if config.split_external_local_origin_errors {
                config.consecutive_local_origin_failure.threshold
            } else {
                0
            },
        ];
        let enforcing = [
            config.consecutive_5xx.enforcement > 0,
            config.consecutive_gateway_failure.enforcement > 0,
            config.consecutive_local_origin_failure.enforcement > 0,
        ];
        Shared {
            config,
            name,
            thresholds,
            enforcing,
            runtime,
        }
    }

    /// The counters and dice, to go on under another configuration.
    pub(crate) fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    /// What the detectors found so far.
    pub(crate) fn stats(&self) -> DetectorStats {
        let load =
            |counters: &[AtomicU64; 7]| counters.each_ref().map(|c| c.load(Ordering::Relaxed));
        let runtime = &self.runtime;
        DetectorStats {
            detected: load(&runtime.detected),
            enforced: load(&runtime.enforced),
            unenforced: load(&runtime.unenforced),
            overflow: load(&runtime.overflow),
        }
    }

    /// The layer's interval timer started at `at`.
    pub(crate) fn started(&self, at: Nanos) {
        self.runtime.ticks_from.store(at, Ordering::Relaxed);
    }
}

impl Runtime {
    /// Counters at zero, dice seeded with `seed`.
    pub(crate) fn new(seed: u64) -> Arc<Self> {
        Arc::new(Runtime {
            dice: Dice::new(seed),
            detected: Default::default(),
            enforced: Default::default(),
            unenforced: Default::default(),
            overflow: Default::default(),
            ticks_from: AtomicU64::new(Nanos::MAX),
        })
    }
}
