//! linkerd's failure-accrual annotations, read as linkerd2's policy controller reads them from a
//! Service's (or an EgressNetwork's) metadata.

use std::time::Duration;

use tower_outlier_core::text::name;
use tower_outlier_core::{ConfigError, DocumentError};

use crate::config::{DetectorConfig, RecentSuccessRate};

/// The document name errors carry.
const DOCUMENT: &str = "linkerd annotations";

/// The failure-accrual mode: absent means no failure accrual.
pub(crate) const ACCRUAL: &str = "balancer.linkerd.io/failure-accrual";
const CONSECUTIVE: &str = "balancer.linkerd.io/failure-accrual-consecutive-";
const SUCCESS_RATE: &str = "balancer.alpha.linkerd.io/failure-accrual-success-rate-";
const HONOR_RETRY_AFTER: &str = "balancer.alpha.linkerd.io/failure-accrual-honor-retry-after";

/// linkerd's failure accrual read from a Service's annotations (linkerd2's policy controller,
/// as of its unified failure accrual of mid-2026).
///
/// | annotation | read as | default |
/// |---|---|---|
/// | `balancer.linkerd.io/failure-accrual` | `consecutive` ([`DetectorConfig::linkerd_consecutive`]) or `unified` ([`DetectorConfig::linkerd`]); absent: no failure accrual | — |
/// | `…/failure-accrual-consecutive-max-failures` | failures in a row (`u32`) | 7 |
/// | `…/failure-accrual-consecutive-min-penalty` | shortest back-off | 1s |
/// | `…/failure-accrual-consecutive-max-penalty` | longest back-off, above zero | 60s |
/// | `…/failure-accrual-consecutive-jitter-ratio` | back-off jitter, 0 to 100 | 0.5 |
/// | `balancer.alpha.linkerd.io/failure-accrual-success-rate-threshold` | unified only: 0 to 1 | 0.8 |
/// | `…/failure-accrual-success-rate-window` | unified only: above zero; at least 10ms unless the threshold is 0 | 10s |
/// | `…/failure-accrual-success-rate-min-requests` | unified only: at most 1000000 unless the threshold is 0 | 5 |
/// | `balancer.alpha.linkerd.io/failure-accrual-honor-retry-after` | a boolean ([`honor_retry_after`](Self::honor_retry_after)) | false |
///
/// Durations are whole numbers with a unit, `ms`, `s`, `m`, `h` or `d` (`0` alone is zero);
/// booleans are Go's (`true`, `True`, `TRUE`, `t`, `T`, `1` and the same for false); values are
/// trimmed. Other annotations are ignored, and so are the success-rate keys outside the unified
/// mode and an unknown success-rate key (as linkerd does; [`ignored`](Self::ignored) lists them).
///
/// Where linkerd's controller logs a bad value and turns failure accrual off for the Service,
/// the reader refuses it with an error naming the annotation, so a typo does not silently
/// remove protection.
///
/// ```
/// use std::time::Duration;
/// use tower_outlier_detectors::LinkerdAnnotations;
///
/// let read = LinkerdAnnotations::from_annotations([
///     ("balancer.linkerd.io/failure-accrual", "unified"),
///     ("balancer.linkerd.io/failure-accrual-consecutive-max-failures", "3"),
///     ("balancer.alpha.linkerd.io/failure-accrual-success-rate-window", "30s"),
/// ])?;
/// let config = read.config().expect("failure accrual is on");
/// assert_eq!(config.consecutive_5xx().threshold, 3);
/// assert_eq!(config.recent_success_rate().unwrap().window, Duration::from_secs(30));
///
/// let none = LinkerdAnnotations::from_annotations([("app", "checkout")])?;
/// assert!(none.config().is_none());
/// # Ok::<(), tower_outlier_core::DocumentError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct LinkerdAnnotations {
    config: Option<DetectorConfig>,
    honor_retry_after: bool,
    ignored: Vec<String>,
}

