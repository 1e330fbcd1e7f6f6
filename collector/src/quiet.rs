//! Log lines of one kind that can come by the thousand at once (every simulated node's stream
//! ending, a whole rack cut off): the first few of each minute are written, the rest counted and
//! said in one line when the minute is over, so that an operator's log stays readable.

use std::time::{Duration, Instant};

/// Lines written per window; the rest are counted.
const SHOWN: u32 = 10;
const WINDOW: Duration = Duration::from_secs(60);

/// One kind of line.
#[derive(Debug)]
pub struct Quiet {
    what: &'static str,
    since: Instant,
    shown: u32,
    held: u32,
}

impl Quiet {
    /// `what` names the lines in the summary ("agent streams that ended").
    pub fn new(what: &'static str) -> Quiet {
        Quiet {
            what,
            since: Instant::now(),
            shown: 0,
            held: 0,
        }
    }

    /// Whether to write the next line; first, the summary of the window that ended, if lines
    /// were held back in it.
    pub fn allow(&mut self) -> bool {
        self.allow_at(Instant::now()).0
    }

    fn allow_at(&mut self, now: Instant) -> (bool, Option<u32>) {
        let mut said = None;
        if now.duration_since(self.since) >= WINDOW {
            if self.held > 0 {
                tracing::warn!(
                    "{} more {} in the last {} s (not each logged)",
                    self.held,
                    self.what,
                    now.duration_since(self.since).as_secs()
                );
                said = Some(self.held);
            }
            self.since = now;
            self.shown = 0;
            self.held = 0;
        }
        if self.shown < SHOWN {
            self.shown += 1;
            (true, said)
        } else {
            self.held += 1;
            (false, said)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_lines_of_a_minute_are_written_the_rest_counted() {
        let t0 = Instant::now();
        let mut q = Quiet::new("lines");
        q.since = t0;
        let shown = (0..25).filter(|_| q.allow_at(t0).0).count();
        assert_eq!(shown, SHOWN as usize);
        // The next window says how many were held back, and writes again.
        assert_eq!(q.allow_at(t0 + WINDOW), (true, Some(15)));
        assert_eq!(q.allow_at(t0 + WINDOW * 3), (true, None));
    }
}
