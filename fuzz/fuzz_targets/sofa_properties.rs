//! SOFARPC's fault-tolerance properties: any text is read into a configuration or refused with an
//! error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tower_outlier_weight::SofaProperties;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(properties) = SofaProperties::from_properties(text) {
        let _ = properties.config();
        let _ = properties.builder().build();
    }
});