impl LinkerdAnnotations {
    /// Reads the failure-accrual annotations among `annotations` (name, value).
    ///
    /// # Errors
    ///
    /// A [`DocumentError`] naming the annotation: an unknown mode, a value that is not a
    /// number, a duration or a boolean as linkerd writes them, or one out of linkerd's ranges
    /// (`min-penalty` above `max-penalty`, a zero `max-penalty`, a threshold outside 0 to 1, a
    /// window under 10ms).
    pub fn from_annotations<'a, I>(annotations: I) -> Result<Self, DocumentError>
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
    {
        let mut mode = None;
        let mut consecutive: Vec<(&str, &str)> = Vec::new();
        let mut success_rate: Vec<(&str, &str)> = Vec::new();
        let mut honor_retry_after = false;
        let mut ignored = Vec::new();
        for (key, value) in annotations {
            if key == ACCRUAL {
                mode = Some(value.trim());
            } else if key == HONOR_RETRY_AFTER {
                honor_retry_after = boolean(key, value)?;
            } else if let Some(name) = key.strip_prefix(CONSECUTIVE) {
                consecutive.push((name, value));
            } else if let Some(name) = key.strip_prefix(SUCCESS_RATE) {
                success_rate.push((name, value));
            }
        }
        let unified = match mode {
            None => {
                ignored.extend(
                    consecutive
                        .iter()
                        .map(|(name, _)| format!("{CONSECUTIVE}{name}")),
                );
                ignored.extend(
                    success_rate
                        .iter()
                        .map(|(name, _)| format!("{SUCCESS_RATE}{name}")),
                );
                return Ok(LinkerdAnnotations {
                    config: None,
                    honor_retry_after,
                    ignored,
                });
            }
            Some("consecutive") => false,
            Some("unified") => true,
            Some(other) => {
                return Err(invalid(ACCRUAL, other, "consecutive or unified"));
            }
        };
        let mut builder = if unified {
            DetectorConfig::linkerd()
        } else {
            DetectorConfig::linkerd_consecutive()
        };
        let (mut min, mut max, mut jitter) = (Duration::from_secs(1), Duration::from_secs(60), 0.5);
        for (name, value) in consecutive {
            let key = format!("{CONSECUTIVE}{name}");
            match name {
                "max-failures" => builder = builder.consecutive_5xx(count(&key, value)?),
                "min-penalty" => min = duration(&key, value)?,
                "max-penalty" => max = duration(&key, value)?,
                "jitter-ratio" => {
                    jitter = value
                        .trim()
                        .parse::<f32>()
                        .map_err(|_| invalid(&key, value, "a number from 0 to 100"))?
                        .into();
                }
                _ => ignored.push(key),
            }
        }
        if max.is_zero() {
            return Err(invalid(
                &format!("{CONSECUTIVE}max-penalty"),
                "0",
                "above zero",
            ));
        }
        if min > max {
            return Err(invalid(
                &format!("{CONSECUTIVE}min-penalty"),
                &format!("{min:?}"),
                &format!("at most max-penalty ({max:?})"),
            ));
        }
        if !(0.0..=100.0).contains(&jitter) {
            let key = format!("{CONSECUTIVE}jitter-ratio");
            return Err(invalid(&key, &jitter.to_string(), "a number from 0 to 100"));
        }
        builder = builder
            .base_ejection_time(min)
            .max_ejection_time(max)
            .backoff_jitter(jitter);
        if unified {
            builder =
                builder.recent_success_rate(Some(read_success_rate(success_rate, &mut ignored)?));
        } else {
            ignored.extend(
                success_rate
                    .iter()
                    .map(|(name, _)| format!("{SUCCESS_RATE}{name}")),
            );
        }
        let config = builder.build().map_err(|error| {
            let shown = name(error.field());
            DocumentError::invalid(DOCUMENT, error, shown)
        })?;
        Ok(LinkerdAnnotations {
            config: Some(config),
            honor_retry_after,
            ignored,
        })
    }

    /// The detector configuration, or `None` when the annotations ask for no failure accrual.
    pub fn config(&self) -> Option<&DetectorConfig> {
        self.config.as_ref()
    }

    /// `failure-accrual-honor-retry-after`. linkerd's controller sends it, but its proxy does
    /// not act on it (as of linkerd2-proxy of August 2026), and neither does this crate: it is
    /// read so that a value linkerd refuses is refused here too.
    pub fn honor_retry_after(&self) -> bool {
        self.honor_retry_after
    }

    /// The failure-accrual annotations that had no effect: unknown keys under its prefixes, and
    /// keys of a mode not in force.
    pub fn ignored(&self) -> &[String] {
        &self.ignored
    }
}

fn read_success_rate(
    keys: Vec<(&str, &str)>,
    ignored: &mut Vec<String>,
) -> Result<RecentSuccessRate, DocumentError> {
    let (mut threshold, mut window, mut min_requests) = (0.8, Duration::from_secs(10), 5);
    let mut window_key = format!("{SUCCESS_RATE}window");
    let mut min_requests_key = format!("{SUCCESS_RATE}min-requests");
    for (name, value) in keys {
        let key = format!("{SUCCESS_RATE}{name}");
        match name {
            "threshold" => {
                threshold = value
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|t| (0.0..=1.0).contains(t))
                    .ok_or_else(|| invalid(&key, value, "a success rate from 0.0 to 1.0"))?;
            }
            "window" => {
                window = duration(&key, value)?;
                window_key = key;
            }
            "min-requests" => {
                min_requests = count(&key, value)?;
                min_requests_key = key;
            }
            _ => ignored.push(key),
        }
    }
    if window.is_zero() {
        return Err(invalid(&window_key, "0", "above zero"));
    }
    if threshold != 0.0 && window < Duration::from_millis(10) {
        return Err(invalid(
            &window_key,
            &format!("{window:?}"),
            "at least 10ms",
        ));
    }
    if threshold != 0.0 && min_requests > 1_000_000 {
        return Err(invalid(
            &min_requests_key,
            &min_requests.to_string(),
            "at most 1000000",
        ));
    }
    Ok(RecentSuccessRate {
        threshold,
        window,
        min_requests: if threshold == 0.0 {
            min_requests.min(1_000_000)
        } else {
            min_requests
        },
    })
}

/// `key` refused its `value` (read verbatim, so shown escaped and clipped).
fn invalid(key: &str, value: &str, allowed: &str) -> DocumentError {
    DocumentError::invalid(DOCUMENT, ConfigError::new(key, value, allowed), name(key))
        .showing_value(name(value))
}

fn count(key: &str, value: &str) -> Result<u32, DocumentError> {
    value
        .trim()
        .parse()
        .map_err(|_| invalid(key, value, "a whole number"))
}

/// Go's `strconv.ParseBool`, after trimming.
fn boolean(key: &str, value: &str) -> Result<bool, DocumentError> {
    match value.trim() {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(invalid(key, value, "a boolean such as true or false")),
    }
}

/// linkerd's durations: a whole number and a unit (`ms`, `s`, `m`, `h`, `d`), or `0`.
pub(crate) fn duration(key: &str, value: &str) -> Result<Duration, DocumentError> {
    const ALLOWED: &str = "a whole number with a unit: ms, s, m, h or d (0 alone is zero)";
    let text = value.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(invalid(key, value, ALLOWED)),
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(millis_per_unit))
        .map(Duration::from_millis)
        .ok_or_else(|| invalid(key, value, ALLOWED))
}

#[cfg(test)]
mod tests;
