//! End-to-end tests of `lobster-bench plan-bench --plan cluster` and `--sweep`, run on the built
//! binary: the report's numbers agree with each other and with the floor's definition.

use std::process::{Command, Output};

use serde_json::Value;

fn lobster(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lobster-bench"))
        .args(args)
        .output()
        .expect("run lobster")
}

fn ok_stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Tiny jobs: 2000 samples over 2 ranks a node, batch 8, 3 epochs.
const SHAPE: [&str; 8] = [
    "--samples",
    "2000",
    "--ranks-per-node",
    "2",
    "--batch-size",
    "8",
    "--epochs",
    "3",
];

fn case(nodes: usize, cache_frac: f64) -> Value {
    case_with(nodes, cache_frac, &[])
}

fn case_with(nodes: usize, cache_frac: f64, more: &[&str]) -> Value {
    let (nodes, frac) = (nodes.to_string(), cache_frac.to_string());
    let mut args = vec!["plan-bench", "--plan", "cluster", "--json"];
    args.extend(SHAPE);
    args.extend(["--nodes", &nodes, "--cache-frac", &frac]);
    args.extend(more);
    serde_json::from_str(&ok_stdout(&lobster(&args))).expect("one JSON object")
}

fn u(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("{key} in {v}"))
}

fn f(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("{key} in {v}"))
}

/// What holds of every report whatever the case.
fn check_consistent(r: &Value) {
    let (dataset, capacity, nodes) = (
        u(r, "dataset_bytes"),
        u(r, "capacity_bytes_per_node"),
        u(r, "nodes"),
    );
    let floor = u(r, "floor_bytes_per_epoch");
    assert_eq!(floor, dataset.saturating_sub(nodes * capacity), "{r}");
    assert!((f(r, "floor_frac") - floor as f64 / dataset as f64).abs() < 1e-12);
    // The first epoch starts cold: every distinct sample comes from storage once.
    assert_eq!(u(r, "first_epoch_storage_bytes"), dataset, "{r}");
    let (lo, hi, mean) = (
        u(r, "steady_storage_bytes_min"),
        u(r, "steady_storage_bytes_max"),
        f(r, "steady_storage_bytes_per_epoch"),
    );
    assert!(lo >= floor, "a steady epoch below the floor: {r}");
    assert!(lo as f64 <= mean && mean <= hi as f64, "{r}");
    match r["storage_over_floor"].as_f64() {
        Some(x) => {
            assert!(floor > 0, "{r}");
            assert!((x - mean / floor as f64).abs() < 1e-9, "{r}");
        }
        None => assert_eq!(floor, 0, "{r}"),
    }
    // 2000 samples split evenly over the world: no padding, so every steady epoch accesses
    // each sample once.
    let steady_epochs = u(r, "epochs") - 1;
    assert_eq!(u(r, "steady_accesses"), 2000 * steady_epochs, "{r}");
    assert_eq!(u(r, "steady_bytes"), dataset * steady_epochs, "{r}");
    let storage = f(r, "storage_frac_bytes");
    assert!(
        (storage * dataset as f64 * steady_epochs as f64 - mean * steady_epochs as f64).abs() < 1.0
    );
    let shares = storage + f(r, "local_hit_frac_bytes") + f(r, "remote_hit_frac_bytes");
    assert!((shares - 1.0).abs() < 1e-9, "{r}");
    assert!((0.0..=1.0).contains(&f(r, "storage_frac_accesses")), "{r}");
    // The plan counts the capacity it reserved, not all of it resident, so it may exceed
    // the RSS: only both are present.
    assert!(
        u(r, "peak_rss_bytes") > 0 && u(r, "plan_peak_bytes") > 0,
        "{r}"
    );
    assert!(
        (f(r, "peak_rss_bytes_per_sample") - u(r, "peak_rss_bytes") as f64 / 2000.0).abs() < 1e-6
    );
    assert!(f(r, "plan_cpu_seconds") >= 0.0 && f(r, "plan_wall_seconds") >= 0.0);
}

#[test]
fn cluster_plan_at_four_nodes_reads_within_a_tenth_of_the_floor() {
    // 20% a node: C*N^2 = 3.2 F, so the rule picks the cluster plan; the floor is 20% of F.
    let r = case(4, 0.2);
    check_consistent(&r);
    assert_eq!(r["mode"], "cluster");
    assert_eq!(r["mode_auto"], true);
    let ratio = r["storage_over_floor"].as_f64().expect("a floor above 0");
    assert!((1.0..1.1).contains(&ratio), "{r}");
    // Storage bytes per epoch never fall below the floor, and the remote hits carry most.
    assert!(
        f(&r, "remote_hit_frac_bytes") > f(&r, "local_hit_frac_bytes"),
        "{r}"
    );
}

