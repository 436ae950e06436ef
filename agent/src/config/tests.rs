use super::*;

const GOOD: &str = r#"
[catalogs.local]
type = "embedded"
path = ".floe/catalog.db"
warehouse = ".floe/warehouse"

[[pipelines]]
name = "events"
[pipelines.source]
bootstrap_servers = "${BROKER}"
group_id = "floe-events"
topics = ["events"]
[pipelines.sink]
catalog = "local"
namespace = "demo"
table = "events"
commit_interval = "5s"
"#;

fn env(name: &str) -> Option<String> {
    match name {
        "BROKER" => Some("127.0.0.1:9092".into()),
        _ => None,
    }
}

#[test]
fn parses_a_good_config_with_env_substitution() {
    let c = Config::parse(GOOD, &env).unwrap();
    assert_eq!(c.pipelines[0].source.bootstrap_servers, "127.0.0.1:9092");
    assert_eq!(
        c.pipelines[0].sink.commit_interval,
        std::time::Duration::from_secs(5)
    );
    assert_eq!(
        c.pipelines[0].dead_letter.path,
        std::path::PathBuf::from(".floe/dead-letter/events.ndjson")
    );
}

#[test]
fn reports_every_error_with_its_path() {
    let bad = r#"
extra = 1
[catalogs.local]
type = "embedded"
path = "x.db"
[[pipelines]]
name = "a b"
colour = "red"
[pipelines.source]
bootstrap_servers = "${MISSING}"
group_id = "g"
[pipelines.sink]
catalog = "nowhere"
namespace = "n"
table = "t"
commit_interval = "100ms"
[[pipelines]]
name = "ok"
[pipelines.source]
bootstrap_servers = "b:1"
group_id = "g"
topics = ["t"]
tpoics = ["t"]
[pipelines.sink]
catalog = "local"
namespace = "n"
table = "t"
"#;
    let errors = Config::parse(bad, &env).unwrap_err().0;
    let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
    for expected in [
        "extra",
        "catalogs.local",
        "pipelines[0].colour",
        "pipelines[0].name",
        "pipelines[0].source.bootstrap_servers",
        "pipelines[1].source",
    ] {
        assert!(
            paths.iter().any(|p| p.starts_with(expected)),
            "missing error at {expected}: {errors:#?}"
        );
    }
    let text = ConfigErrors(errors.clone()).to_string();
    assert!(text.contains("MISSING is not set"), "{text}");
    assert!(text.contains("tpoics"), "{text}");
    assert!(text.contains("warehouse"), "{text}");
}

#[test]
fn semantic_errors_are_collected_too() {
    let bad = GOOD
        .replace("catalog = \"local\"", "catalog = \"other\"")
        .replace("\"5s\"", "\"0s\"");
    let errors = Config::parse(&bad, &env).unwrap_err().0;
    let mut paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
    paths.sort();
    assert_eq!(
        paths,
        [
            "pipelines[0].sink.catalog",
            "pipelines[0].sink.commit_interval"
        ]
    );
}

#[test]
fn dollar_escapes_and_literal_dollars() {
    assert_eq!(expand("a$${B}c$d", &env).unwrap(), "a${B}c$d");
    assert_eq!(expand("${BROKER}/x", &env).unwrap(), "127.0.0.1:9092/x");
    assert_eq!(expand("${NOPE}", &env).unwrap_err().0, "NOPE");
}

#[test]
fn example_configs_are_valid() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let text = std::fs::read_to_string(&path).unwrap();
            let any_env = |_: &str| Some("127.0.0.1:9092".to_string());
            if let Err(e) = Config::parse(&text, &any_env) {
                panic!("{}: {e}", path.display());
            }
            checked += 1;
        }
    }
    assert!(checked > 0, "no example configs found in {}", dir.display());
}

