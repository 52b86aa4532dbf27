//! gRPC status codes, and their conversions to and from tonic's.

use std::fmt;

use tower_outlier_core::FailureKind;

/// A gRPC status code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Code {
    /// 0
    Ok,
    /// 1
    Cancelled,
    /// 2
    Unknown,
    /// 3
    InvalidArgument,
    /// 4
    DeadlineExceeded,
    /// 5
    NotFound,
    /// 6
    AlreadyExists,
    /// 7
    PermissionDenied,
    /// 8
    ResourceExhausted,
    /// 9
    FailedPrecondition,
    /// 10
    Aborted,
    /// 11
    OutOfRange,
    /// 12
    Unimplemented,
    /// 13
    Internal,
    /// 14
    Unavailable,
    /// 15
    DataLoss,
    /// 16
    Unauthenticated,
}

pub(super) const CODES: [Code; 17] = [
    Code::Ok,
    Code::Cancelled,
    Code::Unknown,
    Code::InvalidArgument,
    Code::DeadlineExceeded,
    Code::NotFound,
    Code::AlreadyExists,
    Code::PermissionDenied,
    Code::ResourceExhausted,
    Code::FailedPrecondition,
    Code::Aborted,
    Code::OutOfRange,
    Code::Unimplemented,
    Code::Internal,
    Code::Unavailable,
    Code::DataLoss,
    Code::Unauthenticated,
];

impl Code {
    /// The code for a numeric value; values outside 0..=16 are [`Code::Unknown`].
    pub fn from_i32(value: i32) -> Code {
        usize::try_from(value)
            .ok()
            .and_then(|i| CODES.get(i).copied())
            .unwrap_or(Code::Unknown)
    }

    /// The numeric value.
    pub fn value(self) -> i32 {
        CODES
            .iter()
            .position(|c| *c == self)
            .map_or(2, |i| i as i32)
    }

    /// The code a `grpc-status` value stands for; unparsable values are [`Code::Unknown`].
    pub fn from_header(value: &http::HeaderValue) -> Code {
        value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<i32>().ok())
            .map_or(Code::Unknown, Code::from_i32)
    }

    /// The code the gRPC spec assigns to an HTTP status of a response without `grpc-status`.
    pub fn from_http_status(status: http::StatusCode) -> Code {
        match status.as_u16() {
            200 => Code::Ok,
            400 => Code::Internal,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::Unimplemented,
            429 | 502 | 503 | 504 => Code::Unavailable,
            _ => Code::Unknown,
        }
    }

    pub(super) fn bit(self) -> u32 {
        1 << self.value()
    }

    /// The failure kind a code counted as a failure stands for. A DEADLINE_EXCEEDED status is
    /// an answer (a server or proxy gave up), so it is a gateway failure, as Envoy maps it to
    /// 504; a deadline the client enforces itself fails the call with an error, a timeout.
    pub fn failure_kind(self) -> FailureKind {
        match self {
            Code::Unavailable | Code::ResourceExhausted => FailureKind::Overload,
            Code::DeadlineExceeded => FailureKind::Gateway,
            Code::Internal | Code::Unknown | Code::DataLoss => FailureKind::ServerError,
            _ => FailureKind::Business,
        }
    }
}

/// The same code in tonic's type (feature `tonic`).
///
/// ```
/// use tower_outlier::grpc::Code;
///
/// assert_eq!(tonic::Code::from(Code::Unavailable), tonic::Code::Unavailable);
/// assert_eq!(Code::from(tonic::Code::DeadlineExceeded), Code::DeadlineExceeded);
/// ```
#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
impl From<Code> for tonic::Code {
    fn from(code: Code) -> tonic::Code {
        tonic::Code::from_i32(code.value())
    }
}

/// The same code from tonic's type (feature `tonic`).
#[cfg(feature = "tonic")]
#[cfg_attr(docsrs, doc(cfg(feature = "tonic")))]
impl From<tonic::Code> for Code {
    fn from(code: tonic::Code) -> Code {
        Code::from_i32(code as i32)
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?} ({})", self.value())
    }
}