#[test]
fn locality_turns_the_remote_hits_local_at_the_same_storage_reads() {
    let (sampler, near) = (case(4, 0.2), case_with(4, 0.2, &["--assign", "locality"]));
    check_consistent(&near);
    assert_eq!(
        (&sampler["assign"], &near["assign"]),
        (&"sampler".into(), &"locality".into())
    );
    let ratio = near["storage_over_floor"]
        .as_f64()
        .expect("a floor above 0");
    assert!((1.0..1.1).contains(&ratio), "{near}");
    assert!(
        f(&near, "local_hit_frac_bytes") > 2.0 * f(&sampler, "local_hit_frac_bytes"),
        "{near} against {sampler}"
    );
    assert!(
        f(&near, "remote_hit_frac_bytes") < f(&near, "local_hit_frac_bytes"),
        "{near}"
    );
    // Each node's own plan knows no other node's holdings.
    let out = lobster(&[
        "plan-bench",
        "--plan",
        "cluster",
        "--mode",
        "local",
        "--assign",
        "locality",
        "--samples",
        "1000",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cluster mode"));
}

#[test]
fn small_caches_run_the_local_plan_and_a_zero_floor_has_no_ratio() {
    // 1% a node on 4 nodes: C*N^2 = 0.16 F, each node's own plan.
    let local = case(4, 0.01);
    check_consistent(&local);
    assert_eq!(local["mode"], "local");
    // 20% on 8 nodes: the caches together exceed the dataset, so the floor is 0.
    let pooled = case(8, 0.2);
    check_consistent(&pooled);
    assert_eq!(pooled["mode"], "cluster");
    assert_eq!(u(&pooled, "floor_bytes_per_epoch"), 0);
    assert!(pooled["storage_over_floor"].is_null(), "{pooled}");
}

#[test]
fn text_report_names_the_mode_and_shows_no_ratio_for_a_zero_floor() {
    let mut args = vec!["plan-bench", "--plan", "cluster"];
    args.extend(SHAPE);
    args.extend(["--nodes", "8", "--cache-frac", "0.2"]);
    let text = ok_stdout(&lobster(&args));
    assert!(text.contains("mode: cluster"), "{text}");
    assert!(text.contains("over the floor: -;"), "{text}");
}

#[test]
fn sweep_runs_each_case_in_its_own_process_with_the_single_case_figures() {
    let mut args = vec![
        "plan-bench",
        "--sweep",
        "--json",
        "--sweep-samples",
        "2000",
        "--sweep-nodes",
        "2,4",
        "--sweep-cache-fracs",
        "0.2,0.01",
    ];
    args.extend(&SHAPE[2..]);
    let rows: Vec<Value> =
        serde_json::from_str(&ok_stdout(&lobster(&args))).expect("one JSON array");
    assert_eq!(rows.len(), 4);
    let mut pids: Vec<u64> = rows.iter().map(|r| u(r, "process_id")).collect();
    pids.sort_unstable();
    pids.dedup();
    assert_eq!(pids.len(), 4, "each case in a process of its own");
    let shape: Vec<(u64, f64)> = rows
        .iter()
        .map(|r| (u(r, "nodes"), f(r, "cache_frac")))
        .collect();
    assert_eq!(shape, [(2, 0.2), (4, 0.2), (2, 0.01), (4, 0.01)]);
    for r in &rows {
        check_consistent(r);
        // The plan is deterministic: the same case alone counts the same bytes.
        let alone = case(u(r, "nodes") as usize, f(r, "cache_frac"));
        for key in [
            "steady_storage_bytes_min",
            "steady_storage_bytes_max",
            "floor_bytes_per_epoch",
        ] {
            assert_eq!(r[key], alone[key], "{key}");
        }
        assert_eq!(r["mode"], alone["mode"]);
    }
    // The table form prints a header and one row per case.
    let table_args: Vec<&str> = args.iter().copied().filter(|a| *a != "--json").collect();
    let text = ok_stdout(&lobster(&table_args));
    assert_eq!(
        text.lines().filter(|l| l.starts_with("| 2000 |")).count(),
        4,
        "{text}"
    );
}

#[test]
fn default_plan_bench_is_still_the_node_plan() {
    let out = lobster(&[
        "plan-bench",
        "--json",
        "--samples",
        "2000",
        "--nodes",
        "2",
        "--ranks-per-node",
        "2",
        "--batch-size",
        "8",
        "--epochs",
        "2",
    ]);
    let r: Value = serde_json::from_str(&ok_stdout(&out)).expect("one JSON object");
    assert!(r.get("planned_remote").is_some(), "{r}");
    assert!(r.get("floor_bytes_per_epoch").is_none(), "{r}");
}

#[test]
fn one_epoch_is_refused_for_lack_of_a_steady_state() {
    let out = lobster(&[
        "plan-bench",
        "--plan",
        "cluster",
        "--samples",
        "100",
        "--nodes",
        "2",
        "--epochs",
        "1",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--epochs 1"));
}
