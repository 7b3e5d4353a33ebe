//! `lobster run --data s3://...`: the default set packed with `lobster pack`, uploaded by PUT
//! to a real S3 server (s3s-fs on loopback), delivers the same batches as the same shards
//! read from the local folder, for every strategy, on one node and on four, and reports its
//! GET requests and bytes per epoch and node. The endpoint and credentials come from the AWS
//! variables, as a user would give them; no secret reaches the output.

mod common;

use std::path::Path;
use std::process::Command;

use common::{gen, lobster, pack};
use lobster_testkit::s3::TestS3;

/// The server, with the packed set's shards under `shards/` of bucket `data`; returns the
/// local shard directory too.
fn packed(dir: &Path) -> (TestS3, std::path::PathBuf) {
    let images = dir.join("images");
    gen(&images, 120, 6);
    let shards = dir.join("shards");
    pack(&images, &shards, 131072);
    let s3 = TestS3::start();
    s3.create_bucket("data");
    let mut names: Vec<_> = std::fs::read_dir(&shards)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    assert!(names.len() >= 4, "{names:?}");
    for p in names {
        let key = format!("shards/{}", p.file_name().unwrap().to_str().unwrap());
        s3.put("data", &key, std::fs::read(&p).unwrap());
    }
    (s3, shards)
}

/// `lobster` with the AWS variables set for `s3`, and its caches under `dir`.
fn lobster_on(s3: &TestS3, dir: &Path) -> Command {
    let mut cmd = lobster();
    cmd.env("AWS_ENDPOINT_URL", s3.endpoint())
        .env("AWS_ACCESS_KEY_ID", s3.access_key())
        .env("AWS_SECRET_ACCESS_KEY", s3.secret_key())
        .env("AWS_REGION", "us-east-1")
        .env("AWS_CONFIG_FILE", dir.join("no-config"))
        .env("AWS_SHARED_CREDENTIALS_FILE", dir.join("no-credentials"))
        .env("XDG_CACHE_HOME", dir.join("cache"));
    cmd
}

/// `lobster run` with the AWS variables set for `s3`.
fn run(
    s3: &TestS3,
    dir: &Path,
    data: &str,
    name: &str,
    extra: &[&str],
) -> (serde_json::Value, String) {
    let json = dir.join(format!("{name}.json"));
    let mut cmd = lobster_on(s3, dir);
    cmd.args([
        "run",
        "--compute-ms",
        "0",
        "--storage-mbps",
        "0",
        "--decoder",
        "raw",
    ])
    .args([
        "--batch",
        "4",
        "--epochs",
        "3",
        "--cache-frac",
        "0.2",
        "--data",
        data,
    ])
    .args(extra)
    .arg("--json")
    .arg(&json);
    let out = cmd.output().unwrap();
    let stdout =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}");
    let report = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (report, stdout)
}

fn crcs(results: &serde_json::Value) -> Vec<(String, serde_json::Value)> {
    results
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["strategy"].as_str().unwrap().to_owned(),
                r["batches_crc32"].clone(),
            )
        })
        .collect()
}

#[test]
fn every_strategy_delivers_the_local_shards_batches_from_a_bucket_on_one_node() {
    let dir = tempfile::tempdir().unwrap();
    let (s3, shards) = packed(dir.path());
    let (local, _) = run(
        &s3,
        dir.path(),
        shards.to_str().unwrap(),
        "local",
        &["--ranks-per-node", "2"],
    );
    let (remote, text) = run(
        &s3,
        dir.path(),
        "s3://data/shards/",
        "s3",
        &["--ranks-per-node", "2"],
    );
    assert_eq!(crcs(&remote["results"]), crcs(&local["results"]));
    assert!(crcs(&remote["results"]).len() >= 4, "every strategy ran");
    for r in remote["results"].as_array().unwrap() {
        let requests = r["object_requests_by_epoch"].as_array().unwrap();
        let reads = r["storage_reads_by_epoch"].as_array().unwrap();
        assert_eq!(requests.len(), 3, "{}", r["strategy"]);
        // No failure here: a GET per storage read, but where reads of one shard queued
        // together shared one (how many do depends on timing, not on the plan).
        assert_fewer_gets(requests, reads, &r["strategy"]);
        assert!(r["storage_bytes_by_epoch"][0].as_u64().unwrap() > 0);
    }
    let report = std::fs::read_to_string(dir.path().join("s3.json")).unwrap();
    // `ls` lists the bucket's samples; `index` builds the shards' indexes and reopens them.
    let ls = lobster_on(&s3, dir.path())
        .args(["ls", "--json", "--data", "s3://data/shards/"])
        .output()
        .unwrap();
    assert!(
        ls.status.success(),
        "{}",
        String::from_utf8_lossy(&ls.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 120);
    let first = rows[0]["file"].as_str().unwrap();
    assert!(
        first.starts_with("s3://data/shards/shard-000000.tar"),
        "{first}"
    );
    let index = lobster_on(&s3, dir.path())
        .args(["index", "--json", "--data", "s3://data/shards/"])
        .output()
        .unwrap();
    assert!(
        index.status.success(),
        "{}",
        String::from_utf8_lossy(&index.stderr)
    );
    let indexed: serde_json::Value = serde_json::from_slice(&index.stdout).unwrap();
    assert_eq!(indexed["kind"], "objects");
    assert_eq!(indexed["samples"], 120);
    for text in [&report, &text] {
        assert!(!text.contains(s3.secret_key()), "a secret in the output");
    }
}

/// Per epoch, at most a GET per storage read and at least one where there were reads.
fn assert_fewer_gets(
    requests: &[serde_json::Value],
    reads: &[serde_json::Value],
    what: &dyn std::fmt::Display,
) {
    assert_eq!(requests.len(), reads.len(), "{what}");
    for (gets, reads) in requests.iter().zip(reads) {
        let (gets, reads) = (gets.as_u64().unwrap(), reads.as_u64().unwrap());
        assert!(
            gets <= reads && (gets > 0) == (reads > 0),
            "{what}: {gets} GETs for {reads} reads"
        );
    }
}

#[test]
fn four_nodes_share_their_caches_over_a_bucket_as_over_local_shards() {
    let dir = tempfile::tempdir().unwrap();
    let (s3, shards) = packed(dir.path());
    let four = ["--cluster", "--nodes", "4", "--ranks-per-node", "2"];
    let (local, _) = run(&s3, dir.path(), shards.to_str().unwrap(), "local4", &four);
    let (remote, _) = run(&s3, dir.path(), "s3://data/shards/", "s34", &four);
    let (ln, rn) = (
        local["nodes"].as_array().unwrap(),
        remote["nodes"].as_array().unwrap(),
    );
    assert_eq!(rn.len(), 4);
    for n in 0..4 {
        assert_eq!(crcs(&rn[n]), crcs(&ln[n]), "node {n}");
        for r in rn[n].as_array().unwrap() {
            assert_eq!(r["remote_hits"], r["planned_remote_hits"], "node {n}: {r}");
            let requests = r["object_requests_by_epoch"].as_array().unwrap();
            let reads = r["storage_reads_by_epoch"].as_array().unwrap();
            assert_fewer_gets(requests, reads, &format!("node {n}"));
        }
    }
}
