//! SOFARPC's properties as a [`Dialect`] of the weight policy.

use tower_outlier_core::dialect::Dialect;
use tower_outlier_core::BoxError;

use crate::{SofaProperties, WeightPolicy};

/// SOFARPC's `com.alipay.sofa.rpc.aft.*` properties: replace a layer's weight policy.
///
/// ```
/// use std::time::Duration;
/// use tower_outlier_core::dialect::Dialect;
/// use tower_outlier_weight::{Sofa, WeightConfig, WeightPolicy};
///
/// let current = WeightPolicy::new(WeightConfig::sofarpc().build()?);
/// let properties = "com.alipay.sofa.rpc.aft.time.window=20\ncom.alipay.sofa.rpc.aft.regulation.effective=true";
/// let next = Sofa.parse(properties, &current, &mut Vec::new())?;
/// assert_eq!(next.config().interval(), Duration::from_secs(20));
/// # Ok::<(), tower_outlier_core::BoxError>(())
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Sofa;

impl Dialect for Sofa {
    type Policy = WeightPolicy;

    fn name(&self) -> &'static str {
        "SOFARPC properties"
    }

    fn policy_name(&self) -> &'static str {
        WeightPolicy::NAME
    }

    fn parse(
        &self,
        text: &str,
        _current: &WeightPolicy,
        _notes: &mut Vec<String>,
    ) -> Result<WeightPolicy, BoxError> {
        let config = SofaProperties::from_properties(text)?.config();
        Ok(WeightPolicy::new(config))
    }
}
