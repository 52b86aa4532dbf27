//! The statistical detectors' arithmetic: which endpoints of a fleet fall below the success-rate
//! threshold, and which reach the failure-percentage threshold. Pure functions over what one
//! interval counted.

use crate::config::{DetectorSemantics, FailurePercentage, SuccessRate, SuccessRateRule};

/// What one endpoint counted in the last interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    pub(crate) calls: u64,
    pub(crate) failures: u64,
}

/// The fewest calls, all failed, that [`Tally::carried`] takes as a starved endpoint's: one
/// failure may be a blip, after which the balancer avoids the endpoint for a moment.
const STARVED_FAILURES: u64 = 2;

impl Tally {
    /// This tally as if the endpoint had carried `volume` calls, when every call it had failed
    /// and there were at least [`STARVED_FAILURES`] of them (fewer than `volume`): what its
    /// system would have counted had its balancer not routed around it. Otherwise as it is.
    pub(crate) fn carried(self, volume: u64) -> Tally {
        if self.calls >= STARVED_FAILURES && self.failures >= self.calls && self.calls < volume {
            Tally {
                calls: volume,
                failures: volume,
            }
        } else {
            self
        }
    }

    /// The success rate in percent (100 for an endpoint with no calls).
    pub(crate) fn success_percent(&self) -> f64 {
        if self.calls == 0 {
            return 100.0;
        }
        100.0 * (self.calls - self.failures.min(self.calls)) as f64 / self.calls as f64
    }
}

/// A statistical detector's verdict on one endpoint.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Verdict {
    /// The endpoint's position in the slice judged.
    pub(crate) index: usize,
    /// Its success rate (success-rate detector) or failure percentage (failure percentage).
    pub(crate) value: f64,
    /// The threshold it fell below, or reached.
    pub(crate) threshold: f64,
}

/// The success-rate detector: the endpoints (`Some(tally)`; `None` ones do not take part) whose
/// success rate is below the fleet's threshold, when at least `minimum_hosts` endpoints have the
/// request volume.
pub(crate) fn success_rate_outliers(
    detector: &SuccessRate,
    fleet: &[Option<Tally>],
) -> Vec<Verdict> {
    let volume = u64::from(detector.request_volume);
    let eligible: Vec<(usize, f64)> = fleet
        .iter()
        .enumerate()
        .filter_map(|(index, tally)| {
            let tally = tally.as_ref()?;
            (tally.calls >= volume && tally.calls > 0).then(|| (index, tally.success_percent()))
        })
        .collect();
    if eligible.is_empty() || eligible.len() < detector.minimum_hosts as usize {
        return Vec::new();
    }
    let rates: Vec<f64> = eligible.iter().map(|(_, rate)| *rate).collect();
    let factor = f64::from(detector.stdev_factor) / 1000.0;
    let threshold = match detector.rule {
        SuccessRateRule::Stdev => {
            let mean = rates.iter().sum::<f64>() / rates.len() as f64;
            let variance =
                rates.iter().map(|r| (r - mean) * (r - mean)).sum::<f64>() / rates.len() as f64;
            mean - factor * variance.sqrt()
        }
        SuccessRateRule::Robust { min_spread } => {
            let center = median(rates.clone());
            let mad = median(rates.iter().map(|r| (r - center).abs()).collect());
            // 1.4826 × MAD estimates the standard deviation of normally distributed rates.
            center - factor * (1.4826 * mad).max(min_spread)
        }
    };
    eligible
        .into_iter()
        .filter(|(_, rate)| *rate < threshold)
        .map(|(index, value)| Verdict {
            index,
            value,
            threshold,
        })
        .collect()
}

