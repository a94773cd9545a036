//! PNG plots for `quire bench` and `quire bench-attn` (plotters, bitmap
//! backend, DejaVu Sans embedded so no system font is needed).

use anyhow::{anyhow, ensure, Context, Result};
use plotters::prelude::*;
use std::path::Path;
use std::sync::Once;

/// One line of a panel: a label and its (x, y) points, x ascending.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// One chart: x on a log2 axis (batch sizes, context lengths), y linear
/// from 0.
pub struct Panel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
}

const FONT: &str = "dejavu-sans";

fn register_font() -> Result<()> {
    static ONCE: Once = Once::new();
    let mut res = Ok(());
    ONCE.call_once(|| {
        res = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
            .map_err(|_| anyhow!("the embedded DejaVu Sans font did not parse"));
    });
    res
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// A log axis's tick label: 1, 2 and 5 times a power of ten are written,
/// the ticks between them left bare (3,000 to 9,000 crowd each other).
fn log_tick_label(x: f64) -> String {
    let v = x.round();
    if v < 1.0 {
        return format!("{x}");
    }
    let p = 10f64.powf(v.log10().floor());
    let lead = (v / p).round() as i64;
    if matches!(lead, 1 | 2 | 5) && (lead as f64 * p - v).abs() < 0.5 {
        format!("{}", v as i64)
    } else {
        String::new()
    }
}

/// Writes the panels side by side into one PNG at `path`. Panels without
/// points are left out; at least one must have some.
pub fn write_png(path: &Path, title: &str, panels: &[Panel]) -> Result<()> {
    let panels: Vec<&Panel> = panels
        .iter()
        .filter(|p| p.series.iter().any(|s| !s.points.is_empty()))
        .collect();
    ensure!(
        !panels.is_empty(),
        "plot {}: no results to plot (run tests with more than one batch size or context length)",
        path.display()
    );
    for p in &panels {
        for s in &p.series {
            ensure!(
                s.points
                    .iter()
                    .all(|&(x, y)| x > 0.0 && x.is_finite() && y.is_finite()),
                "plot {}: series '{}' has a point with x <= 0 or a non-finite value",
                path.display(),
                s.label
            );
        }
    }
    register_font()?;
    let w = 640 * panels.len() as u32;
    let root = BitMapBackend::new(path, (w, 520)).into_drawing_area();
    let draw = |e: &dyn std::fmt::Display| anyhow!("plot {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| draw(&e))?;
    // The title shrinks to fit the image (DejaVu Sans: about 0.58 em per
    // character on average).
    let title_px = (f64::from(w - 24) / (0.58 * title.chars().count().max(1) as f64)).min(22.0);
    let root = root
        .titled(title, (FONT, title_px.max(10.0)))
        .map_err(|e| draw(&e))?;
    let areas = root.split_evenly((1, panels.len()));
    for (p, area) in panels.iter().zip(&areas) {
        let pts = p.series.iter().flat_map(|s| s.points.iter());
        let (x0, x1, y1) = pts.fold((f64::MAX, f64::MIN, 0f64), |(a, b, c), &(x, y)| {
            (a.min(x), b.max(x), c.max(y))
        });
        // Half a doubling of margin on each side of the log axis.
        let (x0, x1) = (x0 / 1.4, x1 * 1.4);
        let mut chart = ChartBuilder::on(area)
            .caption(&p.title, (FONT, 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d((x0..x1).log_scale(), 0f64..(y1 * 1.12).max(1e-9))
            .map_err(|e| draw(&e))?;
        chart
            .configure_mesh()
            .x_desc(p.x_label.as_str())
            .y_desc(p.y_label.as_str())
            .label_style((FONT, 13))
            .light_line_style(RGBColor(238, 238, 238))
            .x_label_formatter(&|x| log_tick_label(*x))
            .draw()
            .map_err(|e| draw(&e))?;
        for (i, s) in p.series.iter().enumerate() {
            let c = COLORS[i % COLORS.len()];
            chart
                .draw_series(LineSeries::new(s.points.iter().copied(), c.stroke_width(2)))
                .map_err(|e| draw(&e))?
                .label(s.label.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2))
                });
            chart
                .draw_series(s.points.iter().map(|&p| Circle::new(p, 4, c.filled())))
                .map_err(|e| draw(&e))?;
        }
        chart
            .configure_series_labels()
            .label_font((FONT, 13))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()
            .map_err(|e| draw(&e))?;
    }
    root.present()
        .with_context(|| format!("writing the plot {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_png_with_two_panels() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.png");
        let s = |l: &str, k: f64| Series {
            label: l.into(),
            points: [1.0f64, 8.0, 32.0, 64.0]
                .iter()
                .map(|&x| (x, k * x.sqrt()))
                .collect(),
        };
        write_png(
            &path,
            "test",
            &[
                Panel {
                    title: "batch".into(),
                    x_label: "sequences".into(),
                    y_label: "tok/s".into(),
                    series: vec![s("a", 1.0), s("b", 2.0)],
                },
                Panel {
                    title: "empty".into(),
                    x_label: "x".into(),
                    y_label: "y".into(),
                    series: vec![],
                },
            ],
        )
        .unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
        // IHDR width: one panel drawn (the empty one is left out).
        assert_eq!(u32::from_be_bytes(bytes[16..20].try_into().unwrap()), 640);
        assert!(
            bytes.len() > 4000,
            "suspiciously small PNG: {} bytes",
            bytes.len()
        );
    }

    #[test]
    fn log_ticks_label_one_two_five() {
        assert_eq!(log_tick_label(1000.0), "1000");
        assert_eq!(log_tick_label(2000.0), "2000");
        assert_eq!(log_tick_label(5000.0), "5000");
        assert_eq!(log_tick_label(10000.0), "10000");
        assert_eq!(log_tick_label(8.0), "");
        assert_eq!(log_tick_label(3000.0), "");
        assert_eq!(log_tick_label(7000.0), "");
        assert_eq!(log_tick_label(2500.0), "");
        assert_eq!(log_tick_label(50.0), "50");
    }

    #[test]
    fn refuses_nothing_to_plot_and_bad_points() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.png");
        let e = write_png(&path, "t", &[]).unwrap_err();
        assert!(format!("{e}").contains("no results"), "{e}");
        let bad = Panel {
            title: "t".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            series: vec![Series {
                label: "s".into(),
                points: vec![(0.0, 1.0)],
            }],
        };
        let e = write_png(&path, "t", &[bad]).unwrap_err();
        assert!(format!("{e}").contains("x <= 0"), "{e}");
        assert!(!path.exists());
    }
}
