//! Configuration: one TOML file with `[catalogs.NAME]` and `[[pipelines]]`.
//!
//! Each stage owns its config struct (`source::SourceConfig`, `sink::SinkConfig`, ...);
//! this module only reads the file, substitutes `${ENV_VAR}` in string values, and
//! deserializes every section on its own so that *all* errors are reported at once,
//! each with its path (`pipelines[0].source.topics`).

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::de::DeserializeOwned;

pub use crate::settings::{Redact, Redacted, Secret, redact_url};
pub use locate::Position;

mod locate;

use crate::dead_letter::DeadLetterConfig;
use crate::decode::DecodeConfig;
use crate::schema::SchemaConfig;
use crate::sink::SinkConfig;
use crate::source::SourceConfig;
use crate::telemetry::MetricsConfig;
use crate::transform::{PluginsConfig, TransformConfig};
use floe_iceberg::CatalogConfig;

/// `[agent]`: process-wide settings.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// What a pipeline that stops with an error does to the others: `continue`
    /// (default: they keep running; the process exits when none is left) or `stop`.
    #[serde(default)]
    pub on_pipeline_failure: OnPipelineFailure,
}

/// See [`AgentConfig::on_pipeline_failure`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnPipelineFailure {
    /// The other pipelines keep running.
    #[default]
    Continue,
    /// Every pipeline stops (after committing what it buffered).
    Stop,
}

/// The whole agent configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Process-wide settings.
    pub agent: AgentConfig,
    /// Prometheus endpoint; off when absent.
    pub metrics: Option<MetricsConfig>,
    /// Where plugins are looked up and their compiled code cached.
    pub plugins: PluginsConfig,
    /// Catalogs by name, referenced by `pipelines[].sink.catalog`.
    pub catalogs: BTreeMap<String, CatalogConfig>,
    /// The pipelines this agent runs, each one topic set into one table.
    pub pipelines: Vec<PipelineConfig>,
}

/// One pipeline: Kafka topics -> decode -> transforms -> one Iceberg table.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// Unique name; also stored in every snapshot this pipeline commits.
    pub name: String,
    /// Where records come from.
    pub source: SourceConfig,
    /// How message values are decoded.
    pub decode: DecodeConfig,
    /// Type inference settings and the policy for incompatible values.
    pub schema: SchemaConfig,
    /// Plugins run in order on every decoded record.
    pub transforms: Vec<TransformConfig>,
    /// Plugin faults in a row after which the pipeline stops (default 3).
    pub max_consecutive_faults: u32,
    /// Threads the plugins run on, each with its own instances, taking parts of a
    /// batch in turn while the pipeline buffers what earlier parts produced
    /// (default: [`default_transform_threads`], one less than the cores, 1 to 4).
    pub transform_threads: usize,
    /// Where records go and how often they are committed.
    pub sink: SinkConfig,
    /// Where records that cannot be written go.
    pub dead_letter: DeadLetterConfig,
}

/// One configuration problem, with the path of the offending value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Dotted path into the file, e.g. `pipelines[0].source.topics`.
    pub path: String,
    /// What is wrong.
    pub message: String,
    /// Where in the file, when the path (or the syntax error) could be placed.
    pub at: Option<Position>,
}

/// Every problem found in a configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} configuration error(s):", self.0.len())?;
        for e in &self.0 {
            writeln!(f, "  - {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(at) = self.at {
            write!(f, "line {}, column {}: ", at.line, at.column)?;
        }
        match self.path.is_empty() {
            true => f.write_str(&self.message),
            false => write!(f, "{}: {}", self.path, self.message),
        }
    }
}

