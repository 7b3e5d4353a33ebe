//! `lobster-bench s3-server` through the built binary: it uploads a directory by PUT, prints
//! its endpoint and credentials, serves the objects with their bytes and ETags, and stops on
//! SIGTERM, keeping its root.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use lobster_store::{RangeRead, Store, StoreConfig};

#[test]
fn s3_server_uploads_serves_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("a")).unwrap();
    std::fs::write(data.join("a/x.bin"), b"hello world").unwrap();
    std::fs::write(data.join("y.bin"), vec![7u8; 5000]).unwrap();
    let root = dir.path().join("root");
    let mut child = Command::new(env!("CARGO_BIN_EXE_lobster-bench"))
        .arg("s3-server")
        .arg("--root")
        .arg(&root)
        .arg("--upload")
        .arg(format!("bkt/set={}", data.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut said = std::collections::HashMap::new();
    for _ in 0..3 {
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let (k, v) = line.trim().split_once(' ').unwrap();
        said.insert(k.to_owned(), v.to_owned());
    }
    let config = StoreConfig::from_vars(|_| None, None)
        .unwrap()
        .with_endpoint(&said["endpoint"])
        .with_region("us-east-1")
        .with_credentials(&said["access_key"], &said["secret_key"], None);
    let store = Store::open(&config, "bkt").unwrap();
    let keys: Vec<String> = store
        .list("set/")
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert_eq!(keys, ["set/a/x.bin", "set/y.bin"]);
    let got = store.get(&RangeRead::new("set/a/x.bin", 6, 5, 0)).unwrap();
    assert_eq!(&got[..], b"world");
    assert!(store.head("set/y.bin").unwrap().etag.is_some());
    drop(store);
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(root.join("bkt").is_dir(), "the root is kept");
}
