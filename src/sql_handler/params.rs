//! The text and the values of a configured SQL handler's statements: where `:name` placeholders
//! stand (outside string literals, quoted identifiers, comments and PostgreSQL's `::` casts),
//! the statement rewritten with positional placeholders for each backend, and the typed values a
//! delivery gives its parameters: read where [`crate::delivery::value`]'s grammar says (`keys`,
//! `property:NAME`, `json:/pointer`, a pointer with a `:type`), or the key's own names, then
//! converted to the parameter's type. This file parses and converts; it must not run
//! statements or format a value into SQL.

use std::collections::BTreeMap;

use crate::delivery::Delivery;
use crate::delivery::value::{self, Body, Found};
use crate::route::{BizKey, parse_execute_time};
use crate::store::Written;

/// The parameters every statement may use without declaring them, read from the delivery's key
/// and message.
pub(crate) const BUILT_IN: [&str; 5] = ["biz_id", "biz_type", "execute_time", "msg_id", "uniq_key"];

/// A statement as written, its `:name` placeholders found.
#[derive(Debug, Clone)]
pub(crate) struct Parsed {
    /// The statement with `?` placeholders and with `$n` ones.
    pub written: Written,
    /// The parameter of each placeholder, in order: a name used twice is bound twice.
    pub names: Vec<String>,
    /// The statement's first word, upper-cased: `INSERT`, `SELECT`, …
    pub verb: String,
    /// The table an INSERT, UPDATE or DELETE writes (the first one named; without its schema
    /// and quotes), when [`target_table`] can tell.
    pub table: Option<String>,
}

