//! Progress of `husk template build` on the terminal: one spinner per step with its elapsed
//! time (when stderr is a terminal), the step's output streamed above it, a line per finished
//! step. `--quiet` prints nothing but errors and the final line.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use husk_build::oci::PullProgress;
use husk_build::{Progress, StepOutcome};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub struct TermProgress {
    quiet: bool,
    state: Mutex<State>,
    cached: AtomicUsize,
}

#[derive(Default)]
struct State {
    bar: Option<ProgressBar>,
    /// The step being run (for its finish line).
    current: String,
    /// Output not yet ending in a newline.
    partial: Vec<u8>,
}

impl TermProgress {
    pub fn new(quiet: bool) -> TermProgress {
        TermProgress {
            quiet,
            state: Mutex::new(State::default()),
            cached: AtomicUsize::new(0),
        }
    }

    /// How many steps came from the cache.
    pub fn cached(&self) -> usize {
        self.cached.load(Ordering::Relaxed)
    }

    /// Clears whatever is still drawn.
    pub fn finish(&self) {
        let mut st = self.lock();
        if let Some(bar) = st.bar.take() {
            bar.finish_and_clear();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn line(st: &State, text: &str) {
        match &st.bar {
            Some(bar) if !bar.is_hidden() => bar.println(text),
            _ => {
                let _ = writeln!(std::io::stderr(), "{text}");
            }
        }
    }
}

impl Progress for TermProgress {
    fn step_start(&self, index: usize, total: usize, display: &str) {
        let mut st = self.lock();
        st.current = format!("[{index}/{total}] {display}");
        st.partial.clear();
        if self.quiet {
            return;
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.set_message(st.current.clone());
        bar.enable_steady_tick(Duration::from_millis(120));
        if bar.is_hidden() {
            let _ = writeln!(std::io::stderr(), "{}", st.current);
        }
        st.bar = Some(bar);
    }

    fn log(&self, bytes: &[u8]) {
        if self.quiet {
            return;
        }
        let mut st = self.lock();
        st.partial.extend_from_slice(bytes);
        // Lines end at \n; a \r (progress redraws) also ends one.
        while let Some(pos) = st.partial.iter().position(|b| *b == b'\n' || *b == b'\r') {
            let line: Vec<u8> = st.partial.drain(..=pos).collect();
            let text = String::from_utf8_lossy(&line[..line.len() - 1]);
            let text = crate::units::without_controls(&text);
            if !text.trim().is_empty() {
                Self::line(&st, &format!("    │ {text}"));
            }
        }
        // Bound a line that never ends.
        if st.partial.len() > 64 << 10 {
            st.partial.clear();
        }
    }

    fn step_done(&self, _index: usize, outcome: StepOutcome) {
        if outcome == StepOutcome::Cached {
            self.cached.fetch_add(1, Ordering::Relaxed);
        }
        if self.quiet {
            return;
        }
        let mut st = self.lock();
        let how = match outcome {
            StepOutcome::Cached => "CACHED".to_string(),
            StepOutcome::Built(d) => format!("done in {:.1} s", d.as_secs_f64()),
        };
        let text = format!("✓ {} {how}", st.current);
        if let Some(bar) = st.bar.take() {
            bar.finish_and_clear();
        }
        Self::line(&st, &text);
    }

    fn pull(&self, p: &PullProgress) {
        if self.quiet {
            return;
        }
        let st = self.lock();
        match p {
            PullProgress::Resolved {
                layers,
                bytes_total,
            } => Self::line(
                &st,
                &format!(
                    "    pulling {layers} layer(s), {}",
                    crate::template::human(*bytes_total)
                ),
            ),
            PullProgress::Layer {
                index,
                bytes_done,
                bytes_total,
                ..
            } => {
                if let Some(bar) = &st.bar {
                    bar.set_message(format!(
                        "{} · layer {} {}/{}",
                        st.current,
                        index + 1,
                        crate::template::human(*bytes_done),
                        crate::template::human(*bytes_total)
                    ));
                }
            }
            PullProgress::LayerCached { index, .. } => {
                Self::line(&st, &format!("    layer {} cached", index + 1))
            }
            other => Self::line(&st, &format!("    {other:?}")),
        }
    }

    fn message(&self, text: &str) {
        if self.quiet {
            return;
        }
        let st = self.lock();
        Self::line(&st, text);
    }
}
