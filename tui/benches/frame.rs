//! Frame time of the job view at 4,096 ranks (and of the other views), drawn into a
//! 240×70 `TestBackend`: what one redraw costs, heatmap folding included. Prints its numbers.

use std::time::Instant;

use commscope_tui::app::{App, Focus, View};
use commscope_tui::{fixtures, ui};
use ratatui::Terminal;
use ratatui::backend::TestBackend;

fn measure(name: &str, snap: commscope_tui::source::Snapshot, view: View, frames: usize) {
    let mut app = App::new("bench".into());
    app.update(snap);
    if view != View::Jobs {
        app.open_job = app
            .data
            .job
            .as_ref()
            .and_then(|d| d.summary.as_ref())
            .map(|s| s.job.clone());
        app.open_rank = Some(5);
        app.stack.push(View::Job);
        if view != View::Job {
            app.stack.push(view);
        }
    }
    app.focus = Focus::Ranks;
    let mut term = Terminal::new(TestBackend::new(240, 70)).expect("terminal");
    let mut times = Vec::with_capacity(frames);
    for i in 0..frames {
        app.cell_sel = i % 400;
        let t = Instant::now();
        term.draw(|f| ui::draw(f, &mut app)).expect("draw");
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    let p99 = times[(times.len() * 99 / 100).min(times.len() - 1)];
    println!(
        "{name:<28} {frames} frames: mean {mean:.2} ms, p99 {p99:.2} ms, max {:.2} ms",
        times[times.len() - 1]
    );
}

fn main() {
    measure("jobs list", fixtures::healthy(), View::Jobs, 500);
    measure("job view, 16 ranks", fixtures::straggler(), View::Job, 500);
    measure("job view, 4,096 ranks", fixtures::big(), View::Job, 300);
    measure("hang view", fixtures::hang(), View::Hang, 500);
    measure("rank view", fixtures::rank5(), View::Rank, 500);
}
