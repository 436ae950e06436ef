//! A typed builder for the agent's `floe.toml`, so tests never format TOML by hand:
//! values go through the `toml` crate, which does the quoting and escaping.
//!
//! ```ignore
//! let config = ws.config().pipeline(
//!     ws.pipeline("events", &broker.bootstrap, "events")
//!         .table("demo", "events")
//!         .upsert(&["id"])
//!         .transform(Transform::new(plugin_path("filter")).with(json!({"drop": ["email"]}))),
//! );
//! let path = ws.write(&config)?;
//! ```
//!
//! Every builder keeps a `toml::Table`; the typed methods set the keys of
//! `docs/configuration.md`, and `set("dotted.key", value)` sets any other one.
//! Keys that hold a dot themselves (librdkafka properties) have their own methods.

use std::path::{Path, PathBuf};

use anyhow::Result;
use toml::{Table, Value};

/// Sets `value` at the path of `keys` under `table`, creating the tables on the way.
fn insert(table: &mut Table, keys: &[&str], value: Value) {
    let (last, parents) = keys.split_last().expect("a key");
    let mut t = table;
    for k in parents {
        t = t
            .entry(k.to_string())
            .or_insert_with(|| Value::Table(Table::new()))
            .as_table_mut()
            .unwrap_or_else(|| panic!("`{k}` is set and is not a table"));
    }
    t.insert(last.to_string(), value);
}

/// Sets the dotted key `dotted` (`"sink.max_open_files"`) under `table`.
fn set_dotted(table: &mut Table, dotted: &str, value: Value) {
    let keys: Vec<&str> = dotted.split('.').collect();
    insert(table, &keys, value);
}

/// A list of strings as a TOML array.
fn strings(items: &[&str]) -> Value {
    Value::Array(items.iter().map(|s| Value::from(*s)).collect())
}

/// A path as a TOML string.
fn path_value(path: impl AsRef<Path>) -> Value {
    Value::from(path.as_ref().display().to_string())
}

/// A JSON value as TOML (`null` has no TOML form and panics).
fn from_json(json: serde_json::Value) -> Value {
    Value::try_from(&json).unwrap_or_else(|e| panic!("{json} has no TOML form: {e}"))
}

/// A whole config file: `[agent]`, `[metrics]`, `[plugins]`, `[catalogs.NAME]` and
/// `[[pipelines]]`.
#[derive(Clone, Debug, Default)]
pub struct Config {
    root: Table,
}

impl Config {
    /// An empty config.
    pub fn new() -> Config {
        Config::default()
    }

    /// `[plugins] cache_dir`: where compiled plugins are cached.
    pub fn plugin_cache(self, dir: impl AsRef<Path>) -> Config {
        self.set("plugins.cache_dir", path_value(dir))
    }

    /// `[plugins] path`: directories searched for `uses = "name"`.
    pub fn plugin_dirs(self, dirs: &[&Path]) -> Config {
        let dirs = dirs.iter().map(path_value).collect::<Vec<_>>();
        self.set("plugins.path", Value::Array(dirs))
    }

    /// `[metrics] listen`: the address of `/metrics`, `/healthz` and `/readyz`.
    pub fn metrics(self, listen: &str) -> Config {
        self.set("metrics.listen", listen)
    }

    /// `[agent] on_pipeline_failure`: `"continue"` or `"stop"`.
    pub fn on_pipeline_failure(self, what: &str) -> Config {
        self.set("agent.on_pipeline_failure", what)
    }

    /// `[catalogs.NAME]`.
    pub fn catalog(mut self, name: &str, catalog: CatalogSection) -> Config {
        insert(&mut self.root, &["catalogs", name], Value::Table(catalog.0));
        self
    }

    /// Appends a `[[pipelines]]` entry.
    pub fn pipeline(mut self, pipeline: Pipeline) -> Config {
        let list = self
            .root
            .entry("pipelines")
            .or_insert_with(|| Value::Array(Vec::new()))
            .as_array_mut()
            .expect("pipelines is a list");
        list.push(Value::Table(pipeline.0));
        self
    }

    /// Any other key, dotted from the top (`"metrics.ready_commit_intervals"`).
    pub fn set(mut self, dotted: &str, value: impl Into<Value>) -> Config {
        set_dotted(&mut self.root, dotted, value.into());
        self
    }

