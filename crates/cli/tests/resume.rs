//! `lobster run --stop-after-iterations K --save-state F` and `--resume F`, through the built
//! binary: a stopped run resumed gives the uninterrupted run's batches, a bad state is refused.

mod common;

use std::path::Path;
use std::process::Output;

use common::{gen, lobster};

/// `lobster run` on `data` (node 0 of 2, 2 ranks, batches of 4 unless `args` say, 3 epochs, JPEG decoding, no
/// compute or emulated storage) with `args`, its report written to `json`.
fn run(data: &Path, json: &Path, args: &[&str]) -> Output {
    lobster()
        .args(["run", "--quiet", "--compute-ms", "0", "--storage-mbps", "0"])
        .args(["--nodes", "2", "--ranks-per-node", "2"])
        .args(
            ["--batch", "4"]
                .iter()
                .filter(|_| !args.contains(&"--batch")),
        )
        .args(["--epochs", "3", "--io-depth", "4", "--decode-threads", "2"])
        .arg("--data")
        .arg(data)
        .arg("--json")
        .arg(json)
        .args(args)
        .output()
        .unwrap()
}

/// [`run`], which must succeed; its report.
fn run_ok(data: &Path, json: &Path, args: &[&str]) -> serde_json::Value {
    let out = run(data, json, args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap()
}

/// [`run`], which must fail; its stderr.
fn run_err(data: &Path, json: &Path, args: &[&str]) -> String {
    let out = run(data, json, args);
    assert!(!out.status.success(), "{args:?} was accepted");
    assert!(!json.exists(), "{args:?} wrote a report: it ran");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A step: (epoch, iteration, CRC of the step's batches).
type Step = (u64, u64, u64);

/// Per strategy: its name and its steps.
fn steps(report: &serde_json::Value) -> Vec<(String, Vec<Step>)> {
    report["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let steps = r["step_crc32"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| {
                    let n = |k: &str| s[k].as_u64().unwrap();
                    (n("epoch"), n("iteration"), n("crc32"))
                })
                .collect();
            (r["strategy"].as_str().unwrap().to_owned(), steps)
        })
        .collect()
}

