//! Where a value comes from in a delivery, and reading it there: the one grammar of a route's
//! `biz_id` and `execute_time`, a state machine's `row_key` and a SQL handler's `params`.
//!
//! A source is `keys` (the first non-empty of the message's KEYS), `property:NAME` (a message
//! property) or `json:/pointer` (an RFC 6901 pointer into the body, which is parsed as JSON at
//! most once per delivery, [`Body`]). What is missing, and what is found but is not what the
//! reader expected, is said here, in the same words for every reader.
//!
//! This module reads; it must not judge what it read: the key rules are [`crate::route`]'s, a
//! statement parameter's type is [`crate::sql_handler`]'s.

use serde_json::Value;

use super::Delivery;

/// The sources, as an error lists them.
const SOURCES: &str = "\"keys\", \"property:NAME\" or \"json:/pointer\"";

/// The longest a found JSON value is shown in a message, in bytes.
const SHOWN_BYTES: usize = 60;

/// Where a value comes from in a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    /// The first non-empty one of the message's KEYS.
    Keys,
    /// A message property, by name.
    Property(String),
    /// An RFC 6901 pointer into the JSON body.
    Json(String),
}

impl Source {
    /// Reads `keys`, `property:NAME` or `json:/pointer`.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("{text:?} {why}; expected {SOURCES}");
        if text == "keys" {
            return Ok(Self::Keys);
        }
        if let Some(name) = text.strip_prefix("property:") {
            if name.is_empty() {
                return Err(bad("names no property"));
            }
            return Ok(Self::Property(name.to_owned()));
        }
        if let Some(pointer) = text.strip_prefix("json:") {
            if !pointer.starts_with('/') {
                return Err(bad("is not a JSON pointer (it must start with '/')"));
            }
            return Ok(Self::Json(pointer.to_owned()));
        }
        Err(bad("is not a value source"))
    }

    /// The source in words: `the message KEYS`, `property NAME`, `JSON field /pointer`.
    pub(crate) fn describe(&self) -> String {
        match self {
            Self::Keys => "the message KEYS".to_owned(),
            Self::Property(name) => format!("property {name}"),
            Self::Json(pointer) => format!("JSON field {pointer}"),
        }
    }

    /// What this source holds in `d`; `body` is `d`'s body. A source that holds nothing (no
    /// KEYS, no such property, no such field or a JSON null, a body that is not JSON) is
    /// refused, with what is missing named.
    pub(crate) fn find<'a>(&'a self, d: &'a Delivery, body: &'a mut Body<'_>) -> Result<Found<'a>, String> {
        match self {
            Self::Keys => d.keys.iter().find(|k| !k.is_empty()).map(|k| Found::Text(k)).ok_or_else(|| {
                if d.keys.is_empty() {
                    "the message has no KEYS".to_owned()
                } else {
                    "the message KEYS are empty".to_owned()
                }
            }),
            Self::Property(name) => {
                d.property(name).map(Found::Text).ok_or_else(|| format!("the message has no property {name}"))
            }
            Self::Json(pointer) => match body.json()?.pointer(pointer) {
                None | Some(Value::Null) => Err(format!("the body has no field {pointer}")),
                Some(value) => Ok(Found::Json { pointer, value }),
            },
        }
    }

    /// What this source holds in `d`, as text ([`Found::text`]).
    pub(crate) fn read(&self, d: &Delivery, body: &mut Body<'_>) -> Result<String, String> {
        self.find(d, body)?.text()
    }
}

/// A value a [`Source`] found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Found<'a> {
    /// A KEY or a property: text, as delivered.
    Text(&'a str),
    /// The JSON value at `pointer`, not null.
    Json { pointer: &'a str, value: &'a Value },
}

