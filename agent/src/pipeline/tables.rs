//! The pipeline's tables and which partitions' offsets each one stores.
//!
//! Most pipelines write a fixed set of tables (the default table and one per plugin
//! stream), and every table stores the offsets of every partition: a plugin may route
//! any record anywhere. With a table per topic (`{topic}` in `table`) a table stores
//! only the offsets of its topic's partitions, so a quiet topic's table is never
//! touched, and tables are added while running as topics appear (a `topic_pattern`
//! subscription finds new topics at the brokers' metadata refresh).
//!
//! Table indexes never change once given: the intake, the committer and the position
//! lookup (on the source's thread) all name tables by index.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Mutex;

use crate::config::PipelineConfig;
use crate::record::TopicPartition;

/// The pipeline's tables, shared by its threads.
pub(super) struct TableMap {
    /// `table` with `{topic}` in it, for a table per topic.
    template: Option<crate::sink::SinkConfig>,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    names: Vec<String>,
    /// With a table per topic: each topic seen so far and its table.
    topics: HashMap<String, usize>,
}

impl TableMap {
    /// The tables known at start: the default table then one per stream, or one per
    /// listed topic.
    pub(super) fn new(config: &PipelineConfig) -> TableMap {
        let mut map = TableMap {
            template: None,
            inner: Mutex::default(),
        };
        if config.sink.table_per_topic() {
            map.template = Some(config.sink.clone());
            for topic in &config.source.topics {
                map.register(topic);
            }
        } else {
            let inner = map.inner.get_mut().expect("tables");
            inner.names.push(config.sink.table.clone());
            inner.names.extend(config.sink.streams.values().cloned());
        }
        map
    }

    /// Whether each topic has its own table.
    pub(super) fn per_topic(&self) -> bool {
        self.template.is_some()
    }

    /// How many tables there are so far.
    pub(super) fn len(&self) -> usize {
        self.inner.lock().expect("tables").names.len()
    }

    /// The name of table `i`.
    pub(super) fn name(&self, i: usize) -> String {
        self.inner.lock().expect("tables").names[i].clone()
    }

    /// Every table name, in index order.
    pub(super) fn names(&self) -> Vec<String> {
        self.inner.lock().expect("tables").names.clone()
    }

    /// The tables that store `tp`'s offsets: every table, or its topic's (which is added
    /// if the topic is new).
    pub(super) fn covering(&self, tp: &TopicPartition) -> Range<usize> {
        if self.template.is_none() {
            return 0..self.len();
        }
        let i = self.register(&tp.0);
        i..i + 1
    }

    /// The table of `topic`, added if the topic is new. Topics whose names differ only
    /// in characters a table name cannot hold share a table.
    fn register(&self, topic: &str) -> usize {
        let template = self.template.as_ref().expect("a table per topic");
        let mut inner = self.inner.lock().expect("tables");
        if let Some(&i) = inner.topics.get(topic) {
            return i;
        }
        let name = template.table_for_topic(topic);
        let i = match inner.names.iter().position(|n| *n == name) {
            Some(i) => {
                tracing::warn!(%topic, table = %name, "this topic shares its table with another topic whose name maps to the same table name");
                i
            }
            None => {
                inner.names.push(name);
                inner.names.len() - 1
            }
        };
        inner.topics.insert(topic.to_string(), i);
        i
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(table: &str, topics: &[&str], pattern: Option<&str>) -> PipelineConfig {
        let subscription = match pattern {
            Some(p) => format!("topic_pattern = {p:?}"),
            None => format!("topics = {topics:?}"),
        };
        let toml = format!(
            "[catalogs.local]\ntype = \"embedded\"\npath = \"c.db\"\nwarehouse = \"w\"\n\
             [[pipelines]]\nname = \"p\"\n[pipelines.source]\nbootstrap_servers = \"b:9092\"\n\
             group_id = \"g\"\n{subscription}\n[pipelines.sink]\ncatalog = \"local\"\n\
             namespace = \"n\"\ntable = {table:?}\n"
        );
        let mut c = crate::config::Config::parse(&toml, &|_| None).expect("config");
        c.pipelines.remove(0)
    }

    fn tp(topic: &str) -> TopicPartition {
        (topic.into(), 0)
    }

    #[test]
    fn shared_tables_cover_every_partition() {
        let mut c = config("events", &["a", "b"], None);
        c.sink
            .streams
            .insert("errors".into(), "events_errors".into());
        let map = TableMap::new(&c);
        assert!(!map.per_topic());
        assert_eq!(map.names(), ["events", "events_errors"]);
        assert_eq!(map.covering(&tp("a")), 0..2);
        assert_eq!(map.covering(&tp("zzz")), 0..2);
    }

    #[test]
    fn a_table_per_topic_grows_as_topics_appear() {
        let map = TableMap::new(&config("raw_{topic}", &[], Some("orders.*")));
        assert_eq!(map.len(), 0);
        assert_eq!(map.covering(&tp("orders.eu")), 0..1);
        assert_eq!(map.covering(&tp("orders.us")), 1..2);
        assert_eq!(map.covering(&tp("orders.eu")), 0..1);
        // `orders_eu` maps to the same table name as `orders.eu`.
        assert_eq!(map.covering(&tp("orders_eu")), 0..1);
        assert_eq!(map.names(), ["raw_orders_eu", "raw_orders_us"]);
    }

    #[test]
    fn listed_topics_keep_their_order() {
        let map = TableMap::new(&config("t_{topic}", &["b", "a"], None));
        assert_eq!(map.names(), ["t_b", "t_a"]);
        assert_eq!(map.covering(&tp("a")), 1..2);
    }
}