/// Finds the `:name` placeholders of `sql` and rewrites them as positional ones. Refused, with
/// the reason: an unterminated literal, quoted identifier or comment; a positional placeholder
/// (`?`, `$1`) of its own; more than one statement.
pub(crate) fn parse(sql: &str) -> Result<Parsed, String> {
    let chars: Vec<char> = sql.chars().collect();
    let mut portable = String::with_capacity(sql.len());
    let mut numbered = String::with_capacity(sql.len() + 8);
    let mut names = Vec::new();
    let mut verb = String::new();
    let mut ended = false;
    let mut i = 0;
    // Copies chars[from..to] into both texts.
    let copy = |portable: &mut String, numbered: &mut String, from: usize, to: usize| {
        let piece: String = chars[from..to].iter().collect();
        portable.push_str(&piece);
        numbered.push_str(&piece);
    };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let start = i;
        // Comments and whitespace may follow the end of the statement; nothing else may.
        if c == '-' && next == Some('-') {
            i = chars[i..].iter().position(|&c| c == '\n').map_or(chars.len(), |p| i + p);
            copy(&mut portable, &mut numbered, start, i);
            continue;
        }
        if c == '/' && next == Some('*') {
            let close =
                (i + 2..chars.len().saturating_sub(1)).find(|&j| chars[j] == '*' && chars[j + 1] == '/');
            let Some(close) = close else { return Err("a /* comment is not closed".to_owned()) };
            i = close + 2;
            copy(&mut portable, &mut numbered, start, i);
            continue;
        }
        if c.is_whitespace() {
            portable.push(c);
            numbered.push(c);
            i += 1;
            continue;
        }
        if ended {
            return Err("holds more than one statement: write each as an entry of its own".to_owned());
        }
        match c {
            ';' => {
                ended = true;
                i += 1;
            }
            '\'' => {
                // E'…' (PostgreSQL) escapes with backslashes; elsewhere a quote is doubled.
                let backslashes = start > 0
                    && matches!(chars[start - 1], 'e' | 'E')
                    && (start < 2 || !is_word(chars[start - 2]));
                i = close_quote(&chars, i, '\'', backslashes)
                    .ok_or_else(|| "a string literal is not closed".to_owned())?;
                copy(&mut portable, &mut numbered, start, i);
            }
            '"' | '`' => {
                i = close_quote(&chars, i, c, false)
                    .ok_or_else(|| format!("a {c}quoted identifier{c} is not closed"))?;
                copy(&mut portable, &mut numbered, start, i);
            }
            '$' => {
                // $tag$ … $tag$ (PostgreSQL's dollar quoting), or a positional `$1`.
                if next.is_some_and(|n| n.is_ascii_digit()) {
                    return Err("uses a positional $n placeholder: write parameters as :name".to_owned());
                }
                let tag_end = (i + 1..chars.len()).find(|&j| !is_word(chars[j]));
                match tag_end {
                    Some(j) if chars[j] == '$' => {
                        let tag: String = chars[i..=j].iter().collect();
                        let body: String = chars[j + 1..].iter().collect();
                        let Some(p) = body.find(&tag) else {
                            return Err(format!("a {tag}-quoted string is not closed"));
                        };
                        i = j + 1 + body[..p].chars().count() + tag.chars().count();
                        copy(&mut portable, &mut numbered, start, i);
                    }
                    _ => {
                        portable.push(c);
                        numbered.push(c);
                        i += 1;
                    }
                }
            }
            '?' => {
                return Err(
                    "uses a positional ? placeholder (or a ? operator): write parameters as :name".to_owned()
                );
            }
            ':' if next == Some(':') => {
                // A PostgreSQL cast, `x::int`: not a parameter.
                portable.push_str("::");
                numbered.push_str("::");
                i += 2;
            }
            ':' if next.is_some_and(|n| n.is_ascii_alphabetic() || n == '_') => {
                let end = (i + 1..chars.len()).find(|&j| !is_word(chars[j])).unwrap_or(chars.len());
                names.push(chars[i + 1..end].iter().collect());
                portable.push('?');
                numbered.push('$');
                numbered.push_str(&names.len().to_string());
                i = end;
            }
            _ if is_word(c) => {
                let end = (i..chars.len()).find(|&j| !is_word(chars[j])).unwrap_or(chars.len());
                if verb.is_empty() {
                    verb = chars[i..end].iter().collect::<String>().to_ascii_uppercase();
                }
                copy(&mut portable, &mut numbered, start, end);
                i = end;
            }
            _ => {
                portable.push(c);
                numbered.push(c);
                i += 1;
            }
        }
    }
    if verb.is_empty() {
        return Err("is empty".to_owned());
    }
    Ok(Parsed {
        written: Written::new(portable.trim_end().to_owned(), numbered.trim_end().to_owned()),
        names,
        table: target_table(&chars),
        verb,
    })
}

/// The words between the verb and the table: `INSERT [LOW_PRIORITY | DELAYED | HIGH_PRIORITY]
/// [IGNORE] [INTO]`, SQLite's `INSERT OR REPLACE INTO`, `UPDATE [LOW_PRIORITY] [IGNORE]
/// [ONLY]`, `DELETE [LOW_PRIORITY] [QUICK] [IGNORE] FROM [ONLY]`.
const BEFORE_TABLE: [&str; 13] = [
    "LOW_PRIORITY",
    "DELAYED",
    "HIGH_PRIORITY",
    "IGNORE",
    "INTO",
    "QUICK",
    "FROM",
    "ONLY",
    "OR",
    "REPLACE",
    "ABORT",
    "FAIL",
    "ROLLBACK",
];

