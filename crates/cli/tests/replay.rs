//! End-to-end tests of `lobster replay`, run on the built binary.

use std::path::PathBuf;
use std::process::{Command, Output};

use lobster_cache::{trace, PolicyKind};

fn write_trace(name: &str, text: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("replay-{name}.trace"));
    std::fs::write(&path, text).unwrap();
    path
}

fn lobster(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lobster"))
        .args(args)
        .output()
        .expect("run lobster")
}

fn replay(path: &std::path::Path, capacity: &str, policy: &str, json: bool) -> Output {
    let mut args = vec![
        "replay",
        "--trace",
        path.to_str().unwrap(),
        "--capacity-bytes",
        capacity,
        "--policy",
        policy,
    ];
    if json {
        args.push("--json");
    }
    lobster(&args)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

const TRACE: &str = "# id size\n1 40\n2 40\n3 40\n1 40\n2 40\n4 40\n1 40\n3 40\n2 40\n";

#[test]
fn json_output_has_the_documented_keys_and_the_library_counts() {
    let path = write_trace("ok", TRACE);
    let parsed = trace::parse(TRACE.as_bytes()).unwrap();
    for policy in ["reuse", "lru", "static"] {
        let out = replay(&path, "100", policy, true);
        assert!(out.status.success(), "{policy}: {}", stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let want = trace::replay(&parsed, 100, policy.parse::<PolicyKind>().unwrap()).unwrap();
        assert_eq!(v["policy"], policy);
        assert_eq!(v["capacity_bytes"], 100);
        assert_eq!(v["accesses"], 9);
        assert_eq!(v["hits"], want.hits);
        assert_eq!(v["misses"], want.misses);
        assert_eq!(v["hit_bytes"], want.hit_bytes);
        assert_eq!(v["miss_bytes"], want.miss_bytes);
        assert_eq!(v.as_object().unwrap().len(), 7);
    }
}

#[test]
fn text_output_names_the_policy_and_counts() {
    let path = write_trace("text", TRACE);
    let out = replay(&path, "100", "reuse", false);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("policy          reuse"), "{text}");
    assert!(text.contains("accesses        9"), "{text}");
}

#[test]
fn malformed_line_fails_naming_the_line_number() {
    let path = write_trace("malformed", "1 40\n# fine\n2 forty\n");
    let out = replay(&path, "100", "reuse", true);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let err = stderr(&out);
    assert!(err.contains("line 3"), "{err}");
}

#[test]
fn sample_with_two_sizes_fails_naming_the_sample() {
    let path = write_trace("two-sizes", "1 40\n77 10\n1 40\n77 12\n");
    let out = replay(&path, "100", "lru", false);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("sample 77") && err.contains("line 4"), "{err}");
}

#[test]
fn unknown_policy_and_missing_trace_are_refused() {
    let path = write_trace("policy", TRACE);
    let out = replay(&path, "100", "fifo", false);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("fifo"), "{}", stderr(&out));

    let missing = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("no-such.trace");
    let out = replay(&missing, "100", "reuse", false);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("no-such.trace"), "{}", stderr(&out));
}