impl Config {
    /// Reads and validates a configuration file, substituting `${VAR}` from the process environment.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigErrors(vec![err(
                "",
                &format!("cannot read {}: {e}", path.display()),
            )])
        })?;
        Config::parse(&text, &|name| std::env::var(name).ok())
    }

    /// Parses and validates configuration text; `env` resolves `${VAR}` references.
    pub fn parse(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigErrors> {
        let syntax = locate::syntax_errors(text);
        if !syntax.is_empty() {
            let errors = syntax.into_iter().map(|(at, message)| ConfigError {
                path: String::new(),
                message: format!("not valid TOML: {message}"),
                at,
            });
            return Err(ConfigErrors(errors.collect()));
        }
        let mut errors = Vec::new();
        let mut root: toml::Table = toml::from_str(text).map_err(|e| {
            ConfigErrors(vec![err("", &format!("not valid TOML: {}", e.message()))])
        })?;
        for (key, value) in root.iter_mut() {
            substitute_env(value, key.clone(), env, &mut errors);
        }

        let agent = match root.remove("agent") {
            Some(v) => section::<AgentConfig>(v, "agent", &mut errors).unwrap_or_default(),
            None => AgentConfig::default(),
        };
        let metrics = root
            .remove("metrics")
            .and_then(|v| section::<MetricsConfig>(v, "metrics", &mut errors));
        let plugins = match root.remove("plugins") {
            Some(v) => section::<PluginsConfig>(v, "plugins", &mut errors).unwrap_or_default(),
            None => PluginsConfig::default(),
        };

        let mut catalogs = BTreeMap::new();
        match root.remove("catalogs") {
            Some(toml::Value::Table(t)) => {
                for (name, value) in t {
                    let path = format!("catalogs.{name}");
                    if let Some(c) = section::<CatalogConfig>(value, &path, &mut errors) {
                        for (field, message) in c.problems() {
                            errors.push(err(&format!("{path}.{field}"), &message));
                        }
                        catalogs.insert(name, c);
                    }
                }
            }
            Some(_) => errors.push(err("catalogs", "must be a table of named catalogs")),
            None => {}
        }

        let mut pipelines = Vec::new();
        match root.remove("pipelines") {
            Some(toml::Value::Array(items)) => {
                for (i, item) in items.into_iter().enumerate() {
                    if let Some(p) = pipeline(item, &format!("pipelines[{i}]"), &mut errors) {
                        pipelines.push(p);
                    }
                }
            }
            Some(_) => errors.push(err("pipelines", "must be an array: use [[pipelines]]")),
            None => errors.push(err(
                "pipelines",
                "at least one [[pipelines]] entry is required",
            )),
        }
        for key in root.keys() {
            errors.push(err(key, &locate::unknown(key, &TOP_KEYS)));
        }

        let config = Config {
            agent,
            metrics,
            plugins,
            catalogs,
            pipelines,
        };
        config.check(&mut errors);
        let mut seen = std::collections::HashSet::new();
        errors.retain(|e| e.path.is_empty() || seen.insert(e.path.clone()));
        let locator = locate::Locator::new(text);
        for e in &mut errors {
            e.at = e.at.or_else(|| locator.find(&e.path));
        }
        errors.sort_by_key(|e| e.at.map_or((usize::MAX, 0), |p| (p.line, p.column)));
        if errors.is_empty() {
            Ok(config)
        } else {
            Err(ConfigErrors(errors))
        }
    }

    /// Settings that still load but do nothing any more, with what to do instead (the
    /// same lines `floe run` logs at start).
    pub fn warnings(&self) -> Vec<ConfigError> {
        let mut out = Vec::new();
        for (i, p) in self.pipelines.iter().enumerate() {
            for (field, message) in p.sink.warnings() {
                out.push(err(&format!("pipelines[{i}].sink.{field}"), &message));
            }
        }
        out
    }

    /// What the file system must hold for `floe run` to start: every plugin a
    /// transform names (looked up as the agent looks it up).
    pub fn missing_files(&self) -> Vec<ConfigError> {
        let mut out = Vec::new();
        for (i, p) in self.pipelines.iter().enumerate() {
            for (j, t) in p.transforms.iter().enumerate() {
                if self.plugins.resolve(&t.uses).is_none() {
                    let path = format!("pipelines[{i}].transforms[{j}].uses");
                    out.push(err(&path, &self.plugins.not_found(&t.uses)));
                }
            }
        }
        out
    }

    /// [`Config::missing_files`] and [`Config::warnings`] placed in `text`, the file this
    /// config was read from.
    pub fn placed(text: &str, mut errors: Vec<ConfigError>) -> Vec<ConfigError> {
        let locator = locate::Locator::new(text);
        for e in &mut errors {
            e.at = e.at.or_else(|| locator.find(&e.path));
        }
        errors
    }

    /// Cross-section checks: references resolve and names are unique.
    fn check(&self, errors: &mut Vec<ConfigError>) {
        let mut seen = std::collections::HashSet::new();
        for (i, p) in self.pipelines.iter().enumerate() {
            let at = |field: &str| format!("pipelines[{i}].{field}");
            if !seen.insert(p.name.as_str()) {
                errors.push(err(
                    &at("name"),
                    &format!("duplicate pipeline name {:?}", p.name),
                ));
            }
            if !self.catalogs.contains_key(&p.sink.catalog) {
                errors.push(err(
                    &at("sink.catalog"),
                    &format!("no catalog named {:?} in [catalogs]", p.sink.catalog),
                ));
            }
        }
    }
}

