use super::*;

const MS: u64 = 1_000_000;

#[test]
fn a_ring_a_window_behind_jumps_and_forgets_what_it_held() {
    let w = Window::new(Duration::from_millis(2), 2).unwrap();
    w.record(0, false, false);
    w.record(2 * MS, true, false);
    w.record(2 * MS + 1, false, false);
    let after = w.counts(2 * MS + 1);
    assert_eq!((after.calls, after.failures), (2, 1));
}
