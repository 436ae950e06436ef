//! The `floe top` screen (ratatui): a header, a table of pipelines, a table of plugins
//! and the agent's readiness. The same drawing renders to text for `--once`.

use std::time::Duration;

use ratatui::Frame;
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Row, Table};

use super::{Stats, age, bytes, count};

/// What one screen shows.
pub struct Screen<'a> {
    /// The metrics URL read.
    pub source: &'a str,
    /// Figures.
    pub stats: &'a Stats,
    /// Body of `/readyz`, when the endpoint answered (first line `ready` or `not ready`).
    pub readiness: Option<&'a str>,
    /// Time between the two scrapes rates are computed from.
    pub refresh: Duration,
    /// The last scrape's error, if it failed (the figures are then the previous ones).
    pub error: Option<&'a str>,
    /// Interactive view (shows the key help).
    pub live: bool,
}

const PIPELINE_HEADER: [&str; 15] = [
    "PIPELINE",
    "IN/S",
    "OUT/S",
    "LAG",
    "PARTS",
    "WAITING",
    "NEXT COMMIT",
    "LAST COMMIT",
    "COMMITS",
    "FILES",
    "BYTES",
    "DEAD LTR",
    "FENCES",
    "RETRIES",
    "REBAL",
];
const PLUGIN_HEADER: [&str; 8] = [
    "PIPELINE", "PLUGIN", "IN/S", "OUT/S", "BUSY", "US/REC", "ERRORS", "FAULTS",
];

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "-".to_string(), f)
}

fn pipeline_rows(stats: &Stats) -> Vec<Vec<String>> {
    stats
        .pipelines
        .iter()
        .map(|p| {
            vec![
                p.name.clone(),
                opt(p.in_per_sec, count),
                opt(p.out_per_sec, count),
                opt(p.lag, count),
                opt(p.partitions, count),
                opt(p.waiting, count),
                opt(p.next_commit, |s| format!("in {}", age(s))),
                if p.committed_once {
                    opt(p.since_commit, |s| format!("{} ago", age(s)))
                } else {
                    "never".to_string()
                },
                count(p.commits),
                count(p.files),
                bytes(p.bytes),
                count(p.dead_letters),
                count(p.fences),
                count(p.retries),
                count(p.rebalances),
            ]
        })
        .collect()
}

fn plugin_rows(stats: &Stats) -> Vec<Vec<String>> {
    stats
        .plugins
        .iter()
        .map(|p| {
            vec![
                p.pipeline.clone(),
                p.plugin.clone(),
                opt(p.in_per_sec, count),
                opt(p.out_per_sec, count),
                opt(p.busy, |b| format!("{:.0}%", b * 100.0)),
                opt(p.us_per_record, |u| format!("{u:.1}")),
                count(p.errors),
                count(p.faults),
            ]
        })
        .collect()
}

/// Column widths: the widest cell of each column.
fn widths<const N: usize>(header: &[&str; N], rows: &[Vec<String>]) -> Vec<Constraint> {
    (0..N)
        .map(|i| {
            let w = rows
                .iter()
                .map(|r| r[i].chars().count())
                .chain(std::iter::once(header[i].len()))
                .max()
                .unwrap_or(0);
            Constraint::Length(w as u16)
        })
        .collect()
}

fn table<'a, const N: usize>(
    title: &'a str,
    header: &[&'a str; N],
    rows: &[Vec<String>],
) -> Table<'a> {
    let widths = widths(header, rows);
    let header = Row::new(header.iter().map(|h| h.to_string()))
        .style(Style::new().add_modifier(Modifier::BOLD));
    let rows: Vec<Row> = rows.iter().map(|r| Row::new(r.clone())).collect();
    Table::new(rows, widths)
        .header(header)
        .column_spacing(2)
        .block(Block::bordered().title(format!(" {title} ")))
}

fn readiness_lines(screen: &Screen<'_>) -> Vec<String> {
    match screen.readiness {
        Some(body) => body.lines().skip(1).map(str::to_string).collect(),
        None => vec!["(no /readyz endpoint answered)".to_string()],
    }
}