fn err(path: &str, message: &str) -> ConfigError {
    ConfigError {
        path: path.to_string(),
        message: message.to_string(),
        at: None,
    }
}

/// Deserializes one section, recording an error with its full path for each problem.
///
/// serde stops at the first problem, so the offending value is taken out and the section
/// read again, up to a bound: a file with three mistakes shows three errors. A section
/// that reads once its bad values are taken out is still returned (with defaults in their
/// place), so the checks that span sections still run; the errors already fail the load.
fn section<T: DeserializeOwned>(
    value: toml::Value,
    path: &str,
    errors: &mut Vec<ConfigError>,
) -> Option<T> {
    let full = |inner: &str| match inner {
        "" | "." => path.to_string(),
        inner => format!("{path}.{inner}"),
    };
    let mut value = value;
    let mut removed: Vec<String> = Vec::new();
    for _ in 0..32 {
        let e = match serde_path_to_error::deserialize::<_, T>(value.clone()) {
            Ok(v) => return Some(v),
            Err(e) => e,
        };
        let mut at: Vec<Segment> = e.path().iter().map(Segment::from).collect();
        let inner = e.path().to_string();
        let message = e.into_inner().to_string();
        if let Some(field) = quoted_after(&message, "missing field `")
            && removed.contains(&join(&inner, field))
        {
            // The value was there and wrong; that error is already reported.
            return None;
        }
        errors.push(err(&full(&inner), &locate::plain_words(&message)));
        if let Some(field) = quoted_after(&message, "unknown field `")
            && !matches!(at.last(), Some(Segment::Key(k)) if k == field)
        {
            at.push(Segment::Key(field.to_string()));
        }
        let target = at
            .iter()
            .map(Segment::to_string)
            .collect::<Vec<_>>()
            .join(".");
        if at.is_empty() || !remove_value(&mut value, &at) {
            return None;
        }
        removed.push(target);
    }
    None
}

/// One step of a path into a TOML value.
enum Segment {
    Key(String),
    Index(usize),
    Other,
}

impl From<&serde_path_to_error::Segment> for Segment {
    fn from(s: &serde_path_to_error::Segment) -> Segment {
        match s {
            serde_path_to_error::Segment::Map { key } => Segment::Key(key.clone()),
            serde_path_to_error::Segment::Seq { index } => Segment::Index(*index),
            _ => Segment::Other,
        }
    }
}

impl fmt::Display for Segment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Segment::Key(k) => f.write_str(k),
            Segment::Index(i) => write!(f, "[{i}]"),
            Segment::Other => f.write_str("?"),
        }
    }
}

/// Takes the value at `at` out of `value`; false if there is none.
fn remove_value(value: &mut toml::Value, at: &[Segment]) -> bool {
    match (value, at) {
        (toml::Value::Table(t), [Segment::Key(k)]) => t.remove(k).is_some(),
        (toml::Value::Array(items), [Segment::Index(i)]) if *i < items.len() => {
            items.remove(*i);
            true
        }
        (toml::Value::Table(t), [Segment::Key(k), rest @ ..]) => {
            t.get_mut(k).is_some_and(|v| remove_value(v, rest))
        }
        (toml::Value::Array(items), [Segment::Index(i), rest @ ..]) => {
            items.get_mut(*i).is_some_and(|v| remove_value(v, rest))
        }
        _ => false,
    }
}

/// The text between `prefix` and the next backtick in `message`.
fn quoted_after<'m>(message: &'m str, prefix: &str) -> Option<&'m str> {
    let rest = &message[message.find(prefix)? + prefix.len()..];
    rest.split('`').next()
}

fn join(inner: &str, field: &str) -> String {
    match inner {
        "" | "." => field.to_string(),
        inner => format!("{inner}.{field}"),
    }
}

