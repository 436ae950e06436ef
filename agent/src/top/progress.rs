//! The progress lines of `floe run` on a terminal: one line per pipeline (records per
//! second, lag, last commit), kept below the log and redrawn every second. Log lines go
//! through [`StatusArea`], which lifts the progress lines off before each log line and
//! puts them back after, so both stay readable. Nothing of this runs when stderr is not
//! a terminal.

use std::io::{self, Write};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ratatui::crossterm::{cursor, queue, terminal};
use tracing_subscriber::fmt::MakeWriter;

use super::{Scrape, Stats, age, count};

#[derive(Default)]
struct State {
    lines: Vec<String>,
    /// Lines currently on screen below the log.
    drawn: usize,
    /// Cleared for good: later updates are ignored.
    closed: bool,
}

impl State {
    fn erase(&mut self, out: &mut impl Write) {
        if self.drawn > 0 {
            let _ = queue!(
                out,
                cursor::MoveToPreviousLine(self.drawn as u16),
                terminal::Clear(terminal::ClearType::FromCursorDown)
            );
            self.drawn = 0;
        }
    }

    fn draw(&mut self, out: &mut impl Write) {
        let width = match terminal::size() {
            Ok((w, _)) if w >= 20 => w as usize,
            _ => 120,
        };
        for line in &self.lines {
            // Never wrap: a wrapped line would break the count of lines to erase.
            let shown: String = line.chars().take(width - 1).collect();
            let _ = writeln!(out, "{shown}");
        }
        self.drawn = self.lines.len();
        let _ = out.flush();
    }
}

/// The progress lines at the bottom of stderr, shared with the log writer.
#[derive(Clone, Default)]
pub struct StatusArea {
    state: Arc<Mutex<State>>,
}

impl StatusArea {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Replaces the progress lines.
    pub fn set(&self, lines: Vec<String>) {
        let mut state = self.lock();
        if state.closed {
            return;
        }
        let mut err = io::stderr().lock();
        state.erase(&mut err);
        state.lines = lines;
        state.draw(&mut err);
    }

    /// Removes the progress lines for good (before the process exits).
    pub fn clear(&self) {
        let mut state = self.lock();
        let mut err = io::stderr().lock();
        state.erase(&mut err);
        state.lines.clear();
        state.closed = true;
        let _ = err.flush();
    }
}

/// A log line being written: the progress lines are off the screen until it is dropped.
pub struct LogWriter<'a> {
    state: MutexGuard<'a, State>,
    err: io::StderrLock<'static>,
}

impl Write for LogWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.err.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.err.flush()
    }
}

impl Drop for LogWriter<'_> {
    fn drop(&mut self) {
        self.state.draw(&mut self.err);
    }
}

impl<'a> MakeWriter<'a> for StatusArea {
    type Writer = LogWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        let mut state = self.lock();
        let mut err = io::stderr().lock();
        state.erase(&mut err);
        LogWriter { state, err }
    }
}

/// One line per pipeline.
pub fn lines(stats: &Stats) -> Vec<String> {
    stats
        .pipelines
        .iter()
        .map(|p| {
            let rate = |v: Option<f64>| v.map_or_else(|| "-".to_string(), count);
            let commit = if p.committed_once {
                p.since_commit
                    .map_or_else(|| "-".to_string(), |s| format!("{} ago", age(s)))
            } else {
                "none yet".to_string()
            };
            let mut line = format!(
                "[{}] {} rec/s in, {} rec/s out, lag {}, last commit {}, {} rows committed",
                p.name,
                rate(p.in_per_sec),
                rate(p.out_per_sec),
                p.lag.map_or_else(|| "-".to_string(), count),
                commit,
                count(p.rows_out),
            );
            if let Some(waiting) = p.waiting.filter(|w| *w > 0.0) {
                line.push_str(&format!(", {} waiting", count(waiting)));
                if let Some(next) = p.next_commit {
                    line.push_str(&format!(" (commit in {})", age(next)));
                }
            }
            if p.dead_letters > 0.0 {
                line.push_str(&format!(", {} dead letters", count(p.dead_letters)));
            }
            line
        })
        .collect()
}

/// Redraws the progress lines from the process's own metrics every `every`, forever
/// (the caller drops the task when the run ends).
pub async fn run(area: StatusArea, every: Duration) {
    let handle = floe::telemetry::recorder();
    let mut before: Option<Scrape> = None;
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let Ok(now) = Scrape::parse(&handle.render()) else {
            continue;
        };
        let stats = Stats::from_scrapes(&now, before.as_ref());
        if !stats.pipelines.is_empty() {
            area.set(lines(&stats));
        }
        before = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::top::PipelineStats;

    #[test]
    fn one_line_per_pipeline() {
        let stats = Stats {
            pipelines: vec![
                PipelineStats {
                    name: "events".into(),
                    in_per_sec: Some(1500.0),
                    out_per_sec: Some(1400.0),
                    lag: Some(12.0),
                    since_commit: Some(2.0),
                    committed_once: true,
                    rows_out: 500.0,
                    dead_letters: 2.0,
                    waiting: Some(4200.0),
                    next_commit: Some(38.0),
                    ..Default::default()
                },
                PipelineStats {
                    name: "orders".into(),
                    ..Default::default()
                },
            ],
            plugins: vec![],
        };
        assert_eq!(
            lines(&stats),
            vec![
                "[events] 1500 rec/s in, 1400 rec/s out, lag 12, last commit 2s ago, 500 rows committed, 4200 waiting (commit in 38s), 2 dead letters",
                "[orders] - rec/s in, - rec/s out, lag -, last commit none yet, 0 rows committed",
            ]
        );
    }

    #[test]
    fn log_lines_lift_the_status_off_and_put_it_back() {
        // Drawn into a buffer instead of stderr: erase emits the cursor moves, draw the lines.
        let mut state = State {
            lines: vec!["[a] status".into()],
            ..Default::default()
        };
        let mut out = Vec::new();
        state.draw(&mut out);
        assert_eq!(state.drawn, 1);
        state.erase(&mut out);
        assert_eq!(state.drawn, 0);
        let text = String::from_utf8(out).expect("utf-8");
        assert!(text.starts_with("[a] status\n"), "{text:?}");
        assert!(text.contains("\u{1b}[1F"), "{text:?}");
        assert!(text.ends_with("\u{1b}[J"), "{text:?}");
    }
}