#[test]
fn a_stopped_run_resumed_twice_gives_every_batch_of_the_uninterrupted_run_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // 48 samples over 4 ranks: 3 batches of 4 per rank per epoch, 9 in the run.
    gen(&data, 48, 4);
    let json = |n: &str| dir.path().join(format!("{n}.json"));
    let strategies = ["--strategy", "pytorch,nopfs,lobster"];
    let full = run_ok(&data, &json("full"), &strategies);
    let full_steps = steps(&full);
    for (name, s) in &full_steps {
        assert_eq!(s.len(), 9, "{name}");
        // Different batches have different digests: a run that repeated one would show.
        let distinct: std::collections::BTreeSet<u64> = s.iter().map(|t| t.2).collect();
        assert_eq!(distinct.len(), 9, "{name}");
    }
    // Every strategy gives the same batches.
    assert!(full_steps.iter().all(|(_, s)| *s == full_steps[0].1));

    // Stop mid-epoch 1, resume and stop again in epoch 2, resume to the end.
    let (state1, state2) = (json("state1"), json("state2"));
    let stop = |k: &'static str, state: &Path| {
        [
            "--stop-after-iterations".to_string(),
            k.to_string(),
            "--save-state".to_string(),
            state.to_str().unwrap().to_string(),
        ]
    };
    let with = |extra: &[String]| -> Vec<String> {
        strategies
            .iter()
            .map(|s| s.to_string())
            .chain(extra.iter().cloned())
            .collect()
    };
    let args = with(&stop("5", &state1));
    let a = run_ok(
        &data,
        &json("a"),
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let resume1 = ["--resume".to_string(), state1.to_str().unwrap().to_string()];
    let args = with(&[resume1.to_vec(), stop("2", &state2).to_vec()].concat());
    let b = run_ok(
        &data,
        &json("b"),
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let args = with(&["--resume".to_string(), state2.to_str().unwrap().to_string()]);
    let c = run_ok(
        &data,
        &json("c"),
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );

    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state1).unwrap()).unwrap();
    for r in saved["lobster_loader_state"]["ranks"].as_array().unwrap() {
        assert_eq!(
            (r["epoch"].as_u64(), r["iteration"].as_u64()),
            (Some(1), Some(2))
        );
    }
    let (a, b, c) = (steps(&a), steps(&b), steps(&c));
    for (i, (name, whole)) in full_steps.iter().enumerate() {
        assert_eq!(a[i].0, *name);
        assert_eq!(a[i].1.len(), 5, "{name}");
        assert_eq!(b[i].1.len(), 2, "{name}");
        let joined: Vec<_> = [&a[i].1[..], &b[i].1[..], &c[i].1[..]].concat();
        assert_eq!(&joined, whole, "{name}: the pieces are not the whole run");
    }
    // The resumed runs say where they started, their first epoch is the rest of the
    // interrupted one, and their samples add up to the whole run's.
    let reports: Vec<serde_json::Value> = ["a", "b", "c"]
        .iter()
        .map(|n| serde_json::from_str(&std::fs::read_to_string(json(n)).unwrap()).unwrap())
        .collect();
    for i in 0..3 {
        let start = |r: &serde_json::Value| r["results"][i]["start"].clone();
        let (sa, sb, sc) = (start(&reports[0]), start(&reports[1]), start(&reports[2]));
        assert!(sa["resumed_from"].is_null(), "{sa}");
        assert_eq!(sa["stopped_after_iterations"], 5, "{sa}");
        assert_eq!(
            (sa["epoch"].as_u64(), sa["steps"].as_u64()),
            (Some(0), Some(9))
        );
        assert!(sb["resumed_from"]
            .as_str()
            .unwrap()
            .ends_with("state1.json"));
        assert_eq!(
            (sb["epoch"].as_u64(), sb["iteration"].as_u64()),
            (Some(1), Some(2))
        );
        assert_eq!(
            (sb["steps"].as_u64(), sb["first_epoch_steps"].as_u64()),
            (Some(4), Some(1))
        );
        assert_eq!(
            (sc["epoch"].as_u64(), sc["iteration"].as_u64()),
            (Some(2), Some(1))
        );
        assert_eq!(
            (sc["steps"].as_u64(), sc["first_epoch_steps"].as_u64()),
            (Some(2), Some(2))
        );
        for s in [&sa, &sb, &sc] {
            assert!(s["build_s"].as_f64().unwrap() >= 0.0, "{s}");
            assert!(s["first_batch_s"].as_f64().unwrap() >= 0.0, "{s}");
        }
        assert!(sc["stopped_after_iterations"].is_null(), "{sc}");
        // A first epoch run to its end is timed; a stopped run's first epoch samples count.
        assert!(
            sc["first_epoch_samples_per_second"].as_f64().unwrap() > 0.0,
            "{sc}"
        );
        assert_eq!(sc["first_epoch_samples"], 2 * 2 * 4, "{sc}");
        let samples: u64 = reports
            .iter()
            .map(|r| r["results"][i]["samples"].as_u64().unwrap())
            .sum();
        assert_eq!(samples, full["results"][i]["samples"].as_u64().unwrap());
    }
}