/// The table an INSERT, UPDATE or DELETE (already parsed, so its quotes and comments close)
/// writes: the name after the verb and its modifiers, a `schema.` before it dropped, quotes
/// taken off. `None` for any other verb or a shape it does not know.
fn target_table(chars: &[char]) -> Option<String> {
    let mut i = 0;
    let mut words = 0;
    let mut name: Option<String> = None;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c.is_whitespace() {
            i += 1;
        } else if c == '-' && next == Some('-') {
            i = chars[i..].iter().position(|&c| c == '\n').map_or(chars.len(), |p| i + p);
        } else if c == '/' && next == Some('*') {
            i = (i + 2..chars.len().saturating_sub(1)).find(|&j| chars[j] == '*' && chars[j + 1] == '/')? + 2;
        } else if c == '.' && name.is_some() {
            // `schema.table`: the part after the dot is the table.
            name = None;
            i += 1;
        } else if name.is_some() {
            break;
        } else if c == '"' || c == '`' {
            let end = close_quote(chars, i, c, false)?;
            let doubled: String = [c, c].iter().collect();
            name = Some(chars[i + 1..end - 1].iter().collect::<String>().replace(&doubled, &c.to_string()));
            i = end;
        } else if is_word(c) {
            let end = (i..chars.len()).find(|&j| !is_word(chars[j])).unwrap_or(chars.len());
            let word: String = chars[i..end].iter().collect();
            words += 1;
            let upper = word.to_ascii_uppercase();
            if words == 1 {
                if !["INSERT", "UPDATE", "DELETE"].contains(&upper.as_str()) {
                    return None;
                }
            } else if !BEFORE_TABLE.contains(&upper.as_str()) {
                name = Some(word);
            }
            i = end;
        } else {
            return None;
        }
    }
    name
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The index after the quote that closes the one at `open`: a doubled quote is part of the
/// text, and with `backslashes` so is a quote after a backslash.
fn close_quote(chars: &[char], open: usize, quote: char, backslashes: bool) -> Option<usize> {
    let mut j = open + 1;
    while j < chars.len() {
        match chars[j] {
            '\\' if backslashes => j += 2,
            c if c == quote => {
                if chars.get(j + 1) == Some(&quote) {
                    j += 2;
                } else {
                    return Some(j + 1);
                }
            }
            _ => j += 1,
        }
    }
    None
}

/// The type a JSON parameter is read as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A JSON string.
    Text,
    /// A JSON integer (64-bit).
    Int,
    /// A JSON number.
    Float,
    /// `true` or `false`.
    Bool,
    /// An integer of epoch milliseconds, or an RFC 3339 text converted to them.
    EpochMs,
}

impl Kind {
    const NAMES: [(&'static str, Kind); 5] = [
        ("text", Kind::Text),
        ("int", Kind::Int),
        ("float", Kind::Float),
        ("bool", Kind::Bool),
        ("epoch_ms", Kind::EpochMs),
    ];

    fn describe(self) -> &'static str {
        match self {
            Kind::Text => "a string",
            Kind::Int => "an integer",
            Kind::Float => "a number",
            Kind::Bool => "true or false",
            Kind::EpochMs => "epoch milliseconds or an RFC 3339 time",
        }
    }
}

/// Where a parameter's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    /// A place in the delivery, and the type its value is read as: text, but for a JSON
    /// pointer written with a type (`json:/pointer:int`).
    Delivery { from: value::Source, kind: Kind },
    /// One of [`BUILT_IN`].
    BuiltIn(&'static str),
}

impl Source {
    /// Reads a source of the delivery's grammar ([`value::Source::parse`]), where a JSON pointer
    /// may end in `:TYPE`.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        // A last `:word` with no '/' after it is the type.
        if let Some(rest) = text.strip_prefix("json:")
            && let Some((pointer, suffix)) = rest.rsplit_once(':')
            && !suffix.contains('/')
        {
            let Some((_, kind)) = Kind::NAMES.iter().find(|(name, _)| *name == suffix) else {
                return Err(format!(
                    "{text:?}: {suffix:?} is not a parameter type; use int, float, bool, epoch_ms or text"
                ));
            };
            let from = value::Source::parse(&format!("json:{pointer}"))?;
            return Ok(Self::Delivery { from, kind: *kind });
        }
        Ok(Self::Delivery { from: value::Source::parse(text)?, kind: Kind::Text })
    }

    /// The built-in source `name` stands for, if it is one.
    pub(crate) fn built_in(name: &str) -> Option<Self> {
        BUILT_IN.iter().find(|b| **b == name).map(|b| Self::BuiltIn(b))
    }
}

/// A value bound to a statement.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Text(String),
    Int(i64),
    Float(f64),
    Bool(bool),
}

