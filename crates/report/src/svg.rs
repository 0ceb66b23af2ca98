//! Minimal SVG line plots: panels side by side sharing the x axis meaning.

use std::fmt::Write;

const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];
const PANEL_W: f64 = 420.0;
const PANEL_H: f64 = 300.0;
const MARGIN_L: f64 = 64.0;
const MARGIN_R: f64 = 16.0;
const MARGIN_T: f64 = 48.0;
const MARGIN_B: f64 = 48.0;

/// One line: points (x, y) in data coordinates.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// One chart.
#[derive(Debug, Clone)]
pub struct Panel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    /// Force the y axis to start at zero.
    pub y_from_zero: bool,
}

/// Several panels in a row, with a title.
#[derive(Debug, Clone)]
pub struct Plot {
    pub title: String,
    pub panels: Vec<Panel>,
}

fn nice_max(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let mag = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * mag >= v {
            return m * mag;
        }
    }
    10.0 * mag
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn fmt_tick(v: f64) -> String {
    if v.abs() >= 1000.0 || v == v.trunc() {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

impl Plot {
    /// The agentic report's plot: steps/min and prefix-cache hit rate against
    /// concurrent programs, one line per target or policy in each panel.
    pub fn steps_and_hit_rate(title: String, steps: Vec<Series>, hit: Vec<Series>) -> Plot {
        let panel = |title: &str, y_label: &str, series| Panel {
            title: title.into(),
            x_label: "concurrent programs".into(),
            y_label: y_label.into(),
            series,
            y_from_zero: true,
        };
        Plot {
            title,
            panels: vec![
                panel("Throughput", "steps / min", steps),
                panel("Prefix-cache hit rate", "hit rate", hit),
            ],
        }
    }

    /// Renders the plot as a standalone SVG document.
    pub fn to_svg(&self) -> String {
        let w = PANEL_W * self.panels.len().max(1) as f64;
        let h = PANEL_H + 60.0;
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="20" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
            w / 2.0,
            esc(&self.title)
        );
        for (i, p) in self.panels.iter().enumerate() {
            p.render(&mut s, i as f64 * PANEL_W);
        }
        s.push_str("</svg>\n");
        s
    }
}

/// Where a panel's plot area lies and the data range it shows.
struct Frame {
    pl: f64,
    pt: f64,
    pw: f64,
    ph: f64,
    xmin: f64,
    xmax: f64,
    ymin: f64,
    ymax: f64,
}

impl Frame {
    fn sx(&self, x: f64) -> f64 {
        self.pl + (x - self.xmin) / (self.xmax - self.xmin) * self.pw
    }

    fn sy(&self, y: f64) -> f64 {
        self.pt + self.ph - (y - self.ymin) / (self.ymax - self.ymin) * self.ph
    }
}

impl Panel {
    fn render(&self, s: &mut String, x0: f64) {
        let f = self.frame(x0);
        self.axes(s, &f, x0);
        self.lines(s, &f);
    }

    /// The data range over every series (a unit square when empty; y from
    /// zero unless asked otherwise and negative), placed in the panel at `x0`.
    fn frame(&self, x0: f64) -> Frame {
        let pts = self.series.iter().flat_map(|se| se.points.iter());
        let (mut xmin, mut xmax, mut ymin, mut ymax) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for &(x, y) in pts {
            xmin = xmin.min(x);
            xmax = xmax.max(x);
            ymin = ymin.min(y);
            ymax = ymax.max(y);
        }
        if xmin > xmax {
            (xmin, xmax, ymin, ymax) = (0.0, 1.0, 0.0, 1.0);
        }
        if xmax == xmin {
            xmax = xmin + 1.0;
        }
        if self.y_from_zero || ymin >= 0.0 {
            ymin = 0.0;
        }
        let ymax = nice_max(ymax.max(ymin + 1e-9));
        Frame {
            pl: x0 + MARGIN_L,
            pt: MARGIN_T,
            pw: PANEL_W - MARGIN_L - MARGIN_R,
            ph: PANEL_H - MARGIN_T - MARGIN_B + 40.0,
            xmin,
            xmax,
            ymin,
            ymax,
        }
    }

    /// Title, box, y grid with ticks, x ticks at every data x, axis labels.
    fn axes(&self, s: &mut String, f: &Frame, x0: f64) {
        let (pl, pt, pw, ph) = (f.pl, f.pt, f.pw, f.ph);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle" font-size="13">{}</text>"#,
            pl + pw / 2.0,
            pt - 14.0,
            esc(&self.title)
        );
        let _ = writeln!(
            s,
            r##"<rect x="{pl}" y="{pt}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>"##
        );
        for k in 0..=4 {
            let v = f.ymin + (f.ymax - f.ymin) * k as f64 / 4.0;
            let y = f.sy(v);
            let _ = writeln!(
                s,
                r##"<line x1="{pl}" y1="{y}" x2="{}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
                pl + pw,
                pl - 4.0,
                y + 4.0,
                fmt_tick(v)
            );
        }
        let mut xs: Vec<f64> = self
            .series
            .iter()
            .flat_map(|se| se.points.iter().map(|p| p.0))
            .collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        for x in xs {
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
                f.sx(x),
                pt + ph + 16.0,
                fmt_tick(x)
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            pl + pw / 2.0,
            pt + ph + 34.0,
            esc(&self.x_label)
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle" transform="rotate(-90 {} {})">{}</text>"#,
            x0 + 14.0,
            pt + ph / 2.0,
            x0 + 14.0,
            pt + ph / 2.0,
            esc(&self.y_label)
        );
    }

    /// Each series as a line with its points, and its legend entry.
    fn lines(&self, s: &mut String, f: &Frame) {
        for (i, se) in self.series.iter().enumerate() {
            let c = COLORS[i % COLORS.len()];
            let path: Vec<String> = se
                .points
                .iter()
                .map(|&(x, y)| format!("{:.1},{:.1}", f.sx(x), f.sy(y)))
                .collect();
            let _ = writeln!(
                s,
                r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
                path.join(" ")
            );
            for &(x, y) in &se.points {
                let _ = writeln!(
                    s,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}"/>"#,
                    f.sx(x),
                    f.sy(y)
                );
            }
            let ly = f.pt + 14.0 + 16.0 * i as f64;
            let _ = writeln!(
                s,
                r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{c}" stroke-width="2"/><text x="{}" y="{}">{}</text>"#,
                f.pl + 8.0,
                f.pl + 28.0,
                f.pl + 32.0,
                ly + 4.0,
                esc(&se.name)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_series_and_escapes_text() {
        let plot = Plot {
            title: "a < b".into(),
            panels: vec![Panel {
                title: "steps/min".into(),
                x_label: "concurrency".into(),
                y_label: "steps/min".into(),
                series: vec![
                    Series {
                        name: "program".into(),
                        points: vec![(24.0, 100.0), (96.0, 180.0)],
                    },
                    Series {
                        name: "request".into(),
                        points: vec![(24.0, 100.0), (96.0, 40.0)],
                    },
                ],
                y_from_zero: true,
            }],
        };
        let svg = plot.to_svg();
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 4);
        assert!(svg.contains("a &lt; b"));
        assert!(svg.contains(">program<") && svg.contains(">request<"));
    }
}