    /// The config as TOML text.
    pub fn to_toml(&self) -> String {
        toml::to_string(&self.root).expect("a TOML table serializes")
    }

    /// Writes the config to `path`; returns the path.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<PathBuf> {
        std::fs::write(path.as_ref(), self.to_toml())?;
        Ok(path.as_ref().to_path_buf())
    }
}

/// A `[catalogs.NAME]` section.
#[derive(Clone, Debug)]
pub struct CatalogSection(Table);

impl CatalogSection {
    fn typed(kind: &str) -> CatalogSection {
        CatalogSection(Table::new()).set("type", kind)
    }

    /// `type = "embedded"`: a SQLite file and a local (or `s3://`) warehouse.
    pub fn embedded(path: impl AsRef<Path>, warehouse: impl AsRef<Path>) -> CatalogSection {
        CatalogSection::typed("embedded")
            .set("path", path_value(path))
            .set("warehouse", path_value(warehouse))
    }

    /// `type = "sql"`: a SQL catalog on Postgres at `uri`.
    pub fn sql(uri: &str, warehouse: impl AsRef<Path>) -> CatalogSection {
        CatalogSection::typed("sql")
            .set("uri", uri)
            .set("warehouse", path_value(warehouse))
    }

    /// `type = "rest"`: an Iceberg REST catalog at `uri`.
    pub fn rest(uri: &str) -> CatalogSection {
        CatalogSection::typed("rest").set("uri", uri)
    }

    /// `warehouse`.
    pub fn warehouse(self, warehouse: &str) -> CatalogSection {
        self.set("warehouse", warehouse)
    }

    /// REST: `credential = "client_id:client_secret"`.
    pub fn credential(self, credential: &str) -> CatalogSection {
        self.set("credential", credential)
    }

    /// REST: the OAuth2 `scope`.
    pub fn scope(self, scope: &str) -> CatalogSection {
        self.set("scope", scope)
    }

    /// REST: a static bearer `token`.
    pub fn token(self, token: &str) -> CatalogSection {
        self.set("token", token)
    }

    /// `s3.KEY` (`"endpoint"`, `"region"`, `"path-style-access"`, `"access-key-id"`...).
    pub fn s3(mut self, key: &str, value: impl Into<Value>) -> CatalogSection {
        insert(&mut self.0, &["s3", key], value.into());
        self
    }

    /// `s3.endpoint`, `s3.region` and `s3.path-style-access = true`: an S3-compatible
    /// store such as MinIO.
    pub fn s3_store(self, endpoint: &str, region: &str) -> CatalogSection {
        self.s3("endpoint", endpoint)
            .s3("region", region)
            .s3("path-style-access", true)
    }

    /// `aws.KEY` (`"profile"`, `"region"`, `"role_arn"`...).
    pub fn aws(mut self, key: &str, value: impl Into<Value>) -> CatalogSection {
        insert(&mut self.0, &["aws", key], value.into());
        self
    }

    /// Any other key, dotted from the catalog's section.
    pub fn set(mut self, dotted: &str, value: impl Into<Value>) -> CatalogSection {
        set_dotted(&mut self.0, dotted, value.into());
        self
    }
}

/// A `[[pipelines]]` entry: source, decode, schema, transforms, sink and dead letters.
#[derive(Clone, Debug)]
pub struct Pipeline(Table);

impl Pipeline {
    /// A pipeline `name` reading `topic` from `bootstrap` as the group `floe-NAME`;
    /// set its sink with [`Pipeline::sink`] (or start from `Workspace::pipeline`).
    pub fn new(name: &str, bootstrap: &str, topic: &str) -> Pipeline {
        Pipeline(Table::new())
            .set("name", name)
            .set("source.bootstrap_servers", bootstrap)
            .set("source.group_id", format!("floe-{name}"))
            .topics(&[topic])
    }

    // --- source ---

    /// `source.topics`.
    pub fn topics(self, topics: &[&str]) -> Pipeline {
        self.set("source.topics", strings(topics))
    }

    /// `source.topic_pattern` instead of `source.topics`.
    pub fn topic_pattern(mut self, pattern: &str) -> Pipeline {
        if let Some(source) = self.0.get_mut("source").and_then(Value::as_table_mut) {
            source.remove("topics");
        }
        self.set("source.topic_pattern", pattern)
    }

