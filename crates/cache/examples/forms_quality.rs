//! How close the two-form rule comes to the exhaustive optimum on small streams, and how
//! `auto` compares with each single form on training-like streams.
//!
//! `cargo run --release -p lobster-cache --example forms_quality [CASES]`

use lobster_cache::FormChoice;
use lobster_testkit::forms_optimum::{compare, rule_savings_s};
use lobster_testkit::gen::{CostRegime, FormCase};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cases: u64 = std::env::args().nth(1).map_or(Ok(2000), |a| a.parse())?;
    let mut worst = [(f64::INFINITY, 0u64); 3];
    let mut sum = [0.0; 3];
    let mut optimal = [0u64; 3];
    let mut vs_single = (f64::INFINITY, 0u64, 0.0);
    for seed in 0..cases {
        let c = compare(&FormCase::small(seed, 12))?;
        for (i, choice) in FormChoice::ALL.into_iter().enumerate() {
            let r = c.ratio(choice);
            sum[i] += r;
            optimal[i] += u64::from(r > 1.0 - 1e-9);
            if r < worst[i].0 {
                worst[i] = (r, seed);
            }
        }
        let single = c.rule_s[0].max(c.rule_s[1]);
        let r = if single == 0.0 {
            1.0
        } else {
            c.rule_s[2] / single
        };
        vs_single.2 += r;
        if r < vs_single.0 {
            (vs_single.0, vs_single.1) = (r, seed);
        }
    }
    println!("small streams (2 to 5 samples, 2 to 4 epochs, at most 12 reuses), {cases} seeds:");
    println!("| forms | rule / optimum, mean | optimal in | worst (seed) |");
    println!("|---|---|---|---|");
    for (i, choice) in FormChoice::ALL.into_iter().enumerate() {
        println!(
            "| {choice} | {:.3} | {:.1}% | {:.3} ({}) |",
            sum[i] / cases as f64,
            100.0 * optimal[i] as f64 / cases as f64,
            worst[i].0,
            worst[i].1
        );
    }
    println!(
        "auto / the better single form: mean {:.3}, worst {:.3} (seed {})\n",
        vs_single.2 / cases as f64,
        vs_single.0,
        vs_single.1
    );
    println!(
        "training streams (300 samples of median 110 KiB, decoded 3x, 3 epochs): seconds saved"
    );
    println!("| costs | budget % of decoded | encoded | decoded | auto | auto / better |");
    println!("|---|---|---|---|---|---|");
    for regime in CostRegime::ALL {
        for percent in [10, 25, 50, 100] {
            let [e, d, a] = rule_savings_s(&FormCase::training(300, 3, 3.0, regime, percent, 5))?;
            println!(
                "| {regime:?} | {percent} | {e:.3} | {d:.3} | {a:.3} | {:.3} |",
                a / e.max(d)
            );
        }
    }
    Ok(())
}
