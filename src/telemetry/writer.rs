//! The bounded, non-blocking line writer behind the access log (stdout) and the router's own
//! logs (stderr). Whoever logs hands a whole line to a queue and moves on; a thread of the
//! writer's own writes the queue out, many lines per write. When the output is not being read
//! (a full pipe, a stalled terminal or log shipper), the queue fills up and further lines are
//! dropped and counted in `mrtr_log_lines_dropped_total`: never waited for, never queued
//! without bound. Kept over `tracing-appender`'s writer, which costs the same per line but
//! drops uncounted and hangs at exit when stdout is stuck (bench/FINDINGS.md).

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::metrics::LOG_LINES_DROPPED;

/// Lines queued per output before new ones are dropped. An access line is at most ~1.5 KiB
/// (long values are cut), so a stalled output holds at most ~12 MiB.
pub const QUEUE_LINES: usize = 8192;

/// Bytes gathered from the queue into one write.
const WRITE_BATCH: usize = 64 * 1024;

/// One output's queue.
pub struct LineWriter {
    tx: SyncSender<Vec<u8>>,
    counts: Arc<Counts>,
}

/// Lines queued and lines written (or lost to a failed write), for [`LineWriter::flush`].
#[derive(Default)]
struct Counts {
    queued: AtomicU64,
    done: AtomicU64,
}

impl LineWriter {
    /// A writer whose thread (named `name`) writes to `out`, holding at most `capacity` lines.
    pub fn spawn(name: &str, out: impl Write + Send + 'static, capacity: usize) -> LineWriter {
        let (tx, rx) = sync_channel(capacity);
        let counts = Arc::new(Counts::default());
        let c = counts.clone();
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || drain(rx, out, &c))
            .expect("a thread for the log writer");
        LineWriter { tx, counts }
    }

    /// Queues one whole line (ending in `\n`); when the queue is full, drops it and counts it.
    pub fn write_line(&self, line: Vec<u8>) {
        match self.tx.try_send(line) {
            Ok(()) => {
                self.counts.queued.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => LOG_LINES_DROPPED.inc(),
        }
    }

    /// Waits (at most `limit`) until every line queued so far has been written.
    pub fn flush(&self, limit: Duration) {
        let target = self.counts.queued.load(Ordering::Relaxed);
        let deadline = Instant::now() + limit;
        while self.counts.done.load(Ordering::Relaxed) < target && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// The writer thread: takes what is queued, writes it in one go, and again.
fn drain(rx: Receiver<Vec<u8>>, mut out: impl Write, counts: &Counts) {
    let mut buf = Vec::with_capacity(WRITE_BATCH);
    while let Ok(line) = rx.recv() {
        buf.extend_from_slice(&line);
        let mut lines = 1;
        while buf.len() < WRITE_BATCH {
            let Ok(line) = rx.try_recv() else { break };
            buf.extend_from_slice(&line);
            lines += 1;
        }
        if out.write_all(&buf).and_then(|()| out.flush()).is_err() {
            // The output is gone (a closed pipe): these lines are lost, and counted so.
            LOG_LINES_DROPPED.inc_by(lines);
        }
        counts.done.fetch_add(lines, Ordering::Relaxed);
        buf.clear();
    }
}

static STDOUT: OnceLock<LineWriter> = OnceLock::new();
static STDERR: OnceLock<LineWriter> = OnceLock::new();

/// The access log's output: the process's stdout.
pub fn stdout() -> &'static LineWriter {
    STDOUT.get_or_init(|| LineWriter::spawn("mrtr-stdout", std::io::stdout(), QUEUE_LINES))
}

/// The router's own logs: the process's stderr.
pub fn stderr() -> &'static LineWriter {
    STDERR.get_or_init(|| LineWriter::spawn("mrtr-stderr", std::io::stderr(), QUEUE_LINES))
}

/// Waits (at most `limit` each) until the lines queued so far on stdout and stderr are written.
pub fn flush_all(limit: Duration) {
    for w in [&STDOUT, &STDERR].into_iter().filter_map(OnceLock::get) {
        w.flush(limit);
    }
}

/// `tracing-subscriber`'s writer for the router's own logs: each event, formatted whole, is one
/// line for [`stderr`].
pub struct StderrLines;

/// One event's line, queued when the formatter is done with it.
pub struct EventLine(Vec<u8>);

impl Write for EventLine {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for EventLine {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            stderr().write_line(std::mem::take(&mut self.0));
        }
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for StderrLines {
    type Writer = EventLine;

    fn make_writer(&'a self) -> EventLine {
        EventLine(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// An output that takes nothing until it is opened, like a pipe nobody reads.
    struct Gate {
        open: Arc<Mutex<bool>>,
        got: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Gate {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            while !*self.open.lock().unwrap() {
                std::thread::sleep(Duration::from_millis(1));
            }
            self.got.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stalled_output_drops_and_counts_instead_of_blocking() {
        let (open, got) = (Arc::new(Mutex::new(false)), Arc::new(Mutex::new(Vec::new())));
        let w = LineWriter::spawn(
            "test-writer",
            Gate {
                open: open.clone(),
                got: got.clone(),
            },
            4,
        );
        let before = LOG_LINES_DROPPED.get();
        let started = Instant::now();
        for i in 0..100 {
            w.write_line(format!("line {i}\n").into_bytes());
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "writing never waits for the output"
        );
        // At most the queue and the batch the thread holds got through; the rest was counted.
        let dropped = LOG_LINES_DROPPED.get() - before;
        assert!(dropped >= 100 - 4 - 1, "{dropped}");
        *open.lock().unwrap() = true;
        w.flush(Duration::from_secs(5));
        let text = String::from_utf8(got.lock().unwrap().clone()).unwrap();
        let written = text.lines().count();
        assert!(
            (1..=5).contains(&written),
            "the queue's 4 lines and the one held: {text}"
        );
        assert!(text.starts_with("line 0\n"), "{text}");
    }
}
