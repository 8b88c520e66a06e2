//! Unit tests of one job's path: clean input names, and where a failed run's outputs are stored.

use super::*;

#[test]
fn clean_segments() {
    for ok in ["a.dat", "x y", "..a", "a..b"] {
        assert!(is_clean_segment(ok), "{ok}");
    }
    for bad in ["", ".", "..", "a/b", "/a", "a\\b", "a\0b", &"x".repeat(256)] {
        assert!(!is_clean_segment(bad), "{bad:?}");
    }
}

// A failed run's outputs go where its function asked, a success's always out.
#[test]
fn outputs_are_stored_where_the_outcome_and_policy_say() {
    use FailedOutputs::{Discard, Quarantine, Upload};
    let ok = Outcome::Exited { exit_code: 0 };
    let exit = Outcome::Exited { exit_code: 3 };
    let trap = Outcome::Trapped { message: "unreachable".into() };
    let time = Outcome::TimeExceeded { limit_s: 1, vacate: None };
    let input = Outcome::InputFailed { reason: "403".into() };
    for p in [Discard, Quarantine, Upload] {
        assert_eq!(stored_where(&ok, p), Keep::Outputs);
        assert_eq!(stored_where(&input, p), Keep::Nothing);
    }
    assert_eq!(
        [stored_where(&exit, Discard), stored_where(&exit, Quarantine), stored_where(&exit, Upload)],
        [Keep::Nothing, Keep::Quarantine, Keep::Outputs]
    );
    assert_eq!(
        [stored_where(&trap, Discard), stored_where(&trap, Quarantine), stored_where(&trap, Upload)],
        [Keep::Nothing, Keep::Quarantine, Keep::Nothing]
    );
    assert_eq!(stored_where(&time, Quarantine), Keep::Quarantine);
}

#[test]
fn job_dir_names_are_safe() {
    assert_eq!(job_dir_name("j-1_2.x"), "j-1_2.x");
    for weird in ["../x", ".hidden", "a/b", ""] {
        let d = job_dir_name(weird);
        assert!(d.starts_with("job-") && is_clean_segment(&d), "{weird:?} -> {d}");
    }
}
