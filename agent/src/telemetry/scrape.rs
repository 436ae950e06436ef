//! Reading the Prometheus text format back (for `floe top`, the progress line and tests),
//! with the `prometheus-parse` crate.

use std::collections::BTreeMap;

pub use prometheus_parse::Sample;

/// A parsed scrape: its samples and the type each family declares.
#[derive(Debug)]
pub struct Exposition {
    types: BTreeMap<String, String>,
    untyped: BTreeMap<String, ()>,
    scrape: prometheus_parse::Scrape,
}

impl Exposition {
    /// Parses Prometheus text (version 0.0.4).
    pub fn parse(text: &str) -> std::io::Result<Exposition> {
        let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))?;
        let mut types = BTreeMap::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("# TYPE ") else {
                continue;
            };
            let mut words = rest.split_whitespace();
            if let (Some(name), Some(kind)) = (words.next(), words.next()) {
                types.insert(name.to_string(), kind.to_string());
            }
        }
        let mut untyped = BTreeMap::new();
        for s in &scrape.samples {
            let declared = types.contains_key(&s.metric)
                || ["_sum", "_count", "_bucket"].iter().any(|suffix| {
                    s.metric
                        .strip_suffix(suffix)
                        .is_some_and(|base| types.contains_key(base))
                });
            if !declared {
                untyped.insert(s.metric.clone(), ());
            }
        }
        Ok(Exposition {
            types,
            untyped,
            scrape,
        })
    }

    /// Every metric family: its name and declared type (`None` when no `# TYPE` line).
    pub fn families(&self) -> impl Iterator<Item = (&str, Option<&str>)> {
        self.types
            .iter()
            .map(|(n, k)| (n.as_str(), Some(k.as_str())))
            .chain(self.untyped.keys().map(|n| (n.as_str(), None)))
    }

    /// Every sample (histogram `_sum` and `_count` series are separate untyped samples).
    pub fn samples(&self) -> &[Sample] {
        &self.scrape.samples
    }

    /// Samples of `metric` (exact series name, e.g. `floe_plugin_batch_seconds_sum`) with
    /// their numeric value; histogram bucket sets are skipped.
    pub fn series<'a>(&'a self, metric: &'a str) -> impl Iterator<Item = (&'a Sample, f64)> + 'a {
        self.scrape
            .samples
            .iter()
            .filter(move |s| s.metric == metric)
            .filter_map(|s| value(s).map(|v| (s, v)))
    }

    /// Sum of `metric` over the samples whose labels include every `(name, value)` given.
    pub fn sum(&self, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut found = None;
        for (s, v) in self.series(metric) {
            if labels
                .iter()
                .all(|(k, want)| s.labels.get(k) == Some(*want))
            {
                *found.get_or_insert(0.0) += v;
            }
        }
        found
    }
}

/// The number a counter, gauge or untyped sample holds.
pub fn value(sample: &Sample) -> Option<f64> {
    match sample.value {
        prometheus_parse::Value::Counter(v)
        | prometheus_parse::Value::Gauge(v)
        | prometheus_parse::Value::Untyped(v) => Some(v),
        prometheus_parse::Value::Histogram(_) | prometheus_parse::Value::Summary(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP floe_records_in_total Records read from Kafka.\n\
# TYPE floe_records_in_total counter\n\
floe_records_in_total{pipeline=\"a\"} 10\n\
floe_records_in_total{pipeline=\"b\"} 5\n\
# TYPE floe_consumer_lag gauge\n\
floe_consumer_lag{pipeline=\"a\",topic=\"t\",partition=\"0\"} 3\n\
floe_consumer_lag{pipeline=\"a\",topic=\"t\",partition=\"1\"} 4\n\
# TYPE floe_plugin_batch_seconds histogram\n\
floe_plugin_batch_seconds_bucket{pipeline=\"a\",plugin=\"f\",le=\"0.1\"} 2\n\
floe_plugin_batch_seconds_bucket{pipeline=\"a\",plugin=\"f\",le=\"+Inf\"} 2\n\
floe_plugin_batch_seconds_sum{pipeline=\"a\",plugin=\"f\"} 0.25\n\
floe_plugin_batch_seconds_count{pipeline=\"a\",plugin=\"f\"} 2\n\
other_thing 1\n";

    #[test]
    fn families_and_sums() {
        let e = Exposition::parse(TEXT).expect("parses");
        let families: Vec<_> = e.families().collect();
        assert_eq!(
            families,
            vec![
                ("floe_consumer_lag", Some("gauge")),
                ("floe_plugin_batch_seconds", Some("histogram")),
                ("floe_records_in_total", Some("counter")),
                ("other_thing", None),
            ]
        );
        assert_eq!(e.sum("floe_records_in_total", &[]), Some(15.0));
        assert_eq!(
            e.sum("floe_records_in_total", &[("pipeline", "b")]),
            Some(5.0)
        );
        assert_eq!(e.sum("floe_consumer_lag", &[("pipeline", "a")]), Some(7.0));
        assert_eq!(
            e.sum("floe_plugin_batch_seconds_sum", &[("plugin", "f")]),
            Some(0.25)
        );
        assert_eq!(e.sum("floe_fences_total", &[]), None);
    }
}
