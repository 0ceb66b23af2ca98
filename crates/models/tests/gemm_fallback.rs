//! The golden prefill again with candle's gemm serving every product of more
//! than 4 rows (the path CPUs without AVX-512 take for prefill), so it stays
//! covered on machines that have AVX-512.

mod common;

use agentd_models::LogitsFor;
use common::*;

#[test]
fn prefill_through_candle_gemm_matches_transformers() {
    // Read once by the process's first linear layer; this test binary runs
    // only this test.
    std::env::set_var("AGENTD_GEMV_MAX_ROWS", "4");
    for name in MODELS {
        let model = load(name);
        for case in golden(name).iter().filter(|c| c.all_positions) {
            let mut cache = model.new_cache(8, 16).unwrap();
            let mut pool = BlockPool::new(8, 3);
            let mut seq = Seq::new(&case.input_ids);
            let n = case.input_ids.len();
            let got = step(
                &model,
                &mut cache,
                &mut pool,
                &mut [&mut seq],
                &[(n, LogitsFor::All)],
            );
            for (g, w) in got.iter().zip(&case.prefill_logits) {
                assert!(rel_err(g, w) < 1e-4, "{name} prompt {n}");
            }
        }
    }
}