#[test]
fn debug_output_of_a_config_shows_no_secret() {
    let text = r#"
[catalogs.polaris]
type = "rest"
uri = "https://polaris:8181/api/catalog"
credential = "etl:CLIENT-SECRET-1"
header.Authorization = "Bearer HEADER-SECRET-2"
s3.secret-access-key = "S3-SECRET-3"

[catalogs.pg]
type = "sql"
uri = "postgresql://floe:PG/SECRET-11@db:5432/iceberg?password=PG-SECRET-12"
warehouse = "/w"

[[pipelines]]
name = "events"
[pipelines.source]
bootstrap_servers = "127.0.0.1:9092"
group_id = "g"
topics = ["events"]
security_protocol = "SASL_SSL"
[pipelines.source.sasl]
mechanism = "PLAIN"
username = "u"
password = "SASL-SECRET-4"
[pipelines.source.properties]
"sasl.jaas.config" = "org.apache.kafka.common.security.plain.PlainLoginModule required password=\"JAAS-SECRET-5\";"
"ssl.key.password" = "KEY-SECRET-6"
[pipelines.decode]
format = "avro"
registry = { url = "https://reg-user:URL-SECRET-7@registry:8081", username = "u", password = "REGISTRY-SECRET-8" }
[[pipelines.transforms]]
uses = "redact"
with = { api_key = "PLUGIN-SECRET-9", nested = { token = "PLUGIN-SECRET-10" } }
[pipelines.sink]
catalog = "polaris"
namespace = "demo"
table = "events"
"#;
    let problems = match Config::parse(text, &env) {
        Err(e) => e.to_string(),
        Ok(_) => String::new(),
    };
    assert!(problems.contains("percent-encode"), "{problems}");
    let c = Config::parse(&text.replace("PG/SECRET", "PG-SECRET"), &env).unwrap();
    let oidc = text
        .replace("mechanism = \"PLAIN\"", "mechanism = \"OAUTHBEARER\"")
        .replace(
            "username = \"u\"\npassword = \"SASL-SECRET-4\"",
            "token_endpoint = \"https://idp/t\"\nclient_id = \"c\"\nclient_secret = \"OIDC-SECRET-13\"",
        )
        .replace("PG/SECRET", "PG-SECRET");
    let o = Config::parse(&oidc, &env).unwrap();
    let tokens = format!("{:?}", o.pipelines[0].source.token_source());
    let debug = format!("{c:?} {c:#?} {o:?} {tokens} {problems}");
    assert!(tokens.contains("Oidc"), "{tokens}");
    for n in 1..=13 {
        assert!(
            !debug.contains(&format!("SECRET-{n}")),
            "secret {n} printed:\n{debug}"
        );
    }
    // What is needed to run is still there.
    assert!(debug.contains("sasl.jaas.config") && debug.contains("Authorization"));
    assert!(debug.contains("https://***@registry:8081"), "{debug}");
    assert_eq!(
        c.pipelines[0].source.properties["ssl.key.password"],
        "KEY-SECRET-6"
    );
}

#[test]
fn plugin_threads_leave_a_core_to_the_rest_of_the_pipeline() {
    // cores -> default transform_threads
    for (cores, threads) in [(0, 1), (1, 1), (2, 1), (3, 2), (4, 3), (5, 4), (64, 4)] {
        assert_eq!(transform_threads_for(cores), threads, "{cores} cores");
    }
    let config = Config::parse(GOOD, &env).unwrap();
    assert_eq!(
        config.pipelines[0].transform_threads,
        default_transform_threads()
    );
    let set = GOOD.replace(
        "name = \"events\"",
        "name = \"events\"\ntransform_threads = 2",
    );
    assert_eq!(
        Config::parse(&set, &env).unwrap().pipelines[0].transform_threads,
        2
    );
}

