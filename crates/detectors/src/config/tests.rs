use super::*;

#[test]
fn presets_carry_the_references_defaults() {
    let envoy = DetectorConfig::envoy().build().unwrap();
    assert_eq!(
        envoy.consecutive_5xx(),
        Consecutive {
            threshold: 5,
            enforcement: 100
        }
    );
    assert_eq!(envoy.consecutive_gateway_failure().enforcement, 0);
    assert_eq!(envoy.failure_percentage().unwrap().enforcement, 0);
    assert_eq!(envoy.failure_percentage().unwrap().threshold, 85);
    assert_eq!(envoy.success_rate().unwrap().stdev_factor, 1900);
    assert_eq!(envoy.max_ejection_time(), Duration::from_secs(300));
    assert_eq!(envoy.budget().max_ejected(9), 0);
    assert_eq!(envoy.budget().max_ejected(10), 1);
    let one = DetectorConfig::envoy()
        .always_eject_one_host(true)
        .build()
        .unwrap();
    assert_eq!(one.budget().max_ejected(5), 1);
    // Envoy's default max is max(300 s, base).
    let long = DetectorConfig::envoy()
        .base_ejection_time(Duration::from_secs(600))
        .build()
        .unwrap();
    assert_eq!(long.max_ejection_time(), Duration::from_secs(600));

    let grpc = DetectorConfig::grpc().build().unwrap();
    assert_eq!(grpc.consecutive_5xx().threshold, 0);
    assert!(grpc.failure_percentage().is_none());
    assert_eq!(grpc.budget().max_ejected(5), 1);
    // gRPC takes max(base, max) instead of rejecting.
    let grpc = DetectorConfig::grpc()
        .max_ejection_time(Duration::from_secs(1))
        .build()
        .unwrap();
    assert_eq!(grpc.max_ejection_time(), Duration::from_secs(30));

    let linkerd = DetectorConfig::linkerd().build().unwrap();
    assert_eq!(linkerd.consecutive_5xx().threshold, 7);
    assert_eq!(linkerd.base_ejection_time(), Duration::from_secs(1));
    assert_eq!(linkerd.max_ejection_time(), Duration::from_secs(60));
    assert_eq!(linkerd.backoff_jitter(), 0.5);
    assert_eq!(linkerd.budget().max_ejected(3), 3);
}

#[test]
fn every_invalid_field_is_named() {
    let cases: Vec<(DetectorBuilder, &str)> = vec![
        (DetectorConfig::envoy().interval(Duration::ZERO), "interval"),
        (
            DetectorConfig::envoy().base_ejection_time(Duration::ZERO),
            "base_ejection_time",
        ),
        (
            DetectorConfig::envoy().max_ejection_time(Duration::from_secs(29)),
            "max_ejection_time",
        ),
        (
            DetectorConfig::linkerd().backoff_jitter(100.5),
            "backoff_jitter",
        ),
        (
            DetectorConfig::envoy().max_ejection_percent(101),
            "max_ejection_percent",
        ),
        (
            DetectorConfig::envoy().enforcing_consecutive_5xx(101),
            "enforcing_consecutive_5xx",
        ),
        (
            DetectorConfig::envoy().enforcing_consecutive_gateway_failure(200),
            "enforcing_consecutive_gateway_failure",
        ),
        (
            DetectorConfig::envoy().enforcing_consecutive_local_origin_failure(101),
            "enforcing_consecutive_local_origin_failure",
        ),
        (
            DetectorConfig::envoy().enforcing_success_rate(101),
            "enforcing_success_rate",
        ),
        (
            DetectorConfig::envoy().enforcing_local_origin_success_rate(101),
            "enforcing_local_origin_success_rate",
        ),
        (
            DetectorConfig::envoy().failure_percentage_threshold(101),
            "failure_percentage_threshold",
        ),
        (
            DetectorConfig::envoy().enforcing_failure_percentage(101),
            "enforcing_failure_percentage",
        ),
        (
            DetectorConfig::envoy().enforcing_failure_percentage_local_origin(101),
            "enforcing_failure_percentage_local_origin",
        ),
        (
            DetectorConfig::envoy().success_rate_rule(SuccessRateRule::Robust {
                min_spread: f64::NAN,
            }),
            "success_rate_rule.min_spread",
        ),
    ];
    for (builder, field) in cases {
        let error = builder.build().unwrap_err();
        assert_eq!(error.field(), field, "{error}");
    }
}
