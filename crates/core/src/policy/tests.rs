use super::*;

#[test]
fn budget_examples_of_the_seeds() {
    let hsf = EjectionBudget::new(0.6, BudgetFloor::One).unwrap();
    assert_eq!(hsf.max_ejected(6), 3);
    assert_eq!(
        EjectionBudget::new(0.2, BudgetFloor::One)
            .unwrap()
            .max_ejected(3),
        1
    );
    assert_eq!(
        EjectionBudget::new(0.2, BudgetFloor::Zero)
            .unwrap()
            .max_ejected(3),
        0
    );
    assert_eq!(
        EjectionBudget::new(0.3, BudgetFloor::Zero)
            .unwrap()
            .max_ejected(10),
        3
    );
    assert_eq!(
        EjectionBudget::new(1.0, BudgetFloor::Zero)
            .unwrap()
            .max_ejected(5),
        5
    );
    assert_eq!(
        EjectionBudget::new(0.0, BudgetFloor::One)
            .unwrap()
            .max_ejected(5),
        0
    );
    assert_eq!(
        EjectionBudget::new(0.5, BudgetFloor::One)
            .unwrap()
            .max_ejected(0),
        0
    );
    assert!(EjectionBudget::new(1.5, BudgetFloor::One).is_err());
    // gRPC: 5 endpoints at 10 % allow one (0 / 5 < 10 %), 10 at 15 % two, 0 % none.
    let grpc = |ratio| EjectionBudget::new(ratio, BudgetFloor::RoundUp).unwrap();
    assert_eq!(grpc(0.1).max_ejected(5), 1);
    assert_eq!(grpc(0.1).max_ejected(10), 1);
    assert_eq!(grpc(0.15).max_ejected(10), 2);
    assert_eq!(grpc(0.3).max_ejected(10), 3);
    assert_eq!(grpc(0.0).max_ejected(10), 0);
    assert_eq!(grpc(1.0).max_ejected(3), 3);
    assert!(EjectionBudget::new(f64::NAN, BudgetFloor::One).is_err());
}

#[test]
fn hsf_schedule_caps_at_sixty_minutes() {
    let hsf = RecoverySchedule::new(Duration::from_secs(60), 60).unwrap();
    assert_eq!(hsf.delay(59), Duration::from_secs(3600));
    assert_eq!(hsf.delay(60), Duration::from_secs(3600));
    assert_eq!(hsf.delay(u32::MAX), Duration::from_secs(3600));
    assert!(RecoverySchedule::new(Duration::ZERO, 1).is_err());
    assert!(RecoverySchedule::new(Duration::from_secs(1), 0).is_err());
}
