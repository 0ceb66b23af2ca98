//! The sweep's report: a table with each target's ratio to the first, and
//! an SVG plot of steps/min and hit rate against concurrency.

use agentd_report::{Plot, Series, Table};

use crate::result::LevelRow;

fn targets(rows: &[LevelRow]) -> Vec<String> {
    let mut t: Vec<String> = Vec::new();
    for r in rows {
        if !t.contains(&r.target) {
            t.push(r.target.clone());
        }
    }
    t
}

/// Ratio of `r`'s steps/min to the first target's at the same concurrency.
pub fn ratio_to_first(rows: &[LevelRow], r: &LevelRow) -> Option<f64> {
    let first = targets(rows).into_iter().next()?;
    let base = rows
        .iter()
        .find(|b| b.target == first && b.concurrency == r.concurrency)?;
    (base.steps_per_min > 0.0).then(|| r.steps_per_min / base.steps_per_min)
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.prec$}"))
}

pub fn table(rows: &[LevelRow]) -> Table {
    let first = targets(rows).into_iter().next().unwrap_or_default();
    let mut t = Table::new([
        "target".to_string(),
        "conc".into(),
        "steps/min".into(),
        format!("x {first}"),
        "hit".into(),
        "ideal".into(),
        "hit/ideal".into(),
        "out tok/s".into(),
        "p50 s".into(),
        "p90 s".into(),
        "p99 s".into(),
        "p99+open s".into(),
        "open (oldest s)".into(),
        "ttft p50".into(),
        "preempt".into(),
        "recomputed".into(),
        "errors".into(),
    ]);
    for r in rows {
        t.row([
            r.target.clone(),
            r.concurrency.to_string(),
            format!("{:.1}", r.steps_per_min),
            opt(ratio_to_first(rows, r), 2),
            format!("{:.3}", r.prefix_hit_rate),
            format!("{:.3}", r.ideal_hit_rate),
            opt(
                (r.ideal_hit_rate > 0.0).then(|| r.prefix_hit_rate / r.ideal_hit_rate),
                2,
            ),
            format!("{:.1}", r.output_tok_s),
            format!("{:.2}", r.p50_step_s),
            format!("{:.2}", r.p90_step_s),
            format!("{:.2}", r.p99_step_s),
            format!("{:.2}", r.p99_with_open_s),
            match r.oldest_open_s {
                Some(o) => format!("{} ({o:.1})", r.open_steps),
                None => "0".into(),
            },
            opt(r.ttft_p50_s, 2),
            opt(r.preemptions, 0),
            opt(r.recomputed_tokens, 0),
            format!("{}{}", r.errors, if r.aborted { " (stopped)" } else { "" }),
        ]);
    }
    t
}

/// Steps/min of every later target against every earlier one, per
/// concurrency ("b/a" = b's steps/min over a's): e.g. agentd/vLLM and
/// program/request side by side.
pub fn pair_ratios(rows: &[LevelRow]) -> Table {
    let names = targets(rows);
    let mut pairs = Vec::new();
    for (j, b) in names.iter().enumerate() {
        for a in &names[..j] {
            pairs.push((b.clone(), a.clone()));
        }
    }
    let mut header = vec!["conc".to_string()];
    header.extend(pairs.iter().map(|(b, a)| format!("{b}/{a}")));
    let mut t = Table::new(header);
    let mut levels: Vec<usize> = rows.iter().map(|r| r.concurrency).collect();
    levels.sort_unstable();
    levels.dedup();
    let spm = |name: &str, c: usize| {
        rows.iter()
            .find(|r| r.target == name && r.concurrency == c)
            .map(|r| r.steps_per_min)
    };
    for c in levels {
        let mut cells = vec![c.to_string()];
        for (b, a) in &pairs {
            cells.push(match (spm(b, c), spm(a, c)) {
                (Some(x), Some(y)) if y > 0.0 => format!("{:.2}", x / y),
                _ => "-".into(),
            });
        }
        t.row(cells);
    }
    t
}

/// The main table, then the pairwise ratios, as GitHub markdown.
pub fn markdown(rows: &[LevelRow]) -> String {
    let mut out = table_markdown(&table(rows));
    if targets(rows).len() > 1 {
        out.push_str("\nSteps/min ratios between targets:\n\n");
        out.push_str(&table_markdown(&pair_ratios(rows)));
    }
    out
}

fn table_markdown(t: &Table) -> String {
    let text = t.render();
    let mut out = String::new();
    for (i, line) in text.lines().enumerate() {
        if i == 1 {
            let n = text.lines().next().map_or(0, |h| split_cells(h).len());
            out.push_str(&format!("|{}\n", "---:|".repeat(n)));
            continue;
        }
        let cells: Vec<&str> = split_cells(line);
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    out
}

/// Cells of a rendered table line (columns are separated by two spaces or
/// more; a cell such as "3 (stopped)" keeps its single space).
fn split_cells(line: &str) -> Vec<&str> {
    line.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

pub fn plot(rows: &[LevelRow], title: &str) -> Plot {
    let series = |f: fn(&LevelRow) -> f64| -> Vec<Series> {
        targets(rows)
            .into_iter()
            .map(|t| Series {
                points: rows
                    .iter()
                    .filter(|r| r.target == t)
                    .map(|r| (r.concurrency as f64, f(r)))
                    .collect(),
                name: t,
            })
            .collect()
    };
    Plot::steps_and_hit_rate(
        title.to_string(),
        series(|r| r.steps_per_min),
        series(|r| r.prefix_hit_rate),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(t: &str, c: usize, spm: f64) -> LevelRow {
        let mut r = LevelRow::failed(t, c, String::new());
        r.steps_per_min = spm;
        r.errors = 0;
        r.aborted = false;
        r
    }

    #[test]
    fn ratios_against_the_first_target() {
        let rows = vec![
            row("a", 4, 10.0),
            row("b", 4, 25.0),
            row("a", 8, 0.0),
            row("b", 8, 5.0),
        ];
        assert_eq!(ratio_to_first(&rows, &rows[1]), Some(2.5));
        assert_eq!(ratio_to_first(&rows, &rows[3]), None);
        let t = table(&rows).render();
        assert!(t.contains("x a"));
        let md = table_markdown(&table(&rows));
        assert_eq!(md.lines().count(), 6);
        let pr = pair_ratios(&rows).render();
        assert!(pr.contains("b/a"), "{pr}");
        assert!(pr.lines().nth(2).unwrap().ends_with("2.50"), "{pr}");
        assert!(pr.lines().nth(3).unwrap().ends_with("-"), "{pr}");
        assert!(markdown(&rows).contains("| conc | b/a |"));
        assert!(md.lines().nth(1).unwrap().starts_with("|---:|"));
        let svg = plot(&rows, "t").to_svg();
        assert!(svg.contains("<svg") && svg.contains("steps / min"));
    }
}
