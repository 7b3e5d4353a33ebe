//! This process's own figures from /proc: resident memory, CPU time, descriptors, threads.
//! Each reads 0 where /proc is unavailable, so a report still prints.

/// A memory figure from /proc/self/status (`field` is e.g. `VmHWM` or `VmRSS`), in bytes.
pub fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status_field_bytes(&status, field)
}

/// Resident bytes now and their peak (`VmRSS`, `VmHWM`) from one read of /proc/self/status.
/// One read, because the kernel raises the stored peak lazily: it reports the peak as at least
/// the resident size it computes in the same read, but a second read, after memory was given
/// back, may report a peak below the first read's resident size.
pub fn rss_and_peak_bytes() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    (
        status_field_bytes(&status, "VmRSS"),
        status_field_bytes(&status, "VmHWM"),
    )
}

fn status_field_bytes(status: &str, field: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Resets the kernel's peak-RSS mark (`VmHWM`), so a later peak is that of what ran since.
pub fn reset_peak_rss() {
    // Writing 5 to clear_refs resets VmHWM (Linux 4.0+); without it the peak is cumulative.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Clock ticks per second of /proc's CPU times: USER_HZ, fixed at 100 by the kernel's ABI on
/// the architectures this runs on (sysconf would need libc, and unsafe, for the same answer).
const USER_HZ: f64 = 100.0;

/// CPU seconds (user + system) this process has used so far, every thread included, also
/// those that exited; to 1/USER_HZ s.
pub fn cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| parse_cpu_ticks(&s))
        .map_or(0.0, |ticks| ticks as f64 / USER_HZ)
}

/// CPU seconds (user + system) of this process's children that have been waited for.
pub fn children_cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| parse_ticks(&s, 13))
        .map_or(0.0, |ticks| ticks as f64 / USER_HZ)
}

/// utime + stime of a /proc/PID/stat line, in ticks.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    parse_ticks(stat, 11)
}

/// The sum of the two tick fields from `skip` after the command name of a /proc/PID/stat
/// line: utime + stime at 11, cutime + cstime (children waited for) at 13.
fn parse_ticks(stat: &str, skip: usize) -> Option<u64> {
    // The command name (field 2) may hold spaces and parentheses: fields count from the last
    // ')'. After it come field 3 (state) onwards, so utime (14) and stime (15) are at 11, 12.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(skip);
    let a: u64 = fields.next()?.parse().ok()?;
    let b: u64 = fields.next()?.parse().ok()?;
    Some(a + b)
}

/// Proportional set size of process `pid` (`self` for this one), in bytes: its resident
/// pages, each shared page divided among the processes that map it, so that a node's
/// processes sum to the node's memory.
pub fn pss_bytes(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Pss:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Descriptors this process has open.
pub fn open_fds() -> usize {
    count_dir("/proc/self/fd")
}

/// Threads of this process.
pub fn threads() -> usize {
    count_dir("/proc/self/task")
}

fn count_dir(path: &str) -> usize {
    std::fs::read_dir(path).map_or(0, |d| d.count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_utime_plus_stime_even_with_a_strange_command_name() {
        // Fields 1..=17 of proc(5); the name holds a space and a ')'.
        let line = "42 (a b) c) S 1 42 42 0 -1 4194560 100 0 0 0 7 5 0 0";
        assert_eq!(parse_cpu_ticks(line), Some(12));
        assert_eq!(parse_ticks(line, 13), Some(0));
        let with_children = "42 (x) S 1 42 42 0 -1 4194560 100 0 0 0 7 5 30 4";
        assert_eq!(parse_ticks(with_children, 13), Some(34));
        assert_eq!(parse_cpu_ticks("42 (x) S 1"), None);
    }

    #[test]
    fn this_process_has_memory_threads_and_cpu_time() {
        assert!(status_bytes("VmRSS") > 0);
        let (rss, peak) = rss_and_peak_bytes();
        assert!(rss > 0 && peak >= rss, "resident {rss} bytes, peak {peak}");
        let status = "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n";
        assert_eq!(status_field_bytes(status, "VmRSS"), 1024 * 1024);
        assert_eq!(status_field_bytes(status, "VmHWM"), 2048 * 1024);
        assert_eq!(status_field_bytes(status, "VmSwap"), 0);
        assert!(threads() >= 1 && open_fds() >= 1);
        assert!(pss_bytes("self") > 0);
        let before = cpu_seconds();
        let started = std::time::Instant::now();
        let mut x = 0u64;
        // Spin until the counter moves by a tick; the wall-clock cap only ends a broken case.
        while cpu_seconds() <= before {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            assert!(
                started.elapsed() < std::time::Duration::from_secs(30),
                "CPU time stayed at {before} s"
            );
        }
    }
}