#[test]
fn listed_topics_of_a_table_per_topic_map_to_distinct_tables() {
    let per_topic = GOOD
        .replace("table = \"events\"", "table = \"raw_{topic}\"")
        .replace("topics = [\"events\"]", "topics = [\"a.b\", \"c-d\"]");
    let c = Config::parse(&per_topic, &env).unwrap();
    let sink = &c.pipelines[0].sink;
    assert_eq!(
        (sink.table_for_topic("a.b"), sink.table_for_topic("c-d")),
        ("raw_a_b".to_string(), "raw_c_d".to_string())
    );
    let colliding = per_topic.replace("\"c-d\"", "\"a-b\"");
    let e = Config::parse(&colliding, &env).unwrap_err().to_string();
    assert!(e.contains("would write to the same table"), "{e}");
    let pattern = per_topic.replace("topics = [\"a.b\", \"c-d\"]", "topic_pattern = \"a.*\"");
    let c = Config::parse(&pattern, &env).unwrap();
    assert!(c.pipelines[0].sink.table_per_topic());
}

#[test]
fn errors_say_where_and_in_plain_words_all_at_once() {
    let bad = GOOD
        .replace(
            "commit_interval = \"5s\"",
            "comit_interval = \"5s\"\nmax_uncommitted_bytes = [1]\ncatalog_x = 1",
        )
        .replace("topics = [\"events\"]", "topics = \"events\"")
        .replace("catalog = \"local\"", "catalog = \"nowhere\"")
        .replace("[[pipelines]]", "[[pipeline]]\n[[pipelines]]");
    let errors = Config::parse(&bad, &env).unwrap_err();
    let text = errors.to_string();
    println!("{text}");
    let line_of = |needle: &str| bad.lines().position(|l| l.contains(needle)).unwrap() + 1;
    let find = |path: &str| {
        errors
            .0
            .iter()
            .find(|e| e.path == path)
            .unwrap_or_else(|| panic!("no error at {path}:\n{text}"))
    };
    let e = find("pipelines[0].sink.comit_interval");
    assert_eq!(
        e.at.map(|p| p.line),
        Some(line_of("comit_interval")),
        "{text}"
    );
    assert!(
        e.message.contains("did you mean `commit_interval`?"),
        "{text}"
    );
    let e = find("pipelines[0].source.topics");
    assert_eq!(e.at.map(|p| p.line), Some(line_of("topics = ")), "{text}");
    assert!(e.message.contains("a list"), "{text}");
    assert!(
        !text.contains("sequence") && !text.contains("\n\n"),
        "{text}"
    );
    find("pipelines[0].sink.max_uncommitted_bytes");
    find("pipelines[0].sink.catalog_x");
    find("pipelines[0].sink.catalog");
    assert!(
        find("pipeline")
            .message
            .contains("did you mean `pipelines`?"),
        "{text}"
    );

    let syntax = Config::parse("[agent]\nlog = \"x\"\n[[pipelines]\nname = 1\n", &env)
        .unwrap_err()
        .to_string();
    assert!(syntax.contains("line 3, column"), "{syntax}");
}

#[test]
fn a_pipeline_may_not_consume_its_own_dead_letters() {
    let with = |source: &str, dead_letter: &str| {
        GOOD.replace("topics = [\"events\"]", source).replace(
            "[pipelines.sink]",
            &format!("[pipelines.dead_letter]\n{dead_letter}\n[pipelines.sink]"),
        )
    };
    let refused = |text: &str| match Config::parse(text, &env) {
        Err(e) => {
            e.0.iter()
                .any(|e| e.path == "pipelines[0].dead_letter.topic")
        }
        Ok(_) => false,
    };
    assert!(refused(&with(
        "topic_pattern = \"events\\\\..*\"",
        "topic = \"events.dlq\""
    )));
    assert!(refused(&with(
        "topics = [\"events\", \"dlq\"]",
        "topic = \"dlq\""
    )));
    // Anchored at the start, as librdkafka anchors a subscription.
    assert!(!refused(&with(
        "topic_pattern = \"events\\\\..*\"",
        "topic = \"dlq.events.x\""
    )));
    // The file path defaults also when the section only names a topic.
    let c = Config::parse(
        &with("topics = [\"events\"]", "topic = \"dlq\"\nfile = false"),
        &env,
    )
    .unwrap();
    assert_eq!(
        c.pipelines[0].dead_letter.path,
        std::path::PathBuf::from(".floe/dead-letter/events.ndjson")
    );
}