#[test]
fn a_missing_damaged_or_foreign_state_is_refused_naming_the_file_or_field() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    gen(&data, 32, 4);
    let json = dir.path().join("run.json");
    let state = dir.path().join("state.json");
    let state_s = state.to_str().unwrap();
    let lobster = ["--strategy", "lobster", "--decoder", "raw"];
    let with = |extra: &[&str]| -> Vec<String> {
        lobster.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    let refused = |extra: &[&str]| {
        let args = with(extra);
        run_err(
            &data,
            &json,
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
        )
    };

    let e = refused(&["--resume", state_s]);
    assert!(e.contains("--resume") && e.contains("state.json"), "{e}");

    let args = with(&["--stop-after-iterations", "3", "--save-state", state_s]);
    run_ok(
        &data,
        &json,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    std::fs::remove_file(&json).unwrap();
    let good = std::fs::read_to_string(&state).unwrap();

    // Another seed is another order; another batch size another job.
    let e = refused(&["--resume", state_s, "--seed", "9"]);
    assert!(e.contains("state.json") && e.contains("order"), "{e}");
    assert!(
        e.contains("shuffle seed 0") && e.contains("shuffle seed 9"),
        "{e}"
    );
    let e = refused(&["--resume", state_s, "--batch", "2"]);
    assert!(e.contains("state.json") && e.contains("batch_size"), "{e}");

    // Cut short, then one digit changed.
    std::fs::write(&state, &good[..good.len() / 2]).unwrap();
    let e = refused(&["--resume", state_s]);
    assert!(
        e.contains("state.json") && e.contains("unreadable loader state"),
        "{e}"
    );
    let edited = good.replacen("\"consumed\": 16", "\"consumed\": 8", 1);
    assert_ne!(edited, good, "the edit must change the state");
    std::fs::write(&state, edited).unwrap();
    let e = refused(&["--resume", state_s]);
    assert!(e.contains("state.json") && e.contains("checksum"), "{e}");

    // The modes that cannot resume name themselves.
    std::fs::write(&state, &good).unwrap();
    let e = refused(&["--stop-after-iterations", "2", "--cluster"]);
    assert!(
        e.contains("--stop-after-iterations") && e.contains("--cluster"),
        "{e}"
    );
    let e = refused(&["--stop-after-iterations", "2", "--ranks-as", "processes"]);
    assert!(
        e.contains("--stop-after-iterations") && e.contains("--ranks-as processes"),
        "{e}"
    );
    let e = refused(&["--save-state", state_s]);
    assert!(e.contains("--stop-after-iterations"), "{e}");
    let e = refused(&["--stop-after-iterations", "0"]);
    assert!(e.contains("--stop-after-iterations 0"), "{e}");
}

#[test]
fn rank_processes_resume_as_rank_threads_do() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    gen(&data, 48, 4);
    let json = |n: &str| dir.path().join(format!("{n}.json"));
    let state = json("state");
    let state_s = state.to_str().unwrap();
    let common = ["--strategy", "pytorch,lobster", "--decoder", "raw"];
    fn with<'a>(common: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        common.iter().chain(extra).copied().collect()
    }
    let full = run_ok(&data, &json("full"), &with(&common, &[]));
    let stop = ["--stop-after-iterations", "4", "--save-state", state_s];
    let first = run_ok(&data, &json("first"), &with(&common, &stop));
    let threads = run_ok(
        &data,
        &json("threads"),
        &with(&common, &["--resume", state_s]),
    );
    let processes = run_ok(
        &data,
        &json("processes"),
        &with(&common, &["--resume", state_s, "--ranks-as", "processes"]),
    );
    assert_eq!(processes["config"]["ranks_as"], "processes");
    for i in 0..2 {
        let (t, p) = (&threads["results"][i], &processes["results"][i]);
        // The same rest of the run, with the same cache decisions, whichever runs the ranks.
        for key in ["strategy", "samples", "hits", "accesses"] {
            assert_eq!(t[key], p[key], "{key} of {}", t["strategy"]);
        }
        let samples = |r: &serde_json::Value| r["results"][i]["samples"].as_u64().unwrap();
        assert_eq!(samples(&first) + samples(&threads), samples(&full));
    }
    // Stopping is the rank threads' alone.
    let out = run(
        &data,
        &json("refused"),
        &with(
            &common,
            &[
                "--ranks-as",
                "processes",
                "--stop-after-iterations",
                "4",
                "--save-state",
                state_s,
            ],
        ),
    );
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("--save-state") && e.contains("--ranks-as processes"),
        "{e}"
    );
}

/// Every node of a job in one process (`--cluster`) resumes from a state saved by one node of
/// it: each node delivers what was left, and peers serve every remote hit planned.
#[test]
fn a_job_of_nodes_in_one_process_resumes_from_a_saved_state() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    gen(&data, 64, 4);
    let json = |n: &str| dir.path().join(format!("{n}.json"));
    let state = json("state");
    let state_s = state.to_str().unwrap();
    let common = [
        "--strategy",
        "lobster",
        "--decoder",
        "raw",
        "--cache-frac",
        "0.3",
    ];
    let with =
        |extra: &[&'static str]| -> Vec<&str> { common.iter().chain(extra).copied().collect() };
    let full = run_ok(&data, &json("full"), &with(&["--cluster"]));
    let stop = ["--stop-after-iterations", "5", "--save-state", state_s];
    run_ok(
        &data,
        &json("first"),
        &common.iter().chain(&stop).copied().collect::<Vec<_>>(),
    );
    let resumed = run_ok(
        &data,
        &json("resumed"),
        &common
            .iter()
            .chain(&["--cluster", "--resume", state_s])
            .copied()
            .collect::<Vec<_>>(),
    );
    let samples = |r: &serde_json::Value, n: usize| r["nodes"][n][0]["samples"].as_u64().unwrap();
    for n in 0..2 {
        let node = &resumed["nodes"][n][0];
        // 64 samples over 4 ranks, batches of 4: 4 steps an epoch, 12 in all; 5 taken.
        assert_eq!(samples(&full, n), 2 * 16 * 3, "node {n}");
        assert_eq!(samples(&resumed, n), 2 * 4 * (12 - 5), "node {n}");
        assert_eq!(
            node["remote_hits"], node["planned_remote_hits"],
            "node {n}: {node}"
        );
        assert_eq!(node["remote_misses"], 0, "node {n}");
    }
}