fn header(screen: &Screen<'_>) -> Line<'static> {
    let mut spans = vec![
        Span::from("floe top").bold(),
        Span::from(format!(
            "  {}  every {}  ",
            screen.source,
            humantime::format_duration(screen.refresh)
        )),
    ];
    match screen.readiness.and_then(|b| b.lines().next()) {
        Some("ready") => spans.push(Span::from("READY").green().bold()),
        Some(other) => spans.push(Span::from(other.to_uppercase()).red().bold()),
        None => {}
    }
    if let Some(e) = screen.error {
        spans.push(Span::from(format!("  scrape failed: {e}")).red());
    }
    if screen.live {
        spans.push(Span::from("  (q quits)").dim());
    }
    Line::from(spans)
}

fn table_width(widths: &[Constraint]) -> usize {
    let cells: usize = widths
        .iter()
        .map(|c| match c {
            Constraint::Length(n) => *n as usize,
            _ => 0,
        })
        .sum();
    cells + 2 * widths.len().saturating_sub(1) + 2
}

/// Columns the screen needs to show everything without padding.
pub fn natural_width(screen: &Screen<'_>) -> u16 {
    let pipelines = pipeline_rows(screen.stats);
    let plugins = plugin_rows(screen.stats);
    let mut width = header(screen).width();
    width = width.max(table_width(&widths(&PIPELINE_HEADER, &pipelines)));
    if !plugins.is_empty() {
        width = width.max(table_width(&widths(&PLUGIN_HEADER, &plugins)));
    }
    for line in readiness_lines(screen) {
        width = width.max(line.chars().count() + 2);
    }
    width.max(" readiness (/readyz) ".len() + 2) as u16
}

/// Rows the screen needs.
pub fn height(screen: &Screen<'_>) -> u16 {
    let pipelines = screen.stats.pipelines.len().max(1) as u16 + 3;
    let plugins = if screen.stats.plugins.is_empty() {
        0
    } else {
        screen.stats.plugins.len() as u16 + 3
    };
    1 + pipelines + plugins + readiness_lines(screen).len() as u16 + 2
}

/// Draws the screen into `frame`.
pub fn draw(frame: &mut Frame<'_>, screen: &Screen<'_>) {
    let pipelines = pipeline_rows(screen.stats);
    let plugins = plugin_rows(screen.stats);
    let ready = readiness_lines(screen);
    let plugin_height = if plugins.is_empty() {
        0
    } else {
        plugins.len() as u16 + 3
    };
    let [top, p_area, g_area, r_area] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(pipelines.len().max(1) as u16 + 3),
        Constraint::Length(plugin_height),
        Constraint::Length(ready.len() as u16 + 2),
    ])
    .areas(frame.area());
    frame.render_widget(Paragraph::new(header(screen)), top);
    if pipelines.is_empty() {
        frame.render_widget(
            Paragraph::new("no pipeline has reported yet")
                .block(Block::bordered().title(" pipelines ")),
            p_area,
        );
    } else {
        frame.render_widget(table("pipelines", &PIPELINE_HEADER, &pipelines), p_area);
    }
    if !plugins.is_empty() {
        frame.render_widget(table("plugins", &PLUGIN_HEADER, &plugins), g_area);
    }
    let lines: Vec<Line> = ready.into_iter().map(Line::from).collect();
    frame.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(" readiness (/readyz) ")),
        r_area,
    );
}

/// The screen as plain text, `width` columns wide (trailing spaces trimmed).
pub fn render_text(screen: &Screen<'_>, width: u16) -> String {
    let area = Rect::new(0, 0, width, height(screen));
    let mut terminal = Terminal::new(TestBackend::new(area.width, area.height))
        .expect("a test backend never fails");
    terminal
        .draw(|f| draw(f, screen))
        .expect("a test backend never fails");
    let buffer = terminal.backend().buffer();
    let mut out = String::new();
    for y in 0..area.height {
        let mut line = String::new();
        for x in 0..area.width {
            line.push_str(buffer[(x, y)].symbol());
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::top::{PipelineStats, PluginStats};

    #[test]
    fn text_rendering_shows_every_figure() {
        let stats = Stats {
            pipelines: vec![PipelineStats {
                name: "events".into(),
                in_per_sec: Some(1234.0),
                out_per_sec: Some(1200.0),
                lag: Some(42.0),
                partitions: Some(4.0),
                since_commit: Some(3.2),
                waiting: Some(900.0),
                next_commit: Some(27.0),
                committed_once: true,
                commits: 12.0,
                rows_out: 5000.0,
                files: 12.0,
                bytes: 3.0 * 1024.0 * 1024.0,
                dead_letters: 2.0,
                fences: 0.0,
                retries: 1.0,
                rebalances: 1.0,
            }],
            plugins: vec![PluginStats {
                pipeline: "events".into(),
                plugin: "redact".into(),
                in_per_sec: Some(1234.0),
                out_per_sec: Some(1234.0),
                busy: Some(0.05),
                us_per_record: Some(40.5),
                errors: 0.0,
                faults: 0.0,
            }],
        };
        let screen = Screen {
            source: "http://127.0.0.1:9464/metrics",
            stats: &stats,
            readiness: Some("ready\nevents: ok (4 partitions, up to date 3s ago)\n"),
            refresh: Duration::from_secs(1),
            error: None,
            live: false,
        };
        let text = render_text(&screen, 160);
        for needle in [
            "floe top  http://127.0.0.1:9464/metrics  every 1s  READY",
            "PIPELINE",
            "events",
            "1234",
            "3s ago",
            "WAITING",
            "900",
            "in 27s",
            "3.0 MiB",
            "redact",
            "5%",
            "40.5",
            "events: ok (4 partitions, up to date 3s ago)",
        ] {
            assert!(text.contains(needle), "{needle:?} missing in:\n{text}");
        }
        assert_eq!(text.lines().count() as u16, height(&screen));
    }
}