impl Found<'_> {
    /// The value as text: a KEY or a property as it is, a JSON string, or a JSON integer
    /// written out. Any other JSON value is refused.
    pub(crate) fn text(&self) -> Result<String, String> {
        match self {
            Self::Text(text) => Ok((*text).to_owned()),
            Self::Json { value: Value::String(s), .. } => Ok(s.clone()),
            Self::Json { value: Value::Number(n), .. } if n.is_i64() || n.is_u64() => Ok(n.to_string()),
            Self::Json { .. } => Err(self.not("a string or an integer")),
        }
    }

    /// Why this value is not the `expected` one: `field /cents is "12", expected an integer`.
    pub(crate) fn not(&self, expected: &str) -> String {
        match self {
            Self::Text(text) => format!("{text:?} is not {expected}"),
            Self::Json { pointer, value } => {
                let mut shown = value.to_string();
                if shown.len() > SHOWN_BYTES {
                    let cut = (0..=SHOWN_BYTES).rev().find(|&i| shown.is_char_boundary(i)).unwrap_or(0);
                    shown.truncate(cut);
                    shown.push('…');
                }
                format!("field {pointer} is {shown}, expected {expected}")
            }
        }
    }
}

/// A delivery's body, parsed as JSON on first need and kept for every other source.
pub(crate) struct Body<'a> {
    raw: &'a [u8],
    parsed: Option<Result<Value, String>>,
}

impl<'a> Body<'a> {
    pub(crate) fn new(raw: &'a [u8]) -> Self {
        Self { raw, parsed: None }
    }

    fn json(&mut self) -> Result<&Value, String> {
        let raw = self.raw;
        self.parsed
            .get_or_insert_with(|| {
                let text = std::str::from_utf8(raw).map_err(|e| {
                    format!("the body is not UTF-8 (invalid byte at offset {})", e.valid_up_to())
                })?;
                serde_json::from_str(text).map_err(|e| format!("the body is not JSON ({e})"))
            })
            .as_ref()
            .map_err(Clone::clone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(source: &str, d: &Delivery) -> Result<String, String> {
        Source::parse(source).unwrap().read(d, &mut Body::new(&d.body))
    }

    #[test]
    fn the_grammar_reads_keys_properties_and_json_pointers_and_refuses_anything_else() {
        assert_eq!(Source::parse("keys"), Ok(Source::Keys));
        assert_eq!(Source::parse("property:USER"), Ok(Source::Property("USER".into())));
        assert_eq!(Source::parse("json:/a/b"), Ok(Source::Json("/a/b".into())));
        let expected = "; expected \"keys\", \"property:NAME\" or \"json:/pointer\"";
        for (text, why) in [
            ("property:", "\"property:\" names no property"),
            ("json:id", "\"json:id\" is not a JSON pointer (it must start with '/')"),
            ("body", "\"body\" is not a value source"),
        ] {
            assert_eq!(Source::parse(text), Err(format!("{why}{expected}")), "{text}");
        }
    }

    #[test]
    fn what_is_missing_or_of_the_wrong_shape_is_named() {
        let d = Delivery {
            keys: vec![String::new(), "K-2".into()],
            properties: [("USER".to_owned(), "u-1".to_owned())].into(),
            body: br#"{"id": "B-1", "n": 42, "f": 1.5, "gone": null}"#.to_vec(),
            ..Default::default()
        };
        assert_eq!(read("keys", &d).as_deref(), Ok("K-2"), "the first non-empty KEY");
        assert_eq!(read("property:USER", &d).as_deref(), Ok("u-1"));
        assert_eq!(read("json:/id", &d).as_deref(), Ok("B-1"));
        assert_eq!(read("json:/n", &d).as_deref(), Ok("42"));
        assert_eq!(read("json:/f", &d), Err("field /f is 1.5, expected a string or an integer".into()));
        assert_eq!(read("json:/gone", &d), Err("the body has no field /gone".into()));
        assert_eq!(read("property:AMOUNT", &d), Err("the message has no property AMOUNT".into()));
        let bare = Delivery { body: b"\xff".to_vec(), ..Default::default() };
        assert_eq!(read("keys", &bare), Err("the message has no KEYS".into()));
        assert_eq!(read("json:/id", &bare), Err("the body is not UTF-8 (invalid byte at offset 0)".into()));
        let long = Delivery { body: format!(r#"{{"x": ["{}"]}}"#, "y".repeat(100)).into_bytes(), ..bare };
        let err = read("json:/x", &long).unwrap_err();
        assert_eq!(err, format!("field /x is [\"{}…, expected a string or an integer", "y".repeat(58)));
    }
}
