//! Snapshot tests: every view drawn into ratatui's `TestBackend` from a fixture, compared with
//! the screen committed under `tests/snapshots/` (review changes with `cargo insta review`).

use commscope_tui::app::{App, Focus, View};
use commscope_tui::source::Snapshot;
use commscope_tui::{fixtures, ui};
use ratatui::Terminal;
use ratatui::backend::TestBackend;

fn screen(snap: Snapshot, stack: &[View], w: u16, h: u16, setup: impl FnOnce(&mut App)) -> String {
    let mut app = App::new("collector http://collector:4650".into());
    app.update(snap);
    app.open_job = app
        .data
        .job
        .as_ref()
        .and_then(|d| d.summary.as_ref())
        .map(|s| s.job.clone());
    app.stack.extend_from_slice(stack);
    setup(&mut app);
    let mut term = Terminal::new(TestBackend::new(w, h)).expect("terminal");
    term.draw(|f| ui::draw(f, &mut app)).expect("draw");
    term.backend().to_string()
}

#[test]
fn jobs_empty() {
    insta::assert_snapshot!(screen(fixtures::empty(), &[], 100, 12, |_| {}));
}

#[test]
fn jobs_healthy() {
    insta::assert_snapshot!(screen(fixtures::healthy(), &[], 120, 10, |_| {}));
}

#[test]
fn job_healthy() {
    insta::assert_snapshot!(screen(fixtures::healthy(), &[View::Job], 140, 36, |_| {}));
}

#[test]
fn job_straggler() {
    insta::assert_snapshot!(screen(fixtures::straggler(), &[View::Job], 140, 36, |a| {
        a.cell_sel = 5;
    }));
}

#[test]
fn job_straggler_findings_focused() {
    insta::assert_snapshot!(screen(fixtures::straggler(), &[View::Job], 140, 36, |a| {
        a.focus = Focus::Findings;
    }));
}

#[test]
fn hang_with_culprit() {
    insta::assert_snapshot!(screen(
        fixtures::hang(),
        &[View::Job, View::Hang],
        140,
        40,
        |_| {}
    ));
}

#[test]
fn hang_with_a_culprit_inside_the_library_names_its_calls() {
    let s = screen(
        fixtures::deadlock(),
        &[View::Job, View::Hang],
        160,
        40,
        |_| {},
    );
    assert!(
        s.contains(
            "→ rank 2 → blocked in recv from rank 1 (tag 8) for 12.5 s; posted send to rank 3 (tag 7), not complete"
        ),
        "{s}"
    );
    assert!(!s.contains("blocked in another communication call"), "{s}");
}

#[test]
fn job_4096_ranks_folds_by_node() {
    let s = screen(fixtures::big(), &[View::Job], 140, 36, |_| {});
    assert!(s.contains("a cell is a node (its worst rank)"), "{s}");
    insta::assert_snapshot!(s);
}

#[test]
fn rank_view() {
    insta::assert_snapshot!(screen(
        fixtures::rank5(),
        &[View::Job, View::Rank],
        120,
        30,
        |a| {
            a.open_rank = Some(5);
        }
    ));
}

#[test]
fn help_over_the_jobs() {
    insta::assert_snapshot!(screen(fixtures::healthy(), &[], 100, 24, |a| a.help = true));
}

#[test]
fn a_tiny_terminal_draws_without_panicking() {
    for (w, h) in [(1, 1), (10, 3), (20, 5), (40, 8)] {
        for (snap, stack) in [
            (fixtures::big(), vec![View::Job]),
            (fixtures::hang(), vec![View::Job, View::Hang]),
            (fixtures::rank5(), vec![View::Job, View::Rank]),
        ] {
            let _ = screen(snap, &stack, w, h, |a| a.open_rank = Some(5));
        }
    }
}
