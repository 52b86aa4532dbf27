//! HSF configuration JSON (to be written).
use std::fmt;
/// HSF QoS configuration.
#[derive(Debug, Clone)]
pub struct HsfQosConfig;
/// Error reading HSF configuration.
#[derive(Debug, Clone)]
pub struct HsfConfigError;
impl fmt::Display for HsfConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("x")
    }
}
