//! Sentinel's degrade rules as a [`Dialect`] of the slow-call policy.

use tower_outlier_core::dialect::{note_or_refuse, Dialect};
use tower_outlier_core::BoxError;

use crate::{parse_degrade_rules, SlowCallPolicy};

/// Sentinel's `DegradeRule` JSON list: the first rule of one resource replaces a layer's
/// slow-call policy, keeping its state-change callbacks. As in Sentinel's reload, an endpoint
/// whose breaker follows an unchanged rule keeps the breaker and its state; a changed rule
/// starts fresh breakers. A list without a rule for the resource is refused (the rule in force
/// stays), where Sentinel would drop the breaker.
///
/// Sentinel ignores fields it does not know, and so does this dialect, noting each one of the
/// resource's rule (with the field a misspelt one likely meant); [`strict`](Sentinel::strict)
/// refuses the document instead.
///
/// ```
/// use std::time::Duration;
/// use tower_outlier_core::dialect::Dialect;
/// use tower_outlier_slow_call::{BreakerConfig, Sentinel, SlowCallPolicy};
///
/// let current = SlowCallPolicy::new(
///     BreakerConfig::slow_ratio(Duration::from_millis(50)).open_duration(Duration::from_secs(5)).build()?,
/// );
/// let rules = r#"[{"resource": "orders", "grade": 0, "count": 80, "timeWindow": 10, "slowRatioThreshold": 0.2}]"#;
/// let next = Sentinel::resource("orders").parse(rules, &current, &mut Vec::new())?;
/// assert_eq!(next.config().open_duration(), Duration::from_secs(10));
/// assert!(Sentinel::resource("payments").parse(rules, &current, &mut Vec::new()).is_err());
/// # Ok::<(), tower_outlier_core::BoxError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Sentinel {
    resource: String,
    strict: bool,
}

impl Sentinel {
    /// The dialect for `resource`'s rule.
    pub fn resource(resource: impl Into<String>) -> Self {
        Sentinel {
            resource: resource.into(),
            strict: false,
        }
    }

    /// Refuses a document whose rule for the resource has a field Sentinel does not know (the
    /// rule in force stays), where Sentinel would ignore it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_outlier_core::dialect::Dialect;
    /// use tower_outlier_slow_call::{BreakerConfig, Sentinel, SlowCallPolicy};
    ///
    /// let current = SlowCallPolicy::new(
    ///     BreakerConfig::slow_ratio(Duration::from_millis(50)).open_duration(Duration::from_secs(5)).build()?,
    /// );
    /// let typo = r#"[{"resource": "orders", "grade": 0, "count": 50, "timeWindow": 10, "slowRatioThreshhold": 0.2}]"#;
    /// let error = Sentinel::resource("orders").strict().parse(typo, &current, &mut Vec::new()).unwrap_err();
    /// assert!(error.to_string().contains("did you mean `slowRatioThreshold`"));
    /// # Ok::<(), tower_outlier_core::BoxError>(())
    /// ```
    pub fn strict(mut self) -> Self {
        self.strict = true;
        self
    }
}

impl Dialect for Sentinel {
    type Policy = SlowCallPolicy;

    fn name(&self) -> &'static str {
        "Sentinel degrade rules"
    }

    fn policy_name(&self) -> &'static str {
        SlowCallPolicy::NAME
    }

    fn parse(
        &self,
        text: &str,
        current: &SlowCallPolicy,
        notes: &mut Vec<String>,
    ) -> Result<SlowCallPolicy, BoxError> {
        let rules = parse_degrade_rules(text)?;
        let Some(rule) = rules.iter().find(|r| r.resource() == self.resource) else {
            return Err(format!("no degrade rule for resource `{}`", self.resource).into());
        };
        note_or_refuse(self.strict, rule.ignored_field_notes(), notes)?;
        Ok(current.with_config(rule.config().clone()))
    }
}