    /// `source.group_id`.
    pub fn group_id(self, group: &str) -> Pipeline {
        self.set("source.group_id", group)
    }

    /// `source.start`: `"earliest"` or `"latest"`.
    pub fn start(self, start: &str) -> Pipeline {
        self.set("source.start", start)
    }

    /// A librdkafka property in `[pipelines.source.properties]`.
    pub fn property(mut self, key: &str, value: &str) -> Pipeline {
        insert(&mut self.0, &["source", "properties", key], value.into());
        self
    }

    /// `source.security_protocol`: `PLAINTEXT`, `SSL`, `SASL_PLAINTEXT` or `SASL_SSL`.
    pub fn security_protocol(self, protocol: &str) -> Pipeline {
        self.set("source.security_protocol", protocol)
    }

    /// `[pipelines.source.sasl]` with `mechanism`, `username` and `password` (PLAIN and
    /// SCRAM; other keys with `set("source.sasl.KEY", ...)`).
    pub fn sasl(self, mechanism: &str, username: &str, password: &str) -> Pipeline {
        self.set("source.sasl.mechanism", mechanism)
            .set("source.sasl.username", username)
            .set("source.sasl.password", password)
    }

    /// `source.tls.ca_file`.
    pub fn tls_ca(self, ca_file: impl AsRef<Path>) -> Pipeline {
        self.set("source.tls.ca_file", path_value(ca_file))
    }

    /// `source.tls.cert_file` and `source.tls.key_file`: a client certificate (mTLS).
    pub fn tls_client(self, cert_file: impl AsRef<Path>, key_file: impl AsRef<Path>) -> Pipeline {
        self.set("source.tls.cert_file", path_value(cert_file))
            .set("source.tls.key_file", path_value(key_file))
    }

    // --- decode and schema ---

    /// `decode.format`: `json`, `avro`, `protobuf` or `json_schema`.
    pub fn format(self, format: &str) -> Pipeline {
        self.set("decode.format", format)
    }

    /// `decode.registry.url`: a schema registry (the Confluent wire format).
    pub fn registry(self, url: &str) -> Pipeline {
        self.set("decode.registry.url", url)
    }

    /// `decode.key_format`.
    pub fn key_format(self, format: &str) -> Pipeline {
        self.set("decode.key_format", format)
    }

    /// `decode.schema_file`: plain messages with this schema.
    pub fn schema_file(self, path: impl AsRef<Path>) -> Pipeline {
        self.set("decode.schema_file", path_value(path))
    }

    /// `schema.KEY` of `[pipelines.schema]` (`"on_incompatible"`, `"max_depth"`...).
    pub fn schema(mut self, key: &str, value: impl Into<Value>) -> Pipeline {
        insert(&mut self.0, &["schema", key], value.into());
        self
    }

    /// `schema.overrides.FIELD = TYPE`: a forced column type.
    pub fn type_override(mut self, field: &str, ty: &str) -> Pipeline {
        insert(&mut self.0, &["schema", "overrides", field], ty.into());
        self
    }

    // --- transforms ---

    /// Appends a `[[pipelines.transforms]]` entry.
    pub fn transform(mut self, transform: Transform) -> Pipeline {
        let list = self
            .0
            .entry("transforms")
            .or_insert_with(|| Value::Array(Vec::new()))
            .as_array_mut()
            .expect("transforms is a list");
        list.push(Value::Table(transform.0));
        self
    }

    /// `transform_threads`.
    pub fn transform_threads(self, threads: i64) -> Pipeline {
        self.set("transform_threads", threads)
    }

    // --- sink ---

    /// `sink.catalog`, `sink.namespace`, `sink.table`, with `create_table = true`.
    pub fn sink(self, catalog: &str, namespace: &str, table: &str) -> Pipeline {
        self.set("sink.catalog", catalog)
            .table(namespace, table)
            .set("sink.create_table", true)
    }

    /// `sink.namespace` and `sink.table`.
    pub fn table(self, namespace: &str, table: &str) -> Pipeline {
        self.set("sink.namespace", namespace)
            .set("sink.table", table)
    }

    /// `sink.commit_interval`, e.g. `"1s"`.
    pub fn commit_interval(self, interval: &str) -> Pipeline {
        self.set("sink.commit_interval", interval)
    }

