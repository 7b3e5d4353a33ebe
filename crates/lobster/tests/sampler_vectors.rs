//! The sampler against vectors produced with PyTorch (provenance in data/README.md).

use lobster_io::{torch_randperm, DistributedSampler, EpochOrder};
use serde_json::Value;

fn vectors() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/torch_sampler.json");
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("the PyTorch vectors at {path} are required: {e}"));
    serde_json::from_str(&text).expect("vectors are JSON")
}

fn as_u64(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("{key} in {v}"))
}

fn as_list(v: &Value, key: &str) -> Vec<u32> {
    v[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn randperm_equals_torch_randperm() {
    let all = vectors();
    let cases = all["randperm"].as_array().unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        let (n, seed) = (as_u64(case, "n") as usize, as_u64(case, "seed"));
        assert_eq!(
            torch_randperm(n, seed),
            as_list(case, "perm"),
            "n={n} seed={seed}"
        );
    }
}

#[test]
fn distributed_sampler_equals_torch_distributed_sampler() {
    let all = vectors();
    let cases = all["distributed_sampler"].as_array().unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        assert!(case["shuffle"].as_bool().unwrap());
        let sampler = DistributedSampler::new(
            as_u64(case, "n") as usize,
            as_u64(case, "num_replicas") as usize,
            case["drop_last"].as_bool().unwrap(),
            EpochOrder::Shuffle {
                seed: as_u64(case, "seed"),
            },
        )
        .unwrap();
        let got = sampler.rank_indices(as_u64(case, "epoch") as u32, as_u64(case, "rank") as usize);
        assert_eq!(got, as_list(case, "indices"), "case {case}");
    }
}
