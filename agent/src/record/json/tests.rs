use proptest::prelude::*;
use serde_json::json;

use super::*;

fn parse(text: &str) -> Result<JsonObject, JsonError> {
    JsonObject::parse(text.as_bytes().to_vec())
}

fn to_serde(o: &JsonObject) -> serde_json::Value {
    Value::Object(o.view().root()).to_serde()
}

#[test]
fn reads_fields_in_order_with_kinds() {
    let o = parse(r#" {"a": 1, "b": [true, null, -2.5e3], "c": {"d": "x\"y\u00e9"}, "e": {}} "#)
        .unwrap();
    let root = o.view().root();
    let names: Vec<String> = root.iter().map(|(k, _)| k.get().into_owned()).collect();
    assert_eq!(names, ["a", "b", "c", "e"]);
    let Some(Value::Number(n)) = root.get("a") else {
        panic!("a is a number")
    };
    assert_eq!((n.as_i64(), n.has_fraction()), (Some(1), false));
    let Some(Value::Array(b)) = root.get("b") else {
        panic!("b is an array")
    };
    let kinds: Vec<&str> = b.iter().map(|v| v.kind_name()).collect();
    assert_eq!(kinds, ["boolean", "null", "number with fraction"]);
    let Some(Value::Object(c)) = root.get("c") else {
        panic!("c is an object")
    };
    let Some(Value::String(d)) = c.get("d") else {
        panic!("d is a string")
    };
    assert_eq!(d.get(), "x\"yé");
    assert_eq!(d.raw(), r#"x\"y\u00e9"#);
    assert_eq!(
        to_serde(&o),
        json!({"a": 1, "b": [true, null, -2500.0], "c": {"d": "x\"yé"}, "e": {}})
    );
    let Some(Value::Object(e)) = root.get("e") else {
        panic!()
    };
    assert!(e.is_empty());
    assert_eq!(root.get("b").unwrap().raw(), "[true, null, -2.5e3]");
}

#[test]
fn rejects_what_is_not_one_object_with_reason() {
    assert_eq!(parse("[1,2]"), Err(JsonError::NotAnObject("array")));
    assert_eq!(parse("42"), Err(JsonError::NotAnObject("integer")));
    assert_eq!(
        parse("4.5"),
        Err(JsonError::NotAnObject("number with fraction"))
    );
    assert_eq!(parse("\"s\""), Err(JsonError::NotAnObject("string")));
    assert_eq!(parse("null"), Err(JsonError::NotAnObject("null")));
    for bad in [
        "",
        "{",
        "{\"a\"}",
        "{\"a\":}",
        "{\"a\":1,}",
        "{\"a\":01}",
        "{\"a\":1.}",
        "{\"a\":.5}",
        "{\"a\":tru}",
        "{\"a\":\"\\x\"}",
        "{\"a\":\"\\ud800\"}",
        "{\"a\":\"\u{1}\"}",
        "{} x",
        "{\"a\":1}}",
        "[1,",
        "{\"a\":[1,]}",
        "{'a':1}",
    ] {
        let e = parse(bad).unwrap_err();
        assert!(matches!(e, JsonError::Syntax { .. }), "{bad:?} gave {e:?}");
        assert!(e.to_string().contains("not valid JSON"), "{e}");
    }
    assert!(matches!(
        JsonObject::parse(vec![b'{', b'"', 0xff, b'"', b':', b'1', b'}']),
        Err(JsonError::Syntax {
            reason: "invalid UTF-8",
            ..
        })
    ));
}

#[test]
fn duplicate_keys_are_refused_also_when_escaped_or_wide() {
    assert_eq!(
        parse(r#"{"a": 1, "b": {"a": 2}, "a": 3}"#),
        Err(JsonError::DuplicateKey("a".into()))
    );
    assert_eq!(
        parse(r#"{"a": 1, "\u0061": 2}"#),
        Err(JsonError::DuplicateKey("a".into()))
    );
    let wide: Vec<String> = (0..40).map(|i| format!("\"k{i}\": {i}")).collect();
    assert!(parse(&format!("{{{}}}", wide.join(","))).is_ok());
    assert_eq!(
        parse(&format!("{{{}, \"k3\": 0}}", wide.join(","))),
        Err(JsonError::DuplicateKey("k3".into()))
    );
}

#[test]
fn depth_is_bounded_without_recursion() {
    let deep = format!(
        "{}{}",
        "{\"a\":".repeat(200),
        "1".to_string() + &"}".repeat(200)
    );
    assert_eq!(parse(&deep), Err(JsonError::TooDeep));
    let ok = format!("{}1{}", "{\"a\":".repeat(100), "}".repeat(100));
    assert!(parse(&ok).is_ok());
    // A million open brackets neither overflow a stack nor allocate a million levels.
    let bomb = "[".repeat(1_000_000);
    assert!(parse(&format!("{{\"a\":{bomb}")).is_err());
}

#[test]
fn numbers_keep_their_text() {
    let o = parse(r#"{"big": 18446744073709551616, "i": -9223372036854775808, "f": 1e2, "z": -0}"#)
        .unwrap();
    let root = o.view().root();
    let num = |k: &str| match root.get(k) {
        Some(Value::Number(n)) => n,
        other => panic!("{other:?}"),
    };
    assert!(
        !num("big").is_i64(),
        "beyond i64: read as a float like other readers"
    );
    assert_eq!(num("big").as_f64(), 18446744073709551616.0);
    assert_eq!(num("i").as_i64(), Some(i64::MIN));
    assert!(num("f").has_fraction());
    assert_eq!(num("f").text(), "1e2");
    assert_eq!(num("z").as_i64(), Some(0));
}

#[test]
fn writer_builds_text_and_tape_that_read_back() {
    let mut w = JsonWriter::new();
    w.begin_object();
    w.key("s");
    w.string("a\"b\n\u{1}");
    w.key("n");
    w.i64(-7);
    w.key("f");
    w.f64(1.0);
    w.key("nan");
    w.f64(f64::NAN);
    w.key("list");
    w.begin_array();
    w.bool(true);
    w.null();
    w.begin_object();
    w.end_object();
    w.end_array();
    w.end_object();
    let o = w.finish();
    let text = std::str::from_utf8(o.as_bytes()).unwrap();
    assert_eq!(
        text,
        r#"{"s":"a\"b\n\u0001","n":-7,"f":1.0,"nan":"NaN","list":[true,null,{}]}"#
    );
    // The tape the writer built equals the one the tokenizer builds from the text.
    assert_eq!(o, JsonObject::parse(o.as_bytes().to_vec()).unwrap());
}

#[test]
fn copied_values_keep_a_valid_tape() {
    let src = parse(r#"{"x": {"y": [1, {"z": "\u00e9"}]}, "k": "v"}"#).unwrap();
    let mut w = JsonWriter::new();
    w.begin_object();
    w.key("copy");
    w.value(src.view().root().get("x").unwrap());
    w.key("k");
    w.value(src.view().root().get("k").unwrap());
    w.end_object();
    let o = w.finish();
    assert_eq!(o, JsonObject::parse(o.as_bytes().to_vec()).unwrap());
    assert_eq!(
        to_serde(&o),
        json!({"copy": {"y": [1, {"z": "é"}]}, "k": "v"})
    );
}

#[test]
fn patches_set_and_remove_nested_fields() {
    let o = parse(r#"{"a": 1, "user": {"email": "x@y", "name": "n"}, "tags": ["t"]}"#).unwrap();
    let p = |path: &str| path.split('.').map(str::to_string).collect::<Vec<_>>();
    let patched = o
        .apply(&[
            PatchOp::Remove {
                path: p("user.email"),
            },
            PatchOp::Set {
                path: p("a"),
                value: b"\"one\"".to_vec(),
            },
            PatchOp::Set {
                path: p("geo.country.code"),
                value: b" \"FR\" ".to_vec(),
            },
            PatchOp::Remove { path: p("missing") },
        ])
        .unwrap();
    assert_eq!(
        to_serde(&patched),
        json!({"a": "one", "user": {"name": "n"}, "tags": ["t"], "geo": {"country": {"code": "FR"}}})
    );
    assert_eq!(
        patched,
        JsonObject::parse(patched.as_bytes().to_vec()).unwrap()
    );
    assert_eq!(to_serde(&o)["a"], 1, "the original is unchanged");
    let e = o
        .apply(&[PatchOp::Set {
            path: p("a.b"),
            value: b"1".to_vec(),
        }])
        .unwrap_err();
    assert!(matches!(e, JsonError::PatchPath(_)), "{e}");
    assert!(
        o.apply(&[PatchOp::Set {
            path: p("a"),
            value: b"{bad".to_vec()
        }])
        .is_err()
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// The tokenizer accepts exactly the objects serde_json accepts (duplicate keys
    /// aside), and reads them back to the same values.
    #[test]
    fn agrees_with_serde_json(text in r#"[{}\[\]":,0-9a-c. \\u\-eE+tfnrl]{0,40}"#) {
        let ours = parse(&text);
        let theirs = serde_json::from_str::<serde_json::Value>(&text);
        match (&ours, &theirs) {
            (Ok(o), Ok(v)) => prop_assert!(same(&to_serde(o), v), "{:?} vs {:?}", to_serde(o), v),
            (Err(JsonError::DuplicateKey(_)), Ok(_)) => {}
            (Err(JsonError::NotAnObject(_)), Ok(v)) => prop_assert!(!v.is_object()),
            (Err(_), Err(_)) => {}
            _ => prop_assert!(false, "{text:?}: ours {ours:?}, serde_json {theirs:?}"),
        }
    }

    /// Arbitrary bytes never panic.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        let _ = JsonObject::parse(bytes);
    }

    /// The field index the agent sends a plugin, read off the tape, is what the SDK
    /// finds by scanning the text (`floe_json_scan::object_members`): compact, pretty
    /// (with surrounding whitespace) and rewritten by a patch.
    #[test]
    fn field_spans_from_the_tape_match_a_scan(v in arb_object()) {
        let compact = v.to_string();
        let pretty = format!(" \n {} \t", serde_json::to_string_pretty(&v).unwrap());
        let o = JsonObject::from_map(v.as_object().unwrap());
        let patched = o
            .apply(&[PatchOp::Set { path: vec!["zz".into()], value: br#""x\"y""#.to_vec() }])
            .unwrap();
        for text in [compact.as_bytes(), pretty.as_bytes(), patched.as_bytes()] {
            let parsed = JsonObject::parse(text.to_vec()).unwrap();
            let spans: Vec<_> = parsed.view().field_spans().collect();
            let scanned: Vec<_> = floe_json_scan::object_members(text)
                .map(|m| floe_sdk::wire::FieldSpan {
                    key: (m.key.0 as u32, m.key.1 as u32),
                    escaped: m.escaped,
                    value: (m.value.0 as u32, m.value.1 as u32),
                })
                .collect();
            prop_assert_eq!(&spans, &scanned);
            prop_assert_eq!(spans.len(), v.as_object().unwrap().len() + usize::from(text == patched.as_bytes()));
        }
    }

    /// Whatever the writer writes, the tokenizer reads back identically.
    #[test]
    fn writer_and_tokenizer_agree(v in arb_object()) {
        let o = JsonObject::from_map(v.as_object().unwrap());
        let mut w = JsonWriter::new();
        w.value(Value::Object(o.view().root()));
        let copied = w.finish();
        prop_assert_eq!(&copied, &o);
        prop_assert_eq!(to_serde(&copied), v);
    }
}

/// Equal, with floats compared to the last bit or two (serde_json's default float
/// parser does not always round correctly; Rust's does).
fn same(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value as V;
    match (a, b) {
        (V::Number(x), V::Number(y)) if x.is_f64() || y.is_f64() => {
            let (x, y) = (
                x.as_f64().unwrap_or(f64::NAN),
                y.as_f64().unwrap_or(f64::NAN),
            );
            x == y || (x - y).abs() <= x.abs().max(y.abs()) * 4.0 * f64::EPSILON
        }
        (V::Array(x), V::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
        }
        (V::Object(x), V::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

fn arb_object() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::Bool),
        any::<i64>().prop_map(|i| json!(i)),
        (-1e6f64..1e6).prop_map(|f| json!(f)),
        "[a-z\"\\\\\n\u{e9}]{0,6}".prop_map(serde_json::Value::String),
    ];
    let value = leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
            proptest::collection::btree_map("[a-d]{1,2}", inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    });
    proptest::collection::btree_map("[a-e]{1,3}", value, 0..5)
        .prop_map(|m| serde_json::Value::Object(m.into_iter().collect()))
}

/// A small object: keys from `a`, `b`, `c`, values numbers, strings, null or objects.
fn small_object() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        any::<i8>().prop_map(|n| json!(n)),
        Just(json!(null)),
        Just(json!("s")),
    ];
    leaf.prop_recursive(3, 16, 3, |inner| {
        prop::collection::btree_map(prop::sample::select(vec!["a", "b", "c"]), inner, 0..3)
            .prop_map(|m| serde_json::to_value(m).unwrap())
    })
}

fn small_op() -> impl Strategy<Value = PatchOp> {
    let path = prop::collection::vec(
        prop::sample::select(vec!["a".to_string(), "b".to_string(), "c".to_string()]),
        1..4,
    );
    prop_oneof![
        (path.clone(), any::<i8>()).prop_map(|(path, n)| PatchOp::Set {
            path,
            value: n.to_string().into_bytes(),
        }),
        path.clone().prop_map(|path| PatchOp::Remove { path }),
        (path, prop::sample::select(vec!["a", "b", "c", "d"])).prop_map(|(path, to)| {
            PatchOp::Rename {
                path,
                to: to.to_string(),
            }
        }),
    ]
}

#[test]
fn a_rename_keeps_the_place_and_replaces_a_field_of_that_name() {
    let o = parse(r#"{"a": 1, "b": 2, "c": {"d": 3, "e": 4}}"#).unwrap();
    let rename = |path: &[&str], to: &str| PatchOp::Rename {
        path: path.iter().map(|s| s.to_string()).collect(),
        to: to.to_string(),
    };
    let compact = |o: &JsonObject| String::from_utf8_lossy(o.as_bytes()).replace(' ', "");
    let renamed = o.apply(&[rename(&["a"], "x")]).unwrap();
    assert_eq!(compact(&renamed), r#"{"x":1,"b":2,"c":{"d":3,"e":4}}"#);
    let over = o.apply(&[rename(&["b"], "a")]).unwrap();
    assert_eq!(compact(&over), r#"{"a":2,"c":{"d":3,"e":4}}"#);
    let both = o
        .apply(&[rename(&["c", "e"], "f"), rename(&["a"], "z")])
        .unwrap();
    assert_eq!(compact(&both), r#"{"z":1,"b":2,"c":{"d":3,"f":4}}"#);
    assert_eq!(both, JsonObject::parse(both.as_bytes().to_vec()).unwrap());
    let missing = o
        .apply(&[rename(&["q"], "a"), rename(&["a", "b"], "c")])
        .unwrap();
    assert_eq!(to_serde(&missing), to_serde(&o), "nothing to rename");
}

proptest! {
    /// Disjoint ops applied in one pass give what they give one after the other
    /// (the same object, or an error in both cases).
    #[test]
    fn one_pass_patches_match_one_op_at_a_time(
        root in prop::collection::btree_map(prop::sample::select(vec!["a", "b", "c"]), small_object(), 0..3),
        ops in prop::collection::vec(small_op(), 2..5),
    ) {
        prop_assume!(PatchOp::are_disjoint(&ops));
        let o = JsonObject::from_map(&serde_json::to_value(root).unwrap().as_object().unwrap().clone());
        let mut sequential: Result<JsonObject, JsonError> = Ok(o.clone());
        for op in &ops {
            sequential = sequential.and_then(|cur| cur.apply(std::slice::from_ref(op)));
        }
        let one_pass = o.apply(&ops);
        match (one_pass, sequential) {
            (Ok(a), Ok(b)) => {
                prop_assert_eq!(a.as_bytes(), b.as_bytes());
                prop_assert_eq!(&a, &JsonObject::parse(a.as_bytes().to_vec()).unwrap());
                // The next cases write into these buffers, as a plugin chain does.
                a.recycle();
                b.recycle();
            }
            (Err(_), Err(_)) => {}
            (a, b) => prop_assert!(false, "one pass {:?}, one at a time {:?}", a.map(|o| o.to_serde()), b.map(|o| o.to_serde())),
        }
    }
}

#[test]
fn a_set_through_a_null_parent_makes_it_an_object() {
    let o = JsonObject::parse(br#"{"m": null, "s": 1}"#.to_vec()).unwrap();
    let set = |path: &[&str], v: &str| PatchOp::Set {
        path: path.iter().map(|s| s.to_string()).collect(),
        value: v.as_bytes().to_vec(),
    };
    let both = o.apply(&[set(&["m", "a"], "1"), set(&["m", "b", "c"], "2")]);
    assert_eq!(
        both.unwrap().to_serde(),
        json!({"m": {"a": 1, "b": {"c": 2}}, "s": 1})
    );
    // One after the other (overlapping paths): the second sees the first's object.
    let overlapping = o.apply(&[
        set(&["m", "a"], "1"),
        set(&["m"], "null"),
        set(&["m", "x"], "3"),
    ]);
    assert_eq!(
        overlapping.unwrap().to_serde(),
        json!({"m": {"x": 3}, "s": 1})
    );
    assert!(
        o.apply(&[set(&["s", "a"], "1")]).is_err(),
        "a number is no parent"
    );
    let removed = o.apply(&[PatchOp::Remove {
        path: vec!["m".into(), "a".into()],
    }]);
    assert_eq!(removed.unwrap().to_serde(), json!({"m": null, "s": 1}));
}

#[test]
fn records_parsed_into_shared_tapes_read_as_if_parsed_alone() {
    let texts = [
        r#"{"a": {"b": [1, {"c": 2}]}, "d": "x"}"#,
        r#"{"e": [[], {}], "f": {"g": {"h": null}}}"#,
        r#"{}"#,
        r#"{"z": {"y": [3, 4, {"x": "w"}]}, "v": 1.5}"#,
    ];
    let mut tapes = Tapes::new();
    let parsed: Vec<Parsed<'_>> = texts
        .iter()
        .map(|t| tapes.parse(t.as_bytes()).unwrap())
        .collect();
    // A bad record in between leaves the others as they were.
    let bad = tapes.parse(br#"{"a": [1, }"#).unwrap_err();
    assert_eq!(bad, parse(r#"{"a": [1, }"#).unwrap_err());
    for (text, p) in texts.iter().zip(&parsed) {
        let alone = parse(text).unwrap();
        let shared = tapes.view(*p);
        assert_eq!(shared.bytes(), text.as_bytes());
        assert_eq!(Value::Object(shared.root()).to_serde(), to_serde(&alone));
        assert_eq!(shared.to_object(), alone);
    }
    // Nested containers of a later record point into its own part of the tapes.
    let Some(Value::Object(z)) = tapes.view(parsed[3]).root().get("z") else {
        panic!("z is an object")
    };
    let Some(Value::Array(y)) = z.get("y") else {
        panic!("y is an array")
    };
    assert_eq!(y.len(), 3);
    tapes.clear();
    let again = tapes.parse(br#"{"n": 1}"#).unwrap();
    assert_eq!(tapes.view(again).to_object(), parse(r#"{"n": 1}"#).unwrap());
    // A spike of tokens is not kept after the batch.
    let big = format!("{{\"a\": [{}0]}}", "0,".repeat(Tapes::KEEP_TOKENS));
    let p = tapes.parse(big.as_bytes()).unwrap();
    assert!(tapes.view(p).root().get("a").is_some());
    assert!(tapes.toks.capacity() > Tapes::KEEP_TOKENS);
    tapes.clear();
    assert!(tapes.toks.capacity() <= Tapes::KEEP_TOKENS);
    assert!(tapes.scratch.toks.capacity() <= Tapes::KEEP_TOKENS);
}

#[test]
fn patches_copy_untouched_fields_as_written_with_a_valid_tape() {
    let spaced = " {\n  \"a\" : 1 ,\t\"b\": {\"x\": [1, {\"y\": \"\\u00e9\"}]},\n \"c\": \"k\",\"d\" :null , \"e\": [ ] , \"f\": {\"g\": 2, \"h\": 3} }\n";
    let o = parse(spaced).unwrap();
    let compact = JsonObject::from_map(o.to_serde().as_object().unwrap());
    let p = |path: &str| path.split('.').map(str::to_string).collect::<Vec<_>>();
    let cases: Vec<Vec<PatchOp>> = vec![
        vec![PatchOp::Remove { path: p("c") }],
        vec![
            PatchOp::Remove { path: p("a") },
            PatchOp::Remove { path: p("f") },
        ],
        vec![PatchOp::Rename {
            path: p("c"),
            to: "a".into(),
        }],
        vec![
            PatchOp::Set {
                path: p("f.h"),
                value: b"[4]".to_vec(),
            },
            PatchOp::Remove { path: p("b.x") },
            PatchOp::Set {
                path: p("z"),
                value: b"true".to_vec(),
            },
        ],
    ];
    for ops in &cases {
        let patched = o.apply(ops).unwrap();
        assert_eq!(
            patched,
            JsonObject::parse(patched.as_bytes().to_vec()).unwrap(),
            "tape of {:?}",
            std::str::from_utf8(patched.as_bytes())
        );
        assert_eq!(patched.to_serde(), compact.apply(ops).unwrap().to_serde());
    }
}

#[test]
fn recycled_buffers_are_written_again_from_scratch() {
    // A long object, then a patch of a short one into its buffers: nothing of the long
    // one's text or tape may show through.
    let long = parse(&format!(
        r#"{{"pad": "{}", "n": [1, {{"x": 2}}]}}"#,
        "y".repeat(300)
    ))
    .unwrap();
    let text_at = long.text.as_ptr();
    long.recycle();
    let short = parse(r#"{"a": 1, "tags": ["x"], "b": "c"}"#).unwrap();
    let patched = short
        .view()
        .apply_borrowed(&[
            PatchRef::Remove { path: &["tags"] },
            PatchRef::Set {
                path: &["z"],
                value: br#" {"q": [true]} "#,
            },
        ])
        .unwrap();
    assert_eq!(
        patched.text.as_ptr(),
        text_at,
        "the recycled text buffer is reused"
    );
    // Untouched fields and the value set are copied as written (spaces and all).
    assert_eq!(
        patched.as_bytes(),
        br#"{"a": 1,"b": "c","z":{"q": [true]}}"#
    );
    assert_eq!(
        patched,
        JsonObject::parse(patched.as_bytes().to_vec()).unwrap()
    );

    // A thread keeps at most 2 MiB of spare buffers: a large object's are freed.
    let cap = writer::SPARE_TOTAL_BYTES_MAX;
    let huge = parse(&format!(r#"{{"pad": "{}"}}"#, "y".repeat(cap + (1 << 20)))).unwrap();
    huge.recycle();
    let next = JsonWriter::with_capacity(16);
    assert!(next.into_text().capacity() < 1 << 20);
    for _ in 0..cap / (100 << 10) + 10 {
        parse(&format!(r#"{{"pad": "{}"}}"#, "y".repeat(100 << 10)))
            .unwrap()
            .recycle();
    }
    let kept = writer::spare_bytes();
    assert!(kept > cap / 2 && kept <= cap, "{kept} bytes kept");
}

/// Strings are scanned eight bytes at a time: a quote, a backslash, a control
/// character or a non-ASCII byte at every position of strings around the chunk size
/// must be seen exactly where the byte-by-byte scan saw it (serde_json is the judge).
#[test]
fn string_scan_finds_every_special_byte_at_every_position() {
    for len in 0..=20 {
        for at in 0..len {
            for special in [
                "\\\"", "\\\\", "\\u00e9", "\u{1}", "\t", "\u{7f}", "é", "\"",
            ] {
                let mut s: String = "a".repeat(len);
                s.replace_range(at..at + 1, special);
                let text = format!("{{\"k\": \"{s}\", \"n\": 1}}");
                let ours = parse(&text).map(|o| to_serde(&o));
                let theirs = serde_json::from_str::<serde_json::Value>(&text);
                match (&ours, &theirs) {
                    (Ok(a), Ok(b)) => assert_eq!(a, b, "{text:?}"),
                    (Err(_), Err(_)) => {}
                    _ => panic!("{text:?}: ours {ours:?}, serde_json {theirs:?}"),
                }
            }
        }
    }
}

/// Names and strings the writer writes are escaped as serde_json escapes them, whether
/// the byte to escape falls in the part checked eight bytes at a time or after it.
#[test]
fn written_strings_escape_every_special_byte_at_every_position() {
    for len in 0..=20 {
        for at in 0..len {
            for special in ["\"", "\\", "\n", "\u{1}", "\u{1f}", "\u{7f}", "é"] {
                let mut s: String = "a".repeat(len);
                s.replace_range(at..at + 1, special);
                let mut out = String::new();
                let escaped = writer::write_string(&mut out, &s);
                let expected = serde_json::to_string(&s).unwrap();
                assert_eq!(out, expected, "{s:?}");
                assert_eq!(escaped, expected.len() != s.len() + 2, "{s:?}");
            }
        }
    }
}