    /// `sink.mode = "upsert"` with `sink.key`.
    pub fn upsert(self, key: &[&str]) -> Pipeline {
        self.set("sink.mode", "upsert")
            .set("sink.key", strings(key))
    }

    /// `sink.partition_by`, e.g. `["day(ts)"]`.
    pub fn partition_by(self, spec: &[&str]) -> Pipeline {
        self.set("sink.partition_by", strings(spec))
    }

    /// `sink.streams.STREAM = TABLE`: the table a streams plugin's route goes to.
    pub fn stream(mut self, stream: &str, table: &str) -> Pipeline {
        insert(&mut self.0, &["sink", "streams", stream], table.into());
        self
    }

    /// `sink.maintenance.KEY` (`"interval"`, `"keep_snapshots"`...); any key turns
    /// maintenance on.
    pub fn maintenance(mut self, key: &str, value: impl Into<Value>) -> Pipeline {
        insert(&mut self.0, &["sink", "maintenance", key], value.into());
        self
    }

    // --- dead letters ---

    /// `dead_letter.path`.
    pub fn dead_letter(self, path: impl AsRef<Path>) -> Pipeline {
        self.set("dead_letter.path", path_value(path))
    }

    /// `dead_letter.topic`: dead letters are also produced to this topic.
    pub fn dead_letter_topic(self, topic: &str) -> Pipeline {
        self.set("dead_letter.topic", topic)
    }

    /// Any other key, dotted from the pipeline (`"sink.max_open_files"`).
    pub fn set(mut self, dotted: &str, value: impl Into<Value>) -> Pipeline {
        set_dotted(&mut self.0, dotted, value.into());
        self
    }
}

/// A `[[pipelines.transforms]]` entry: a plugin and its settings.
#[derive(Clone, Debug)]
pub struct Transform(Table);

impl Transform {
    /// A transform that `uses` a `.wasm` file (or a plugin name in `[plugins] path`).
    pub fn new(uses: impl AsRef<Path>) -> Transform {
        Transform(Table::new()).set("uses", path_value(uses))
    }

    /// `name`: the name in logs, metrics and dead letters.
    pub fn name(self, name: &str) -> Transform {
        self.set("name", name)
    }

    /// `with`: the plugin's settings, written as JSON (`json!({"drop": ["email"]})`).
    pub fn with(self, settings: serde_json::Value) -> Transform {
        self.set("with", from_json(settings))
    }

    /// `on_error`: `"dead_letter"`, `"drop"` or `"fail"`.
    pub fn on_error(self, policy: &str) -> Transform {
        self.set("on_error", policy)
    }

    /// `limits.KEY` (`"fuel"`, `"memory"`, `"timeout"`, `"batch"`...).
    pub fn limit(mut self, key: &str, value: impl Into<Value>) -> Transform {
        insert(&mut self.0, &["limits", key], value.into());
        self
    }

    /// Any other key, dotted from the transform (`"allow_clock"`).
    pub fn set(mut self, dotted: &str, value: impl Into<Value>) -> Transform {
        set_dotted(&mut self.0, dotted, value.into());
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_and_nests() {
        let text = Config::new()
            .catalog(
                "local",
                CatalogSection::embedded("/tmp/a \"b\"/c.db", "/tmp/w"),
            )
            .pipeline(
                Pipeline::new("p", "127.0.0.1:1", "t")
                    .property("session.timeout.ms", "2000")
                    .sink("local", "ns", "t")
                    .transform(
                        Transform::new("/x.wasm").with(serde_json::json!({"a": [{"b": 1}]})),
                    ),
            )
            .to_toml();
        let parsed: Table = toml::from_str(&text).expect(&text);
        let p = &parsed["pipelines"][0];
        assert_eq!(
            parsed["catalogs"]["local"]["path"].as_str(),
            Some("/tmp/a \"b\"/c.db")
        );
        assert_eq!(
            p["source"]["properties"]["session.timeout.ms"].as_str(),
            Some("2000")
        );
        assert_eq!(p["source"]["group_id"].as_str(), Some("floe-p"));
        assert_eq!(
            p["transforms"][0]["with"]["a"][0]["b"].as_integer(),
            Some(1)
        );
        assert_eq!(p["sink"]["create_table"].as_bool(), Some(true));
    }
}
