//! The text and the values of a configured SQL handler's statements: where `:name` placeholders
//! stand (outside string literals, quoted identifiers, comments and PostgreSQL's `::` casts),
//! the statement rewritten with positional placeholders for each backend, and the typed values a
//! delivery gives its parameters (`json:/pointer:type`, `property:NAME`, the key's own names).
//! This file parses and reads; it must not run statements or format a value into SQL.

use std::collections::BTreeMap;

use crate::delivery::Delivery;
use crate::route::BizKey;
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
    /// `json:/pointer` (text) or `json:/pointer:type`: an RFC 6901 pointer into the JSON body.
    Json { pointer: String, kind: Kind },
    /// `property:NAME`: a message property, as text.
    Property(String),
    /// One of [`BUILT_IN`].
    BuiltIn(&'static str),
}

impl Source {
    /// Reads `json:/pointer[:type]` or `property:NAME`.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        if let Some(name) = text.strip_prefix("property:") {
            if name.is_empty() {
                return Err(format!("{text:?} names no property"));
            }
            return Ok(Self::Property(name.to_owned()));
        }
        let Some(rest) = text.strip_prefix("json:") else {
            return Err(format!(
                "{text:?} is not a parameter source; expected \"json:/pointer\", \"json:/pointer:TYPE\" \
                 (TYPE int, float, bool, epoch_ms or text) or \"property:NAME\""
            ));
        };
        if !rest.starts_with('/') {
            return Err(format!("{text:?} is not a JSON pointer (it must start with '/')"));
        }
        // A last `:word` with no '/' after it is the type.
        if let Some((pointer, suffix)) = rest.rsplit_once(':')
            && !suffix.contains('/')
        {
            let Some((_, kind)) = Kind::NAMES.iter().find(|(name, _)| *name == suffix) else {
                return Err(format!(
                    "{text:?}: {suffix:?} is not a parameter type; use int, float, bool, epoch_ms or text"
                ));
            };
            return Ok(Self::Json { pointer: pointer.to_owned(), kind: *kind });
        }
        Ok(Self::Json { pointer: rest.to_owned(), kind: Kind::Text })
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

/// The delivery's body as JSON, parsed on first need and kept for the other parameters.
pub(crate) struct Body<'a> {
    raw: &'a [u8],
    parsed: Option<Result<serde_json::Value, String>>,
}

impl<'a> Body<'a> {
    pub(crate) fn new(raw: &'a [u8]) -> Self {
        Self { raw, parsed: None }
    }

    fn json(&mut self) -> Result<&serde_json::Value, String> {
        let raw = self.raw;
        self.parsed
            .get_or_insert_with(|| {
                serde_json::from_slice(raw).map_err(|e| format!("the body is not JSON: {e}"))
            })
            .as_ref()
            .map_err(Clone::clone)
    }
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
        Source::Property(name) => d
            .properties
            .get(name)
            .map(|v| Value::Text(v.clone()))
            .ok_or_else(|| format!("property {name} is missing")),
        Source::Json { pointer, kind } => {
            let found = body.json()?.pointer(pointer);
            let Some(found) = found.filter(|v| !v.is_null()) else {
                return Err(format!("json:{pointer} is missing from the body"));
            };
            typed(found, *kind).ok_or_else(|| {
                let mut shown = found.to_string();
                if shown.len() > 60 {
                    let cut = (0..=60).rev().find(|&i| shown.is_char_boundary(i)).unwrap_or(0);
                    shown.truncate(cut);
                    shown.push('…');
                }
                format!("json:{pointer} is {shown}, not {}", kind.describe())
            })
        }
    }
}

fn typed(v: &serde_json::Value, kind: Kind) -> Option<Value> {
    match kind {
        Kind::Text => v.as_str().map(|s| Value::Text(s.to_owned())),
        Kind::Int => v.as_i64().map(Value::Int),
        Kind::Float => v.as_f64().map(Value::Float),
        Kind::Bool => v.as_bool().map(Value::Bool),
        Kind::EpochMs => match v {
            serde_json::Value::String(s) => {
                chrono::DateTime::parse_from_rfc3339(s).ok().map(|t| Value::Int(t.timestamp_millis()))
            }
            other => other.as_i64().map(Value::Int),
        },
    }
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
        assert_eq!(
            Source::parse("json:/cents:int"),
            Ok(Source::Json { pointer: "/cents".into(), kind: Kind::Int })
        );
        assert_eq!(Source::parse("json:/a/b"), Ok(Source::Json { pointer: "/a/b".into(), kind: Kind::Text }));
        assert_eq!(
            Source::parse("json:/a:b/c"),
            Ok(Source::Json { pointer: "/a:b/c".into(), kind: Kind::Text })
        );
        assert_eq!(Source::parse("property:USER"), Ok(Source::Property("USER".into())));
        assert!(Source::parse("json:/cents:integer").unwrap_err().contains("not a parameter type"));
        assert!(Source::parse("json:cents").is_err());
        assert!(Source::parse("keys").is_err());

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
        assert_eq!(wrong, "parameter s: json:/s is \"12\", not an integer");
        let gone = values(&["gone".into()], &sources, &d, &key, &mut Body::new(&d.body)).unwrap_err();
        assert_eq!(gone, "parameter gone: json:/gone is missing from the body");
        let bad = Delivery { body: b"not json".to_vec(), ..Default::default() };
        let err = values(&["cents".into()], &sources, &bad, &key, &mut Body::new(&bad.body)).unwrap_err();
        assert!(err.starts_with("parameter cents: the body is not JSON"), "{err}");
    }
}
