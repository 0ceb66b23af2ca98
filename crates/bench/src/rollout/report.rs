//! The rollout report: one table row per (target, iteration), a per-target
//! summary, markdown, and an SVG plot (throughput, makespans, wall time and
//! the swap per iteration, one line per target).

use agentd_report::{Panel, Plot, Series, Table};

use super::stats::IterationRow;

fn targets(rows: &[IterationRow]) -> Vec<String> {
    let mut t: Vec<String> = Vec::new();
    for r in rows {
        if !t.contains(&r.target) {
            t.push(r.target.clone());
        }
    }
    t
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.prec$}"))
}

/// A `/metrics` delta of the iteration ("-": not served).
fn counter(r: &IterationRow, key: &str) -> String {
    opt(r.counters.as_ref().and_then(|c| c[key].as_f64()), 0)
}

/// Prefix-cache hits over queries from the `/metrics` deltas.
fn metrics_hit_rate(r: &IterationRow) -> Option<f64> {
    let c = r.counters.as_ref()?;
    let (h, q) = (c["hits"].as_f64()?, c["queries"].as_f64()?);
    (q > 0.0).then(|| h / q)
}

pub fn table(rows: &[IterationRow]) -> Table {
    let mut t = Table::new([
        "target",
        "iter",
        "weight version",
        "programs",
        "wall s",
        "out tok/s",
        "makespan p50 s",
        "makespan max s",
        "first p50 s",
        "first max s",
        "step p50 s",
        "step p99 s",
        "hit",
        "hit (metrics)",
        "preempt",
        "recomputed",
        "pauses",
        "swap s",
        "update s",
        "read s",
        "update/read",
        "cache",
        "errors",
    ]);
    for r in rows {
        let s = r.swap.as_ref();
        t.row([
            r.target.clone(),
            r.iteration.to_string(),
            r.weight_version.clone().unwrap_or_else(|| "-".into()),
            format!("{}/{}", r.programs_finished, r.programs),
            format!("{:.1}", r.wall_s),
            format!("{:.1}", r.gen_tok_s),
            format!("{:.1}", r.group_makespan_p50_s),
            format!("{:.1}", r.group_makespan_max_s),
            format!("{:.2}", r.first_response_p50_s),
            format!("{:.2}", r.first_response_max_s),
            format!("{:.2}", r.step_p50_s),
            format!("{:.2}", r.step_p99_s),
            opt(r.usage_hit_rate, 3),
            opt(metrics_hit_rate(r), 3),
            counter(r, "preemptions"),
            counter(r, "recomputed"),
            counter(r, "pauses"),
            opt(s.map(|s| s.total_s), 3),
            opt(s.and_then(|s| s.update_s), 3),
            opt(s.and_then(|s| s.read_s), 3),
            opt(r.update_over_read, 2),
            match s {
                Some(s) if s.read_s.is_some() => {
                    (if s.cold_cache { "cold" } else { "warm" }).into()
                }
                _ => "-".into(),
            },
            r.errors.to_string(),
        ]);
    }
    t
}

/// Per target: the iterations' total wall time, the swaps' total, output
/// tokens over generation time, and the makespans' worst p50 and max.
pub fn summary(rows: &[IterationRow]) -> Table {
    let mut t = Table::new([
        "target",
        "iterations",
        "generation s",
        "swaps s",
        "out tok/s",
        "worst makespan p50 s",
        "worst makespan max s",
        "programs",
    ]);
    for name in targets(rows) {
        let rs: Vec<&IterationRow> = rows.iter().filter(|r| r.target == name).collect();
        let wall: f64 = rs.iter().map(|r| r.wall_s).sum();
        let swaps: f64 = rs
            .iter()
            .filter_map(|r| r.swap.as_ref())
            .map(|s| s.total_s)
            .sum();
        let out: usize = rs.iter().map(|r| r.output_tokens).sum();
        let worst = |f: fn(&IterationRow) -> f64| rs.iter().map(|r| f(r)).fold(0.0, f64::max);
        t.row([
            name.clone(),
            rs.len().to_string(),
            format!("{wall:.1}"),
            format!("{swaps:.2}"),
            format!("{:.1}", if wall > 0.0 { out as f64 / wall } else { 0.0 }),
            format!("{:.1}", worst(|r| r.group_makespan_p50_s)),
            format!("{:.1}", worst(|r| r.group_makespan_max_s)),
            format!(
                "{}/{}",
                rs.iter().map(|r| r.programs_finished).sum::<usize>(),
                rs.iter().map(|r| r.programs).sum::<usize>()
            ),
        ]);
    }
    t
}

fn fenced(t: &Table) -> String {
    format!("```\n{}```\n", t.render())
}

