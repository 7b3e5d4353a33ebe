//! Access traces: parse `SAMPLE_ID SIZE_BYTES` lines and replay them through a policy.

use std::collections::HashMap;
use std::io::BufRead;
use std::sync::Arc;

use crate::index::VecSource;
use crate::planner::{Planner, Stats};
use crate::policy::PolicyKind;
use crate::{CacheError, SampleId, TraceError};

/// A parsed trace: its accesses with sample ids renumbered densely, and one size per sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// Dense id -> id as written in the trace.
    ids: Vec<SampleId>,
    /// Size of each dense id.
    sizes: Arc<[u32]>,
    /// The accesses, as dense ids.
    stream: Vec<SampleId>,
}

impl Trace {
    /// Number of accesses.
    pub fn len(&self) -> usize {
        self.stream.len()
    }

    /// Whether the trace has no access.
    pub fn is_empty(&self) -> bool {
        self.stream.is_empty()
    }

    /// Number of distinct samples.
    pub fn num_samples(&self) -> usize {
        self.ids.len()
    }

    /// Bytes of all distinct samples.
    pub fn dataset_bytes(&self) -> u64 {
        self.sizes.iter().map(|&s| u64::from(s)).sum()
    }

    /// The accesses as dense ids `0..num_samples`, and the size of each dense id.
    #[cfg(any(test, fuzzing))]
    pub(crate) fn dense(&self) -> (&[SampleId], &[u32]) {
        (&self.stream, &self.sizes)
    }

    /// The accesses as `(sample id as written, size in bytes)`.
    pub fn accesses(&self) -> impl Iterator<Item = (SampleId, u32)> + '_ {
        self.stream
            .iter()
            .map(|&d| (self.ids[d as usize], self.sizes[d as usize]))
    }
}

/// Parses a trace: one access a line, `SAMPLE_ID SIZE_BYTES` (both unsigned 32-bit decimal
/// numbers separated by whitespace); `#` starts a comment; blank lines are skipped; a sample
/// keeps one size. The trace is held in memory: 4 bytes per access + 12 per sample.
///
/// # Errors
/// [`TraceError::Malformed`] naming the 1-based line of the first bad line,
/// [`TraceError::ConflictingSize`] naming the sample seen with a second size,
/// [`TraceError::Io`] if reading fails, [`TraceError::TooLong`] past `u32::MAX` accesses.
pub fn parse<R: BufRead>(mut reader: R) -> Result<Trace, TraceError> {
    let mut dense: HashMap<SampleId, SampleId> = HashMap::new();
    let mut ids = Vec::new();
    let mut sizes = Vec::new();
    let mut stream = Vec::new();
    let mut buf = String::new();
    let mut line = 0u64;
    loop {
        line += 1;
        buf.clear();
        match reader.read_line(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                return Err(TraceError::Malformed {
                    line,
                    reason: "not valid UTF-8".to_owned(),
                })
            }
            Err(source) => return Err(TraceError::Io { line, source }),
        }
        let content = buf.split('#').next().unwrap_or("").trim();
        if content.is_empty() {
            continue;
        }
        let mut fields = content.split_whitespace();
        let (Some(id), Some(size), None) = (fields.next(), fields.next(), fields.next()) else {
            return Err(TraceError::Malformed {
                line,
                reason: format!("expected `SAMPLE_ID SIZE_BYTES`, found {content:?}"),
            });
        };
        let number = |field: &str, what: &str| {
            field.parse::<u32>().map_err(|e| TraceError::Malformed {
                line,
                reason: format!("{what} {field:?} is not an unsigned 32-bit integer ({e})"),
            })
        };
        let sample = number(id, "sample id")?;
        let size_bytes = number(size, "size")?;
        if stream.len() >= u32::MAX as usize {
            return Err(TraceError::TooLong { line });
        }
        let d = *dense.entry(sample).or_insert_with(|| {
            ids.push(sample);
            sizes.push(size_bytes);
            (ids.len() - 1) as SampleId
        });
        let first_size_bytes = sizes[d as usize];
        if first_size_bytes != size_bytes {
            return Err(TraceError::ConflictingSize {
                sample,
                line,
                first_size_bytes,
                size_bytes,
            });
        }
        stream.push(d);
    }
    Ok(Trace {
        ids,
        sizes: sizes.into(),
        stream,
    })
}

/// Replays `trace` through `policy` with a cache of `capacity_bytes` and returns the counts.
///
/// The trace is one epoch, whose whole future is known.
///
/// # Errors
/// None in practice for a parsed trace; the planner's errors are passed through.
pub fn replay(trace: &Trace, capacity_bytes: u64, policy: PolicyKind) -> Result<Stats, CacheError> {
    let source = VecSource::new(vec![trace.stream.clone()]);
    let mut planner = Planner::new(source, trace.sizes.clone(), capacity_bytes, policy)?;
    planner.run_to_end()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(s: &str) -> Result<Trace, TraceError> {
        parse(s.as_bytes())
    }

    #[test]
    fn parses_comments_blank_lines_and_keeps_ids() {
        let t = parse_str("# header\n\n7 100  # first\n  9\t50\n7 100\n").unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(t.num_samples(), 2);
        assert_eq!(t.dataset_bytes(), 150);
        assert_eq!(
            t.accesses().collect::<Vec<_>>(),
            vec![(7, 100), (9, 50), (7, 100)]
        );
    }

    #[test]
    fn malformed_lines_are_errors_naming_the_line() {
        for (text, bad_line) in [
            ("1 2\n3\n", 2),
            ("1 2\n# c\n3 4 5\n", 3),
            ("x 2\n", 1),
            ("1 2\n1 -2\n", 2),
            ("1 2\n\n\n4294967296 1\n", 4),
            ("1 2.5\n", 1),
        ] {
            match parse_str(text) {
                Err(TraceError::Malformed { line, .. }) => assert_eq!(line, bad_line, "{text:?}"),
                other => panic!("{text:?}: expected a malformed line, got {other:?}"),
            }
            let msg = parse_str(text).unwrap_err().to_string();
            assert!(msg.contains(&format!("line {bad_line}")), "{msg}");
        }
        match parse(&b"1 2\n\xff\xfe 3\n"[..]) {
            Err(TraceError::Malformed { line: 2, .. }) => {}
            other => panic!("expected invalid UTF-8 on line 2, got {other:?}"),
        }
    }

    #[test]
    fn a_sample_with_two_sizes_is_an_error_naming_it() {
        let err = parse_str("5 10\n6 10\n5 11\n").unwrap_err();
        match &err {
            TraceError::ConflictingSize {
                sample: 5,
                line: 3,
                first_size_bytes: 10,
                size_bytes: 11,
            } => {}
            other => panic!("unexpected {other:?}"),
        }
        let msg = err.to_string();
        assert!(msg.contains("sample 5") && msg.contains("line 3"), "{msg}");
    }

    #[test]
    fn replay_counts_match_the_reference_model() {
        let text = "1 40\n2 40\n3 40\n1 40\n2 40\n4 40\n1 40\n3 40\n2 40\n";
        let t = parse_str(text).unwrap();
        for kind in PolicyKind::ALL {
            let got = replay(&t, 100, kind).unwrap();
            let want = crate::check::reference(&t.stream, &t.sizes, 100, kind);
            let mut stats = Stats::default();
            for (step, &s) in want.iter().zip(&t.stream) {
                stats.record(step.hit, t.sizes[s as usize]);
            }
            assert_eq!(got, stats, "{kind}");
        }
    }
}
