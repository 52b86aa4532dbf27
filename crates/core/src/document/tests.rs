use super::*;

#[test]
fn builders_for_another_kind_of_problem_change_nothing() {
    let syntax = DocumentError::syntax("doc", "EOF at line 2 column 3".into(), 2, 3);
    let placed = syntax.clone().at_line(9).in_entry("entry", 4);
    assert_eq!(placed, syntax, "malformed JSON keeps its own line");
    assert_eq!(placed.line(), Some(2));

    let invalid = DocumentError::invalid("doc", ConfigError::new("k", 1, "2"), "k".into());
    let unchanged = invalid
        .clone()
        .also_as("K")
        .found_in("`x`".into())
        .naming("block")
        .with_detail(ConfigError::new("k", 1, "2"))
        .entry_named("resource", "r");
    assert_eq!(unchanged, invalid);
    assert_eq!(unchanged.to_string(), "invalid doc: `k` = 1 (allowed: 2)");

    let duplicate = DocumentError::duplicate("doc", "k".into(), "k".into());
    assert_eq!(duplicate.clone().showing_value("\"v\"".into()), duplicate);

    // One place: the last one given.
    let error = invalid
        .in_entry("entry", 1)
        .entry_named("name", "a")
        .at_line(3);
    assert_eq!(
        (error.entry(), error.entry_name(), error.line()),
        (None, None, Some(3))
    );
    assert_eq!(
        error.to_string(),
        "invalid doc on line 3: `k` = 1 (allowed: 2)"
    );
}