pub fn markdown(rows: &[IterationRow], header: &str) -> String {
    let mut s = String::new();
    s.push_str(header);
    s.push_str("\n\n### Per iteration\n\n");
    s.push_str(&fenced(&table(rows)));
    s.push_str("\n### Per target\n\n");
    s.push_str(&fenced(&summary(rows)));
    for r in rows.iter().filter(|r| !r.error_messages.is_empty()) {
        for m in &r.error_messages {
            s.push_str(&format!(
                "\n- error, {} iteration {}: {m}",
                r.target, r.iteration
            ));
        }
    }
    s.push('\n');
    s
}

/// One series per target of `f` against the iteration (rows where `f` is
/// None are skipped).
fn per_target(
    rows: &[IterationRow],
    suffix: &str,
    f: impl Fn(&IterationRow) -> Option<f64>,
) -> Vec<Series> {
    targets(rows)
        .into_iter()
        .map(|name| Series {
            points: rows
                .iter()
                .filter(|r| r.target == name)
                .filter_map(|r| f(r).map(|y| (r.iteration as f64, y)))
                .collect(),
            name: format!("{name}{suffix}"),
        })
        .filter(|s| !s.points.is_empty())
        .collect()
}

pub fn plot(rows: &[IterationRow], title: &str) -> Plot {
    let panel = |title: &str, y_label: &str, series| Panel {
        title: title.into(),
        x_label: "iteration".into(),
        y_label: y_label.into(),
        series,
        y_from_zero: true,
    };
    let mut makespans = per_target(rows, " p50", |r| Some(r.group_makespan_p50_s));
    makespans.extend(per_target(rows, " max", |r| Some(r.group_makespan_max_s)));
    let mut swaps = per_target(rows, " swap", |r| r.swap.as_ref().map(|s| s.total_s));
    swaps.extend(per_target(rows, " read", |r| {
        r.swap.as_ref().and_then(|s| s.read_s)
    }));
    Plot {
        title: title.into(),
        panels: vec![
            panel(
                "Generation throughput",
                "output tokens / s",
                per_target(rows, "", |r| Some(r.gen_tok_s)),
            ),
            panel("Group makespan", "seconds", makespans),
            panel(
                "Iteration wall time",
                "seconds",
                per_target(rows, "", |r| Some(r.wall_s)),
            ),
            panel("Weight swap and checkpoint read", "seconds", swaps),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::stats::{ProgramOutcome, SwapTimes};

    fn rows() -> Vec<IterationRow> {
        let p = |g, end| ProgramOutcome {
            group: g,
            sample: 0,
            started_s: 0.0,
            finished_s: end,
            ok: true,
            turns_done: 1,
            output_tokens: 8,
            prompt_tokens: 10,
            cached_tokens: None,
            step_s: vec![end],
            error: None,
        };
        let swap = SwapTimes {
            update_s: Some(0.5),
            read_s: Some(0.25),
            total_s: 0.6,
            cold_cache: true,
            ..SwapTimes::default()
        };
        vec![
            IterationRow::summarise(
                "program",
                0,
                Some("default".into()),
                None,
                &[p(0, 2.0), p(1, 4.0)],
            ),
            IterationRow::summarise(
                "program",
                1,
                Some("r-1".into()),
                Some(swap),
                &[p(0, 1.0), p(1, 2.0)],
            ),
            IterationRow::failed("vllm", 0, "unreachable".into()),
        ]
    }

    #[test]
    fn table_summary_and_markdown() {
        let rows = rows();
        let mut rows = rows;
        rows[1].counters = Some(serde_json::json!({"preemptions": 3.0, "recomputed": 1234.0,
            "hits": 30.0, "queries": 40.0}));
        let t = table(&rows).render();
        assert!(t.contains("1234") && t.contains("0.750"), "{t}");
        assert!(
            t.contains("r-1") && t.contains("cold") && t.contains("2.00"),
            "{t}"
        );
        let s = summary(&rows).render();
        // program: 6 s of generation, 0.6 s of swaps, 32 tokens / 6 s.
        let line = s
            .lines()
            .find(|l| l.trim_start().starts_with("program"))
            .unwrap();
        assert!(
            line.contains("6.0") && line.contains("0.60") && line.contains("5.3"),
            "{line}"
        );
        let md = markdown(&rows, "## Rollout");
        assert!(
            md.starts_with("## Rollout") && md.contains("unreachable"),
            "{md}"
        );
    }

    #[test]
    fn plot_has_a_line_per_target_and_the_swap_panel() {
        let p = plot(&rows(), "rollout");
        assert_eq!(p.panels.len(), 4);
        assert_eq!(p.panels[0].series.len(), 2);
        assert_eq!(p.panels[1].series.len(), 4, "p50 and max per target");
        let names: Vec<&str> = p.panels[3].series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["program swap", "program read"]);
        assert!(p.to_svg().starts_with("<svg"));
    }
}
