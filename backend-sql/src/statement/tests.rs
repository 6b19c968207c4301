use super::*;

const PG: Style = Style {
    numbered: Some('$'),
    quote: '"',
    binary_names: false,
    returning: true,
    ttl_unit: Duration::from_micros(1),
};

#[test]
fn inline_names_the_parameters_as_routine_arguments_and_keeps_dollar_quotes() {
    let body = Sql::inline("DO $C$ SELECT $name, $ttl::bigint WHERE owner = $owner $C$");
    assert_eq!(
        body,
        "DO $C$ SELECT p_name, p_ttl::bigint WHERE owner = p_owner $C$"
    );
}

#[test]
fn expand_numbers_each_parameter_once_and_leaves_dollar_quote_tags() {
    let s = Sql::new(PG, "locks");
    let stmt = s.done("SELECT $owner, $name, $owner, $B$x$B$");
    assert_eq!(stmt.sql.as_str(), "SELECT $1, $2, $1, $B$x$B$");
    assert_eq!(stmt.binds, [Param::Owner, Param::Name]);
}

#[test]
#[should_panic(expected = "unknown parameter $nmae")]
fn a_misspelt_parameter_is_caught_when_the_statement_is_built() {
    let _ = Sql::inline("SELECT $nmae");
}

#[test]
fn a_parameter_name_may_hold_an_underscore() {
    let s = Sql::new(PG, "locks");
    let stmt = s.done("SELECT GREATEST(fence + 1, $min_token), $name");
    assert_eq!(stmt.sql.as_str(), "SELECT GREATEST(fence + 1, $1), $2");
    assert_eq!(stmt.binds, [Param::MinToken, Param::Name]);
}
