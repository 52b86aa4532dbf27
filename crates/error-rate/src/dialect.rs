//! HSF's configuration-center JSON as a [`Dialect`] of the error-rate policy.

use tower_outlier_core::dialect::{note_or_refuse, Dialect};
use tower_outlier_core::{text, BoxError};

use crate::{ErrorRatePolicy, HsfQosConfig};

/// HSF's configuration-center JSON for one service (`"service:version"`; its block wins key by
/// key over `DEFAULT`): replaces a layer's error-rate policy.
///
/// HSF ignores keys it does not know, and so does this dialect, noting each (with the key a
/// misspelt one likely meant), with a note too when the document leaves detection off for the
/// service (`qosEnabled` is off unless a block sets it); [`strict`](Hsf::strict) refuses a
/// document with an unknown key.
///
/// ```
/// use tower_outlier_core::dialect::Dialect;
/// use tower_outlier_error_rate::{ErrorRateConfig, ErrorRatePolicy, Hsf};
///
/// let current = ErrorRatePolicy::new(ErrorRateConfig::hsf().build()?);
/// let hsf = Hsf::service("com.example.Orders:1.0.0");
/// let document = r#"{"DEFAULT": {"qosEnabled": true, "errorRateThreshold": 0.2}}"#;
/// let next = hsf.parse(document, &current, &mut Vec::new())?;
/// assert_eq!(next.config().error_rate_threshold(), 0.2);
/// assert!(hsf.parse(r#"{"DEFAULT": {"errorRateThreshold": 7}}"#, &current, &mut Vec::new()).is_err());
/// # Ok::<(), tower_outlier_core::BoxError>(())
/// ```
#[derive(Clone, Debug)]
pub struct Hsf {
    service: String,
    strict: bool,
}

impl Hsf {
    /// The dialect for `service_and_version`'s rules.
    pub fn service(service_and_version: impl Into<String>) -> Self {
        Hsf {
            service: service_and_version.into(),
            strict: false,
        }
    }

    /// Refuses a document with a key HSF does not know (the rules in force stay), where HSF
    /// would ignore it.
    ///
    /// ```
    /// use tower_outlier_core::dialect::Dialect;
    /// use tower_outlier_error_rate::{ErrorRateConfig, ErrorRatePolicy, Hsf};
    ///
    /// let current = ErrorRatePolicy::new(ErrorRateConfig::hsf().build()?);
    /// let typo = r#"{"DEFAULT": {"qosEnabled": true, "errorRateThreshhold": 0.1}}"#;
    /// let strict = Hsf::service("Orders:1.0").strict();
    /// let error = strict.parse(typo, &current, &mut Vec::new()).unwrap_err();
    /// assert!(error.to_string().contains("did you mean `errorRateThreshold`"));
    /// // Lenient, as HSF is: accepted, with a note.
    /// let mut notes = Vec::new();
    /// Hsf::service("Orders:1.0").parse(typo, &current, &mut notes)?;
    /// assert_eq!(notes.len(), 1);
    /// # Ok::<(), tower_outlier_core::BoxError>(())
    /// ```
    pub fn strict(mut self) -> Self {
        self.strict = true;
        self
    }
}

impl Dialect for Hsf {
    type Policy = ErrorRatePolicy;

    fn name(&self) -> &'static str {
        "HSF JSON"
    }

    fn policy_name(&self) -> &'static str {
        ErrorRatePolicy::NAME
    }

    fn parse(
        &self,
        text: &str,
        _current: &ErrorRatePolicy,
        notes: &mut Vec<String>,
    ) -> Result<ErrorRatePolicy, BoxError> {
        let hsf = HsfQosConfig::from_json(text)?;
        let config = hsf.service(&self.service)?;
        note_or_refuse(self.strict, hsf.ignored_key_notes(), notes)?;
        if !config.enabled() {
            notes.push(format!(
                "detection is off for `{}`: `qosEnabled` is not true in its block or in `DEFAULT` (HSF's default is off)",
                text::name(&self.service)
            ));
        }
        Ok(ErrorRatePolicy::new(config))
    }
}
