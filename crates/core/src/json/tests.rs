//! Tests of the duplicate-detecting JSON reader.

use super::*;

fn duplicate_of(text: &str) -> DuplicateKey {
    match parse(text) {
        Err(ParseError::DuplicateKey(duplicate)) => duplicate,
        other => panic!("{text}: {other:?}"),
    }
}

fn key(key: &str) -> PathSegment {
    PathSegment::Key(key.to_owned())
}

#[test]
fn json_without_repeats_reads_as_serde_json_reads_it() {
    for text in [
        "null",
        "true",
        "-3",
        "18446744073709551615",
        "-9223372036854775808",
        "0.5",
        "1e+30",
        r#""a\nb\u00e9""#,
        "[]",
        "{}",
        " [1, {\"a\": 1, \"b\": [null, {\"a\": 2}]}, [[]], \"x\"] \n",
        r#"{"a": {"a": {"a": 1}}, "b": [{"a": 1}, {"a": 1}]}"#,
        // Keys are compared unescaped: `a\u0063` is `ac`, another key.
        r#"{"ab": 1, "a\u0063": 2}"#,
    ] {
        let expected: Value = serde_json::from_str(text).unwrap();
        assert_eq!(parse(text).unwrap(), expected, "{text}");
    }
}

#[test]
fn a_repeat_at_any_depth_is_named_with_its_path() {
    for (text, repeated, path) in [
        (r#"{"a": 1, "a": 1}"#, "a", vec![]),
        (r#"{"a": 1, "b": 2, "a": 3}"#, "a", vec![]),
        (
            r#"[{"resource": "a", "count": 100, "count": 200, "timeWindow": 10}]"#,
            "count",
            vec![PathSegment::Index(0)],
        ),
        (
            r#"{"a": [0, {"b": {"x": 1, "y": {}, "x": {}}}]}"#,
            "x",
            vec![key("a"), PathSegment::Index(1), key("b")],
        ),
        (r#"[[], [[{}, {"k": 1, "k": 2}]]]"#, "k", {
            vec![
                PathSegment::Index(1),
                PathSegment::Index(0),
                PathSegment::Index(1),
            ]
        }),
        // JSON escapes are resolved before keys are compared.
        (r#"{"ab": 1, "a\u0062": 2}"#, "ab", vec![]),
    ] {
        let duplicate = duplicate_of(text);
        assert_eq!(duplicate.key(), repeated, "{text}");
        assert_eq!(duplicate.path(), path, "{text}");
    }
}

#[test]
fn the_first_repeat_in_reading_order_is_reported() {
    // An inner repeat read before an outer one.
    let duplicate = duplicate_of(r#"{"a": {"x": 1, "x": 2}, "b": 1, "b": 2}"#);
    assert_eq!((duplicate.key(), duplicate.path()), ("x", &[key("a")][..]));
    // A repeated key is read before its value, which repeats too.
    let duplicate = duplicate_of(r#"{"k": 1, "k": {"y": 1, "y": 2}}"#);
    assert_eq!((duplicate.key(), duplicate.path()), ("k", &[][..]));
    // Later elements do not disturb the path of an earlier repeat.
    let duplicate =
        duplicate_of(r#"[{"a": 1}, {"b": 1, "b": 2, "c": {"d": 1, "d": 1}}, {"e": [1]}]"#);
    assert_eq!(
        (duplicate.key(), duplicate.path()),
        ("b", &[PathSegment::Index(1)][..])
    );
    let duplicate = duplicate_of(r#"{"p": [{"q": {"z": 0, "z": 0}}, {"r": 1, "r": 1}], "s": 1}"#);
    assert_eq!(
        (duplicate.key(), duplicate.path()),
        ("z", &[key("p"), PathSegment::Index(0), key("q")][..])
    );
}

#[test]
fn malformed_json_is_reported_before_a_repeat() {
    for text in [
        r#"{"a": 1, "a": 2"#,
        r#"{"a": 1, "a": 2,}"#,
        r#"{"a": {}, "a": {"x": 1e400}}"#,
        r#"{"a": {}, "a": {"x": }}"#,
        r#"{"a": 1, "a": 2} x"#,
        r#"{"a": 1, "a": 2} {}"#,
        "",
        "\u{feff}{}",
    ] {
        match parse(text) {
            Err(ParseError::Syntax(error)) => {
                assert!(error.line() >= 1, "{text}: {error}");
            }
            other => panic!("{text}: {other:?}"),
        }
    }
    // serde_json's own message and position.
    let Err(ParseError::Syntax(error)) = parse("{\"a\": 1,\n \"a\" 2}") else {
        panic!("not a syntax error");
    };
    assert_eq!((error.line(), error.column()), (2, 6));
}

#[test]
fn deep_nesting_fails_at_serde_json_limit() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert!(matches!(parse(&deep), Err(ParseError::Syntax(_))));
    let deep = format!("{}1{}", r#"{"a":"#.repeat(100_000), "}".repeat(100_000));
    assert!(matches!(parse(&deep), Err(ParseError::Syntax(_))));
    // Within the limit, a deep repeat has its whole path.
    let text = format!(r#"{}{{"x":1,"x":2}}{}"#, "[".repeat(100), "]".repeat(100));
    assert_eq!(duplicate_of(&text).path(), vec![PathSegment::Index(0); 100]);
}

#[test]
fn messages_show_names_clipped_and_escaped() {
    assert_eq!(
        duplicate_of(r#"{"a": 1, "a": 2}"#).to_string(),
        "key `a` is given more than once in the top-level object"
    );
    let duplicate = duplicate_of(r#"{"rules": [{"on": true}, {"on": true, "on": false}]}"#);
    assert_eq!(
        duplicate.to_string(),
        "key `on` is given more than once in the object at `rules[1]`"
    );
    let error = parse(r#"{"a": 1, "a": 2}"#).unwrap_err();
    assert_eq!(
        error.to_string(),
        "key `a` is given more than once in the top-level object"
    );
    assert!(std::error::Error::source(&error).is_none());
    let error = parse("{").unwrap_err();
    assert!(
        error.to_string().starts_with("not valid JSON: EOF"),
        "{error}"
    );
    assert!(std::error::Error::source(&error).is_some());

    // Control characters are escaped; long names and deep paths are clipped.
    let duplicate = duplicate_of(r#"{"x\n\u001b[31m": {"evil\nkey": 1, "evil\nkey": 2}}"#);
    assert_eq!(duplicate.key(), "evil\nkey");
    assert_eq!(
        duplicate.to_string(),
        r#"key `"evil\nkey"` is given more than once in the object at `"x\n\u{1b}[31m"`"#
    );
    let long = "n".repeat(100_000);
    let duplicate = duplicate_of(&format!(r#"{{"{long}": {{"{long}": 1, "{long}": 2}}}}"#));
    assert_eq!(duplicate.key().len(), 100_000);
    let message = duplicate.to_string();
    assert!(message.chars().count() < 250, "{message}");
    let deep = format!(
        r#"{}{{"x":1,"x":2}}{}"#,
        r#"{"key":"#.repeat(120),
        "}".repeat(120)
    );
    let message = duplicate_of(&deep).to_string();
    assert!(message.chars().count() < 200, "{message}");
    assert!(message.ends_with("…`"), "{message}");
}

#[test]
fn errors_are_send_sync_and_box_into_dyn_error() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<ParseError>();
    let boxed: Box<dyn std::error::Error + Send + Sync> =
        Box::new(parse(r#"{"a":1,"a":1}"#).unwrap_err());
    assert!(boxed.to_string().contains("`a`"));
}

#[test]
fn nodes_read_non_objects_as_serde_json_reads_them() {
    for text in [
        "null",
        "true",
        "-3",
        "18446744073709551615",
        "0.5",
        "1e+30",
        r#""a\nb""#,
        r#"[1, {"a": 1, "a": 2}, [null]]"#,
    ] {
        let expected: Value = serde_json::from_str(text).unwrap();
        match serde_json::from_str::<Node<Value>>(text).unwrap() {
            Node::Other(value) => assert_eq!(value, expected, "{text}"),
            Node::Object { .. } => panic!("{text} read as an object"),
        }
    }
}

#[test]
fn nodes_record_their_first_duplicate_key() {
    let document: Node<Node<Value>> =
        serde_json::from_str(r#"{"b": {"x": 1, "y": 2, "x": 3, "y": 4}, "a": 1, "b": {}, "a": 2}"#)
            .unwrap();
    let Node::Object { entries, duplicate } = document else {
        panic!("not an object");
    };
    assert_eq!(duplicate.as_deref(), Some("b"));
    assert_eq!(entries.keys().collect::<Vec<_>>(), ["a", "b"]);
    // The first value of a repeated key is kept.
    assert!(matches!(&entries["a"], Node::Other(value) if *value == 1));
    let Node::Object { entries, duplicate } = &entries["b"] else {
        panic!("not an object");
    };
    assert_eq!(duplicate.as_deref(), Some("x"));
    assert_eq!(entries["x"], 1);
    assert_eq!(entries["y"], 2);
}

#[test]
fn nodes_report_malformed_json_after_a_duplicate() {
    assert!(serde_json::from_str::<Node<Node<Value>>>(r#"{"a": {}, "a": {"x": 1e400}}"#).is_err());
    assert!(serde_json::from_str::<Node<Node<Value>>>(r#"{"a": {}, "a": {"x": }}"#).is_err());
}