/// The values of `names`, read from the delivery as `sources` say. The error names the
/// parameter and says what is missing or of the wrong type.
pub(crate) fn values(
    names: &[String],
    sources: &BTreeMap<String, Source>,
    d: &Delivery,
    key: &BizKey,
    body: &mut Body<'_>,
) -> Result<Vec<Value>, String> {
    names
        .iter()
        .map(|name| {
            let source = sources.get(name).expect("every placeholder's parameter was checked at load");
            read(source, d, key, body).map_err(|why| format!("parameter {name}: {why}"))
        })
        .collect()
}

fn read(source: &Source, d: &Delivery, key: &BizKey, body: &mut Body<'_>) -> Result<Value, String> {
    match source {
        Source::BuiltIn(name) => Ok(match *name {
            "biz_id" => Value::Text(key.biz_id.clone()),
            "biz_type" => Value::Text(key.biz_type.clone()),
            "execute_time" => Value::Int(key.execute_time),
            "msg_id" => Value::Text(d.msg_id.clone()),
            _ => Value::Text(d.uniq_key.clone()),
        }),
        Source::Delivery { from, kind } => typed(&from.find(d, body)?, *kind),
    }
}

/// `found` as a value of `kind`. A time is read as a route reads an execute_time
/// ([`parse_execute_time`]): epoch milliseconds or an RFC 3339 time, not before 1970.
fn typed(found: &Found<'_>, kind: Kind) -> Result<Value, String> {
    let json = match found {
        // KEYS and properties are text: only a JSON pointer is written with a type.
        Found::Text(text) => return Ok(Value::Text((*text).to_owned())),
        Found::Json { value, .. } => value,
    };
    let converted = match kind {
        Kind::Text => json.as_str().map(|s| Value::Text(s.to_owned())),
        Kind::Int => json.as_i64().map(Value::Int),
        Kind::Float => json.as_f64().map(Value::Float),
        Kind::Bool => json.as_bool().map(Value::Bool),
        Kind::EpochMs => {
            let text = found.text().map_err(|_| found.not(kind.describe()))?;
            return parse_execute_time(&text).map(Value::Int);
        }
    };
    converted.ok_or_else(|| found.not(kind.describe()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(sql: &str) -> (String, String, Vec<String>) {
        let p = parse(sql).unwrap_or_else(|e| panic!("{sql:?}: {e}"));
        (
            p.written.portable().to_owned(),
            p.written.text(crate::store::Backend::Postgres).as_str().to_owned(),
            p.names,
        )
    }

    #[test]
    fn named_placeholders_become_positional_and_a_repeated_one_is_bound_twice() {
        let (q, n, names) = texts("UPDATE w SET b = b + :cents WHERE u = :user AND :cents > 0");
        assert_eq!(q, "UPDATE w SET b = b + ? WHERE u = ? AND ? > 0");
        assert_eq!(n, "UPDATE w SET b = b + $1 WHERE u = $2 AND $3 > 0");
        assert_eq!(names, ["cents", "user", "cents"]);
    }

    #[test]
    fn the_table_a_statement_writes_is_read_past_its_modifiers_schema_and_quotes() {
        let table = |sql: &str| parse(sql).unwrap_or_else(|e| panic!("{sql:?}: {e}")).table;
        for (sql, expected) in [
            ("INSERT INTO wallet_ledger (credit_id) VALUES (:biz_id)", Some("wallet_ledger")),
            ("insert /* a note */ ignore into `shop`.`wallet ledger`(a) VALUES (1)", Some("wallet ledger")),
            ("INSERT OR REPLACE INTO t VALUES (1)", Some("t")),
            ("UPDATE ONLY public.\"Wallet\"\"s\" SET b = 1", Some("Wallet\"s")),
            ("UPDATE LOW_PRIORITY wallet SET b = 1", Some("wallet")),
            ("DELETE -- old rows\n FROM coupon WHERE code = :biz_id", Some("coupon")),
            ("SELECT x FROM t", None),
        ] {
            assert_eq!(table(sql).as_deref(), expected, "{sql}");
        }
    }

    #[test]
    fn casts_literals_identifiers_and_comments_hold_no_parameter() {
        let (q, n, names) = texts(
            "INSERT INTO \"t:x\" (a, `b:c`) VALUES (:a::bigint, 'it''s :not, ?', E'\\':no', $$ :no $$) -- :no ?\n/* :no */;",
        );
        assert_eq!(names, ["a"]);
        assert_eq!(
            q,
            "INSERT INTO \"t:x\" (a, `b:c`) VALUES (?::bigint, 'it''s :not, ?', E'\\':no', $$ :no $$) -- :no ?\n/* :no */"
        );
        assert!(n.contains("VALUES ($1::bigint, 'it''s :not, ?'"), "{n}");
        let (q, _, names) = texts("SELECT x FROM t WHERE y = :y_1 AND z = 'a:b' AND w := 3");
        assert_eq!(names, ["y_1"]);
        assert!(q.ends_with("y = ? AND z = 'a:b' AND w := 3"), "{q}");
        assert_eq!(parse("  delete from t").unwrap().verb, "DELETE");
    }

    #[test]
    fn what_cannot_be_parsed_is_refused() {
        for (sql, why) in [
            ("SELECT 'open", "string literal is not closed"),
            ("SELECT \"open", "quoted identifier"),
            ("SELECT 1 /* open", "comment is not closed"),
            ("UPDATE t SET a = ?", "positional ? placeholder"),
            ("UPDATE t SET a = $1", "positional $n placeholder"),
            ("DELETE FROM t; DROP TABLE t", "more than one statement"),
            ("  -- nothing\n", "is empty"),
        ] {
            let err = parse(sql).unwrap_err();
            assert!(err.contains(why), "{sql:?}: {err}");
        }
    }

    #[test]
    fn sources_are_read_with_their_type() {
        let json = |pointer: &str, kind| Source::Delivery { from: value::Source::Json(pointer.into()), kind };
        assert_eq!(Source::parse("json:/cents:int"), Ok(json("/cents", Kind::Int)));
        assert_eq!(Source::parse("json:/a/b"), Ok(json("/a/b", Kind::Text)));
        assert_eq!(Source::parse("json:/a:b/c"), Ok(json("/a:b/c", Kind::Text)));
        assert_eq!(
            Source::parse("property:USER"),
            Ok(Source::Delivery { from: value::Source::Property("USER".into()), kind: Kind::Text })
        );
        assert_eq!(
            Source::parse("keys"),
            Ok(Source::Delivery { from: value::Source::Keys, kind: Kind::Text })
        );
        assert!(Source::parse("json:/cents:integer").unwrap_err().contains("not a parameter type"));
        assert!(Source::parse("json:cents").unwrap_err().contains("is not a JSON pointer"));
        assert!(Source::parse("body").unwrap_err().contains("is not a value source"));

        let d = Delivery {
            body: br#"{"cents": 250, "user": "u-1", "at": "2026-01-02T03:04:05.006Z", "f": 1.5, "ok": true, "s": "12"}"#
                .to_vec(),
            ..Default::default()
        };
        let key = BizKey { biz_type: "t".into(), biz_id: "B-1".into(), execute_time: 7, handler: "h".into() };
        let sources: BTreeMap<String, Source> = [
            ("cents", "json:/cents:int"),
            ("user", "json:/user"),
            ("at", "json:/at:epoch_ms"),
            ("ms", "json:/cents:epoch_ms"),
            ("f", "json:/f:float"),
            ("ok", "json:/ok:bool"),
            ("s", "json:/s:int"),
            ("gone", "json:/gone:int"),
        ]
        .into_iter()
        .map(|(n, s)| (n.to_owned(), Source::parse(s).unwrap()))
        .chain([
            ("biz_id".to_owned(), Source::BuiltIn("biz_id")),
            ("execute_time".to_owned(), Source::BuiltIn("execute_time")),
        ])
        .collect();
        let names: Vec<String> =
            ["cents", "user", "at", "ms", "f", "ok", "biz_id", "execute_time"].map(String::from).to_vec();
        let got = values(&names, &sources, &d, &key, &mut Body::new(&d.body)).unwrap();
        assert_eq!(
            got,
            [
                Value::Int(250),
                Value::Text("u-1".into()),
                Value::Int(1_767_323_045_006),
                Value::Int(250),
                Value::Float(1.5),
                Value::Bool(true),
                Value::Text("B-1".into()),
                Value::Int(7),
            ]
        );
        let wrong = values(&["s".into()], &sources, &d, &key, &mut Body::new(&d.body)).unwrap_err();
        assert_eq!(wrong, "parameter s: field /s is \"12\", expected an integer");
        let gone = values(&["gone".into()], &sources, &d, &key, &mut Body::new(&d.body)).unwrap_err();
        assert_eq!(gone, "parameter gone: the body has no field /gone");
        let bad = Delivery { body: b"not json".to_vec(), ..Default::default() };
        let err = values(&["cents".into()], &sources, &bad, &key, &mut Body::new(&bad.body)).unwrap_err();
        assert!(err.starts_with("parameter cents: the body is not JSON"), "{err}");
    }

    /// A route of topic `t` whose execute_time comes from property `AT`, and whose bizId is
    /// the message's property `USER`.
    fn route_reading_user_and_at() -> crate::route::Routes {
        crate::route::Routes::new(&[crate::route::RouteConfig {
            topic: "t".into(),
            tags: "*".into(),
            biz_type: "wallet.credit".into(),
            biz_id: "property:USER".into(),
            execute_time: Some("property:AT".into()),
            handler: None,
        }])
        .unwrap()
    }

    /// What a SQL handler's parameter `name`, read from `source`, makes of `d`.
    fn parameter(name: &str, source: &str, d: &Delivery) -> Result<Vec<Value>, String> {
        let key = BizKey { biz_type: "t".into(), biz_id: "B-1".into(), execute_time: 0, handler: "h".into() };
        let sources = BTreeMap::from([(name.to_owned(), Source::parse(source).unwrap())]);
        values(&[name.to_owned()], &sources, d, &key, &mut Body::new(&d.body))
    }

    #[test]
    fn a_missing_property_is_named_alike_by_a_route_and_a_sql_handler_parameter() {
        let d = Delivery { topic: "t".into(), ..Default::default() };
        let rejection = route_reading_user_and_at().resolve(&d).unwrap_err();
        assert_eq!(rejection.reason, "biz_id: the message has no property USER");
        let refusal = parameter("user", "property:USER", &d).unwrap_err();
        assert_eq!(refusal, "parameter user: the message has no property USER");
    }

    #[test]
    fn a_time_before_1970_is_refused_alike_by_a_route_and_a_sql_handler_parameter() {
        for (at, json, why) in [
            ("-5", "-5", "-5 is before 1970"),
            ("1969-12-31T23:59:59Z", "\"1969-12-31T23:59:59Z\"", "-1000 is before 1970"),
        ] {
            let d = Delivery {
                topic: "t".into(),
                properties: [("USER".to_owned(), "u-1".to_owned()), ("AT".to_owned(), at.to_owned())].into(),
                body: format!(r#"{{"at": {json}}}"#).into_bytes(),
                ..Default::default()
            };
            let rejection = route_reading_user_and_at().resolve(&d).unwrap_err();
            assert_eq!(rejection.reason, format!("execute_time: {why}"));
            let refusal = parameter("at", "json:/at:epoch_ms", &d).unwrap_err();
            assert_eq!(refusal, format!("parameter at: {why}"));
        }
        let d = Delivery { body: br#"{"at": 0}"#.to_vec(), ..Default::default() };
        assert_eq!(
            parameter("at", "json:/at:epoch_ms", &d),
            Ok(vec![Value::Int(0)]),
            "1970 itself is a time"
        );
    }
}
