//! Test support: kernels' parameter lists read from their `.cu` source,
//! so each launch's argument list is checked against the signature it
//! must match without a GPU (`attn_ops`, `moe_device`).

use crate::device::Arg;

/// The parameter names of the first parenthesised list after `marker` in
/// `src` (a `#define NAME (type name, ...)`, a kernel's head, or the list
/// of an `AGENTD_BF16_F16(name, (...), ...)`).
pub(crate) fn params_in(src: &str, marker: &str) -> Vec<String> {
    let at = src.find(marker).expect("marker") + marker.len();
    let open = at + src[at..].find('(').expect("(");
    let close = open + src[open..].find(')').expect(")");
    src[open + 1..close]
        .split(',')
        .map(|p| {
            p.replace('\\', " ")
                .split_whitespace()
                .last()
                .unwrap_or("")
                .trim_start_matches('*')
                .to_string()
        })
        .collect()
}

/// Each argument as the number it carries.
pub(crate) fn values(args: &[Arg]) -> Vec<u64> {
    args.iter()
        .map(|a| match *a {
            Arg::Ptr(p) | Arg::U64(p) => p,
            Arg::I32(v) => v as u64,
            Arg::I64(v) => v as u64,
            Arg::F32(v) => v as u64,
        })
        .collect()
}
