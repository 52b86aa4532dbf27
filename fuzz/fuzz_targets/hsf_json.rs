//! HSF's configuration-center JSON: any text is read into a configuration or refused with an
//! error, never a panic; every service of an accepted document resolves (or is refused) too.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tower_outlier_error_rate::HsfQosConfig;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(config) = HsfQosConfig::from_json(text) {
        let _ = config.application();
        let services: Vec<String> = config.services().map(str::to_owned).collect();
        for service in services {
            let _ = config.service(&service);
            let _ = config.ip_dimension(&service);
        }
        let _ = config.with_process_properties([("hsf.qos.errorRateThreshold", text)]);
    }
});