/// The failure-percentage detector: the endpoints whose failure percentage reaches the threshold
/// (Envoy: at or above it; gRPC: above it), when at least `minimum_hosts` have the volume.
pub(crate) fn failure_percentage_outliers(
    detector: &FailurePercentage,
    semantics: DetectorSemantics,
    fleet: &[Option<Tally>],
) -> Vec<Verdict> {
    let volume = u64::from(detector.request_volume);
    let eligible: Vec<(usize, f64)> = fleet
        .iter()
        .enumerate()
        .filter_map(|(index, tally)| {
            let tally = tally.as_ref()?;
            (tally.calls >= volume && tally.calls > 0)
                .then(|| (index, 100.0 - tally.success_percent()))
        })
        .collect();
    if eligible.is_empty() || eligible.len() < detector.minimum_hosts as usize {
        return Vec::new();
    }
    let threshold = f64::from(detector.threshold);
    eligible
        .into_iter()
        .filter(|(_, failed)| match semantics {
            DetectorSemantics::Grpc => *failed > threshold,
            _ => *failed >= threshold,
        })
        .map(|(index, value)| Verdict {
            index,
            value,
            threshold,
        })
        .collect()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        return 0.0;
    }
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENVOY: SuccessRate = SuccessRate {
        rule: SuccessRateRule::Stdev,
        stdev_factor: 1900,
        enforcement: 100,
        local_origin_enforcement: 100,
        minimum_hosts: 5,
        request_volume: 100,
    };
    const ROBUST: SuccessRate = SuccessRate {
        rule: SuccessRateRule::robust(),
        ..ENVOY
    };

    /// Five endpoints with 1000 calls each and these success rates (in tenths of a percent).
    fn fleet(per_mille: &[u64]) -> Vec<Option<Tally>> {
        per_mille
            .iter()
            .map(|ok| {
                Some(Tally {
                    calls: 1000,
                    failures: 1000 - ok,
                })
            })
            .collect()
    }

    fn ejected(detector: &SuccessRate, fleet: &[Option<Tally>]) -> Vec<usize> {
        success_rate_outliers(detector, fleet)
            .iter()
            .map(|v| v.index)
            .collect()
    }

    #[test]
    fn the_one_outlier_among_five_is_found_by_both_rules() {
        let fleet = fleet(&[999, 998, 1000, 999, 700]);
        assert_eq!(ejected(&ENVOY, &fleet), vec![4]);
        assert_eq!(ejected(&ROBUST, &fleet), vec![4]);
    }

    #[test]
    fn two_of_five_fully_down_escape_the_stdev_rule_but_not_the_robust_one() {
        let fleet = fleet(&[1000, 1000, 1000, 0, 0]);
        // mean 60 %, stdev 49 %: the threshold is 60 − 1.9 × 49 < 0.
        let verdicts = success_rate_outliers(&ENVOY, &fleet);
        assert!(verdicts.is_empty(), "{verdicts:?}");
        assert_eq!(ejected(&ROBUST, &fleet), vec![3, 4]);
    }

    #[test]
    fn a_tight_healthy_fleet_ejects_none_under_either_rule() {
        // Every endpoint at or above 99.5 %.
        let spread = fleet(&[995, 996, 997, 998, 999]);
        assert!(ejected(&ENVOY, &spread).is_empty());
        assert!(ejected(&ROBUST, &spread).is_empty());
        // Four perfect endpoints and one at 99.9 %: the MAD is zero, and without the floor any
        // endpoint below 100 % would be "below the median". Envoy's own rule does eject here
        // (mean 99.98, stdev 0.04, threshold 99.904): the floor is what the robust rule adds.
        let tight = fleet(&[1000, 1000, 1000, 1000, 999]);
        assert!(ejected(&ROBUST, &tight).is_empty());
        assert_eq!(ejected(&ENVOY, &tight), vec![4]);
        let no_floor = SuccessRate {
            rule: SuccessRateRule::Robust { min_spread: 0.0 },
            ..ENVOY
        };
        assert_eq!(ejected(&no_floor, &tight), vec![4]);
    }

    #[test]
    fn too_few_hosts_or_calls_judge_nothing() {
        let mut fleet = fleet(&[1000, 1000, 1000, 1000, 0]);
        fleet[0] = Some(Tally {
            calls: 99,
            failures: 0,
        });
        assert!(
            ejected(&ENVOY, &fleet).is_empty(),
            "4 hosts have the volume"
        );
        fleet[0] = None;
        assert!(ejected(&ROBUST, &fleet).is_empty(), "4 hosts take part");
        fleet[0] = Some(Tally {
            calls: 100,
            failures: 0,
        });
        assert_eq!(ejected(&ENVOY, &fleet), vec![4]);
    }

    #[test]
    fn failure_percentage_threshold_is_inclusive_for_envoy_and_strict_for_grpc() {
        let detector = FailurePercentage {
            threshold: 85,
            enforcement: 100,
            local_origin_enforcement: 100,
            minimum_hosts: 5,
            request_volume: 50,
        };
        let fleet = fleet(&[1000, 1000, 1000, 150, 140]);
        let envoy: Vec<usize> =
            failure_percentage_outliers(&detector, DetectorSemantics::Envoy, &fleet)
                .iter()
                .map(|v| v.index)
                .collect();
        assert_eq!(envoy, vec![3, 4]);
        let grpc: Vec<usize> =
            failure_percentage_outliers(&detector, DetectorSemantics::Grpc, &fleet)
                .iter()
                .map(|v| v.index)
                .collect();
        assert_eq!(grpc, vec![4]);
        let small = &fleet[..4];
        assert!(failure_percentage_outliers(&detector, DetectorSemantics::Envoy, small).is_empty());
    }

    #[test]
    fn a_starved_endpoint_is_judged_as_if_it_had_carried_the_volume() {
        let tally = |calls, failures| Tally { calls, failures };
        // Every call failed, fewer than the volume: as if it had carried the volume.
        assert_eq!(tally(3, 3).carried(100), tally(100, 100));
        // One failure may be a blip; a success says it is not failing every call; at or over
        // the volume it is judged on what it had anyway.
        assert_eq!(tally(1, 1).carried(100), tally(1, 1));
        assert_eq!(tally(3, 2).carried(100), tally(3, 2));
        assert_eq!(tally(0, 0).carried(100), tally(0, 0));
        assert_eq!(tally(150, 150).carried(100), tally(150, 150));
        // Among four healthy endpoints with the volume, the starved one is the outlier.
        let detector = SuccessRate {
            rule: SuccessRateRule::Stdev,
            stdev_factor: 1900,
            enforcement: 100,
            local_origin_enforcement: 100,
            minimum_hosts: 5,
            request_volume: 100,
        };
        let mut fleet = vec![Some(tally(400, 0)); 4];
        fleet.push(Some(tally(3, 3)));
        assert!(ejected(&detector, &fleet).is_empty(), "not without it");
        fleet[4] = fleet[4].map(|t| t.carried(100));
        assert_eq!(ejected(&detector, &fleet), vec![4]);
    }
}
