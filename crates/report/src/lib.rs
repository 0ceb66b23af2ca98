//! Reports for benchmarks and simulations: aligned text tables and SVG line
//! plots (one panel per metric, one line per series). Self-contained SVG, no
//! dependencies, so every report can ship its plot.

mod svg;
mod table;

pub use svg::{Panel, Plot, Series};
pub use table::Table;
