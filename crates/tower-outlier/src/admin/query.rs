//! The query of a `/history` request: which ticks a reader wants, so that a program polling the
//! history reads each tick once rather than the whole kept history every time.

use std::fmt;

/// Which ticks of the history a reader asked for: those numbered after `since`, oldest first, at
/// most `limit` of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct TickPage {
    pub(super) since: u64,
    pub(super) limit: Option<usize>,
}

/// A `/history` query that names a page but not in numbers: answered 400, with this text.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct BadQuery {
    parameter: &'static str,
    value: String,
}

impl fmt::Display for BadQuery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let wanted = match self.parameter {
            "since" => "a tick's number (`seq`), 0 for the oldest kept",
            _ => "a count of ticks, from 1 to 18446744073709551615",
        };
        write!(
            f,
            "`{}` must be {wanted}: got `{}`",
            self.parameter, self.value
        )
    }
}

impl TickPage {
    /// Reads `since=<seq>` and `limit=<n>` from a URI's query; other parameters are left alone,
    /// as a server leaves a cache-busting one. A parameter given twice counts as its last.
    pub(super) fn parse(query: Option<&str>) -> Result<TickPage, BadQuery> {
        let mut page = TickPage::default();
        for pair in query.unwrap_or("").split('&') {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let bad = |parameter| BadQuery {
                parameter,
                value: value.chars().take(64).collect(),
            };
            match name {
                "since" => page.since = value.parse().map_err(|_| bad("since"))?,
                "limit" => {
                    page.limit = Some(
                        value
                            .parse()
                            .ok()
                            .filter(|&limit: &usize| limit > 0)
                            .ok_or_else(|| bad("limit"))?,
                    )
                }
                _ => {}
            }
        }
        Ok(page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_since_and_limit_and_leaves_the_rest() {
        assert_eq!(TickPage::parse(None), Ok(TickPage::default()));
        assert_eq!(
            TickPage::parse(Some("since=42&limit=10&_=1733")),
            Ok(TickPage {
                since: 42,
                limit: Some(10)
            })
        );
        assert_eq!(
            TickPage::parse(Some("limit=1&limit=3")),
            Ok(TickPage {
                since: 0,
                limit: Some(3)
            })
        );
    }

    #[test]
    fn refuses_what_is_not_a_number_saying_which() {
        for (query, says) in [
            ("since=-1", "`since` must be a tick's number"),
            ("since=", "`since` must be"),
            ("since=99999999999999999999999", "`since` must be"),
            (
                "limit=0",
                "`limit` must be a count of ticks, from 1 to 18446744073709551615: got `0`",
            ),
            ("limit=ten", "got `ten`"),
        ] {
            let refused = TickPage::parse(Some(query)).unwrap_err().to_string();
            assert!(refused.contains(says), "{query}: {refused}");
        }
    }
}
