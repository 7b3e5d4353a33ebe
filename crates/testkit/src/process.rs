//! The test process: its threads and descriptors, and a watchdog that turns a hang into a
//! failure with a message.

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A step (a drop, a join) that has not returned by then is hung. Not a speed limit: tests
/// print the figures; this only turns a hang into a failure with a message.
pub const HANG: Duration = Duration::from_secs(30);

/// Names of the process's threads (one per task).
pub fn threads() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .map(|t| {
            let comm = t.unwrap().path().join("comm");
            std::fs::read_to_string(comm)
                .unwrap_or_default()
                .trim()
                .to_string()
        })
        .collect();
    names.sort();
    names
}

/// Open file descriptors of the process (the listing's own included, every time).
pub fn fds() -> Vec<String> {
    let mut fds: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let target = std::fs::read_link(e.path()).unwrap_or_default();
            format!(
                "{} -> {}",
                e.file_name().to_string_lossy(),
                target.display()
            )
        })
        .collect();
    fds.sort();
    fds
}

/// Ends the process with a message if it is not disarmed within [`HANG`].
#[derive(Debug)]
pub struct Watchdog {
    disarm: mpsc::Sender<()>,
    thread: JoinHandle<()>,
}

impl Watchdog {
    /// Starts the watchdog of `what`.
    pub fn arm(what: String) -> Watchdog {
        let (disarm, rx) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(HANG) {
                eprintln!("{what} has not returned after {HANG:?}: it hangs");
                std::process::exit(1);
            }
        });
        Watchdog { disarm, thread }
    }

    /// Stops the watchdog; `what` returned.
    pub fn disarm(self) {
        let _ = self.disarm.send(());
        self.thread.join().unwrap();
    }
}

/// Runs `f` under a watchdog and returns its result and how long it took.
pub fn guarded<R>(what: String, f: impl FnOnce() -> R) -> (R, Duration) {
    let dog = Watchdog::arm(what);
    let started = Instant::now();
    let r = f();
    let took = started.elapsed();
    dog.disarm();
    (r, took)
}
