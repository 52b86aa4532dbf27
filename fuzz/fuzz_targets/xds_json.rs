//! Envoy's `outlier_detection` and gRPC's `outlier_detection_experimental` JSON: any text is read
//! or refused with an error, never a panic; an accepted configuration computes its budget.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tower_outlier_detectors::{EnvoyOutlierDetection, GrpcOutlierDetection};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(envoy) = EnvoyOutlierDetection::from_json(text) {
        let _ = envoy.config().budget().max_ejected(7);
        let _ = envoy.builder().build();
    }
    if let Ok(grpc) = GrpcOutlierDetection::from_json(text) {
        let _ = grpc.config().budget().max_ejected(7);
        let _ = grpc.builder().build();
    }
});
