//! The progress bar on stderr while engines run (hidden when stderr is not a terminal):
//! which run of which engine, its phase, and steps done in that phase.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::workload::{Phase, Progress};

pub struct Bar {
    pb: ProgressBar,
}

impl Bar {
    pub fn new() -> Bar {
        let pb = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template("{prefix:>28} {msg:>7} [{bar:32}] {pos:>10}/{len:<10} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        pb.set_style(style);
        Bar { pb }
    }

    /// Runs `f` (which updates `progress`) while the bar follows `progress`.
    pub fn follow<T>(&self, label: &str, progress: &Progress, f: impl FnOnce() -> T) -> T {
        self.pb.set_prefix(label.to_string());
        self.pb.reset_elapsed();
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !done.load(Ordering::Acquire) {
                    let (phase, pos, len) = progress.get();
                    self.pb.set_message(phase.label());
                    self.pb.set_length(len.max(1));
                    self.pb.set_position(if phase == Phase::Done { len } else { pos.min(len) });
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
            let r = f();
            done.store(true, Ordering::Release);
            r
        })
    }

    /// Prints a line above the bar (or plainly to stderr when the bar is hidden).
    pub fn println(&self, line: &str) {
        if self.pb.is_hidden() {
            eprintln!("{line}");
        } else {
            self.pb.println(line);
        }
    }

    pub fn finish(&self) {
        self.pb.finish_and_clear();
    }
}
