//! Why a reconfiguration was refused.

use std::error::Error;
use std::fmt;

use tower_outlier_core::BoxError;

/// Why a reconfiguration was refused. The rules in force stay.
#[derive(Debug)]
pub struct ReconfigureError {
    kind: Kind,
}

#[derive(Debug)]
pub(super) enum Kind {
    NoSlot {
        slot: usize,
        slots: usize,
    },
    Mismatch {
        slot: usize,
        expected: &'static str,
        given: &'static str,
    },
    NoPolicy {
        policy: &'static str,
        running: Vec<&'static str>,
    },
    OtherType {
        policy: &'static str,
        dialect: &'static str,
    },
    Document {
        dialect: &'static str,
        source: BoxError,
    },
}

impl ReconfigureError {
    pub(super) fn new(kind: Kind) -> Self {
        ReconfigureError { kind }
    }

    /// Whether the document could not be read (as opposed to a policy that does not fit the
    /// layer).
    pub fn is_document(&self) -> bool {
        matches!(self.kind, Kind::Document { .. })
    }
}

impl fmt::Display for ReconfigureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::NoSlot { slot, slots } => {
                write!(f, "the layer has no policy {slot} (it has {slots})")
            }
            Kind::Mismatch {
                slot,
                expected,
                given,
            } => write!(
                f,
                "policy {slot} is a {expected} policy; a {given} policy cannot replace it"
            ),
            Kind::NoPolicy { policy, running } => {
                // Say what it runs: a layer built from `DetectorConfig::recommended()` runs a
                // "recommended" policy, which no Envoy or gRPC document configures.
                write!(f, "the layer has no {policy} policy (it runs: ")?;
                if running.is_empty() {
                    f.write_str("none")?;
                }
                for (i, name) in running.iter().enumerate() {
                    write!(f, "{}{name}", if i == 0 { "" } else { ", " })?;
                }
                f.write_str("); a document replaces a policy of its own kind only")
            }
            Kind::OtherType { policy, dialect } => write!(
                f,
                "the layer's {policy} policy is not of the type {dialect} documents configure"
            ),
            Kind::Document { dialect, source } => write!(f, "invalid {dialect} document: {source}"),
        }
    }
}

impl Error for ReconfigureError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match &self.kind {
            Kind::Document { source, .. } => Some(&**source),
            _ => None,
        }
    }
}