/// The top-level keys of a config file.
const TOP_KEYS: [&str; 5] = ["agent", "metrics", "plugins", "catalogs", "pipelines"];

/// The keys of a `[[pipelines]]` entry.
pub(crate) const PIPELINE_KEYS: [&str; 9] = [
    "name",
    "source",
    "decode",
    "schema",
    "transforms",
    "max_consecutive_faults",
    "transform_threads",
    "sink",
    "dead_letter",
];

/// A pipeline is split into its stage sections so each reports its own errors.
fn pipeline(
    value: toml::Value,
    path: &str,
    errors: &mut Vec<ConfigError>,
) -> Option<PipelineConfig> {
    let toml::Value::Table(mut t) = value else {
        errors.push(err(path, "must be a table"));
        return None;
    };
    for key in t.keys().filter(|k| !PIPELINE_KEYS.contains(&k.as_str())) {
        errors.push(err(
            &format!("{path}.{key}"),
            &locate::unknown(key, &PIPELINE_KEYS),
        ));
    }
    let mut take = |key: &str, required: bool| -> Option<toml::Value> {
        debug_assert!(
            PIPELINE_KEYS.contains(&key),
            "{key} is not in PIPELINE_KEYS"
        );
        let v = t.remove(key);
        if v.is_none() && required {
            errors.push(err(&format!("{path}.{key}"), "missing"));
        }
        v
    };
    let name = take("name", true);
    let source = take("source", true);
    let decode = take("decode", false);
    let schema = take("schema", false);
    let transforms = take("transforms", false);
    let max_faults = take("max_consecutive_faults", false);
    let threads = take("transform_threads", false);
    let sink = take("sink", true);
    let dead_letter = take("dead_letter", false);
    let name = name.and_then(|v| section::<String>(v, &format!("{path}.name"), errors));
    if let Some(n) = &name
        && (n.is_empty()
            || !n
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'))
    {
        errors.push(err(
            &format!("{path}.name"),
            "use letters, digits, '-' and '_' only",
        ));
    }
    let source = source.and_then(|v| section::<SourceConfig>(v, &format!("{path}.source"), errors));
    for (field, message) in source
        .as_ref()
        .map(SourceConfig::problems)
        .unwrap_or_default()
    {
        errors.push(err(&format!("{path}.source.{field}"), &message));
    }
    let decode = match decode {
        Some(v) => section::<DecodeConfig>(v, &format!("{path}.decode"), errors),
        None => Some(DecodeConfig::default()),
    };
    for (field, message) in decode
        .as_ref()
        .map(DecodeConfig::problems)
        .unwrap_or_default()
    {
        errors.push(err(&format!("{path}.decode.{field}"), &message));
    }
    let schema = match schema {
        Some(v) => section::<SchemaConfig>(v, &format!("{path}.schema"), errors),
        None => Some(SchemaConfig::default()),
    };
    for (field, message) in schema
        .as_ref()
        .map(SchemaConfig::problems)
        .unwrap_or_default()
    {
        errors.push(err(&format!("{path}.schema.{field}"), &message));
    }
    let transforms = match transforms {
        None => Some(Vec::new()),
        Some(toml::Value::Array(items)) => {
            let parsed: Vec<_> = items
                .into_iter()
                .enumerate()
                .map(|(j, v)| {
                    section::<TransformConfig>(v, &format!("{path}.transforms[{j}]"), errors)
                })
                .collect();
            parsed.into_iter().collect::<Option<Vec<_>>>()
        }
        Some(_) => {
            errors.push(err(
                &format!("{path}.transforms"),
                "must be an array: use [[pipelines.transforms]]",
            ));
            None
        }
    };
    let max_consecutive_faults = match max_faults {
        None => Some(3),
        Some(v) => section::<u32>(v, &format!("{path}.max_consecutive_faults"), errors),
    };
    let transform_threads = match threads {
        None => Some(default_transform_threads()),
        Some(v) => section::<usize>(v, &format!("{path}.transform_threads"), errors),
    };
    if transform_threads == Some(0) {
        errors.push(err(
            &format!("{path}.transform_threads"),
            "must be at least 1",
        ));
    }
    let sink = sink.and_then(|v| section::<SinkConfig>(v, &format!("{path}.sink"), errors));
    for (field, message) in sink.as_ref().map(SinkConfig::problems).unwrap_or_default() {
        errors.push(err(&format!("{path}.sink.{field}"), &message));
    }
    let mut dead_letter = match dead_letter {
        Some(v) => section::<DeadLetterConfig>(v, &format!("{path}.dead_letter"), errors),
        None => name.as_deref().map(DeadLetterConfig::default_for),
    };
    if let (Some(d), Some(name)) = (&mut dead_letter, &name)
        && d.path.as_os_str().is_empty()
    {
        d.path = DeadLetterConfig::default_for(name).path;
    }
    for (field, message) in dead_letter
        .as_ref()
        .map(DeadLetterConfig::problems)
        .unwrap_or_default()
    {
        errors.push(err(&format!("{path}.dead_letter.{field}"), &message));
    }
    if let (Some(dead_letter), Some(source)) = (&dead_letter, &source)
        && let Some(topic) = &dead_letter.topic
        && source.consumes(topic)
    {
        errors.push(err(
            &format!("{path}.dead_letter.topic"),
            &format!(
                "the pipeline consumes its own dead-letter topic {topic:?} (it matches `topics` or `topic_pattern`): its dead letters would come back as records; exclude it from the pattern or name another topic"
            ),
        ));
    }
    if let (Some(sink), Some(source)) = (&sink, &source)
        && sink.table_per_topic()
    {
        // With `topic_pattern`, tables are added as topics appear; two topics whose
        // names map to one table name share it (with a warning).
        let mut seen = std::collections::HashMap::new();
        for topic in &source.topics {
            if let Some(other) = seen.insert(sink.table_for_topic(topic), topic) {
                errors.push(err(
                    &format!("{path}.sink.table"),
                    &format!("topics {other} and {topic} would write to the same table"),
                ));
            }
        }
    }
    // Sections that parsed are kept even with problems, so cross-section checks still run.
    Some(PipelineConfig {
        name: name?,
        source: source?,
        decode: decode?,
        schema: schema?,
        transforms: transforms?,
        max_consecutive_faults: max_consecutive_faults?,
        transform_threads: transform_threads?,
        sink: sink?,
        dead_letter: dead_letter?,
    })
}

/// The default `transform_threads`: one less than the cores this process may use, at
/// least 1 and at most 4 (see [`transform_threads_for`]).
pub fn default_transform_threads() -> usize {
    transform_threads_for(
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
    )
}

/// The default `transform_threads` on `cores` cores: one core is left to the rest of the
/// pipeline (the intake thread, which decodes, buffers the plugins' outputs and overlaps
/// them; the consumer; Parquet encoding) and to a broker next to it. On two cores a
/// second plugin thread competes with them for the same cores: it buys no wall time and
/// costs CPU (measurements: docs/benchmarks-investigations.md, "One plugin thread on two
/// cores").
pub fn transform_threads_for(cores: usize) -> usize {
    cores.saturating_sub(1).clamp(1, 4)
}

/// Replaces `${VAR}` in every string value; `$${` stays a literal `${`.
fn substitute_env(
    value: &mut toml::Value,
    path: String,
    env: &dyn Fn(&str) -> Option<String>,
    errors: &mut Vec<ConfigError>,
) {
    match value {
        toml::Value::String(s) if s.contains('$') => match expand(s, env) {
            Ok(expanded) => *s = expanded,
            Err(e) => errors.push(err(&path, &e.to_string())),
        },
        toml::Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                substitute_env(item, format!("{path}[{i}]"), env, errors);
            }
        }
        toml::Value::Table(t) => {
            for (k, v) in t.iter_mut() {
                substitute_env(v, format!("{path}.{k}"), env, errors);
            }
        }
        _ => {}
    }
}

/// A `${VAR}` names a variable that is not set.
#[derive(Debug, thiserror::Error)]
#[error("environment variable {0} is not set")]
struct UnsetVar(String);

fn expand(s: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, UnsetVar> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix("${") {
            out.push_str("${");
            rest = tail;
        } else if let Some(tail) = after.strip_prefix('{') {
            let Some(end) = tail.find('}') else {
                out.push('$');
                rest = after;
                continue;
            };
            let var = &tail[..end];
            out.push_str(&env(var).ok_or_else(|| UnsetVar(var.to_string()))?);
            rest = &tail[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod reference;
