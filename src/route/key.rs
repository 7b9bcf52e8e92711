//! A business key and its rules: the limits and the characters a `biz_type` or `biz_id` may
//! hold, how a valid key is stored (exactly as written) and a refused one shown (an escaped,
//! bounded excerpt), and the one order a claim key is bound in.

use std::borrow::Cow;
use std::fmt::Write as _;

use crate::store::AnyQuery;

/// Longest `biz_type`, in characters (the column is VARCHAR(64)).
pub(crate) const MAX_BIZ_TYPE_CHARS: usize = 64;
/// Longest `biz_id`, in characters (the column is VARCHAR(128)). Order numbers, UUIDs and
/// composite keys such as `ORDER-2026-000123:LINE-2` fit with room to spare.
pub(crate) const MAX_BIZ_ID_CHARS: usize = 128;
/// Longest msgId, UNIQ_KEY and consumer group, in characters.
pub(crate) const MAX_ID_CHARS: usize = 128;
/// Longest topic and tags, in characters (RocketMQ's own topic limit is 127).
pub(crate) const MAX_TOPIC_CHARS: usize = 255;

/// Punctuation allowed in a `biz_id` or `biz_type` besides letters and digits.
///
/// Quotes, angle brackets, semicolons, backslashes, whitespace and control characters never
/// belong in a business key; where they appear, a producer is broken or someone is probing.
pub(crate) const KEY_PUNCTUATION: &str = "-_.:/@#+=,|~";

/// The business key a delivery claims, checked against every rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BizKey {
    pub biz_type: String,
    pub biz_id: String,
    /// Epoch milliseconds of a delayed message's scheduled time; 0 for ordinary messages.
    pub execute_time: i64,
    /// The handler that applies the effect.
    pub handler: String,
}

/// Binds a claim key in the one order every statement on a key names its columns:
/// `consumer_group = ? AND biz_type = ? AND biz_id = ? AND execute_time = ?` (and the claim
/// tables' insert, whose first four columns they are).
pub(crate) fn bind_key(
    q: AnyQuery,
    consumer_group: &str,
    biz_type: &str,
    biz_id: &str,
    execute_time: i64,
) -> AnyQuery {
    q.bind(consumer_group).bind(biz_type).bind(biz_id).bind(execute_time)
}

impl BizKey {
    /// Binds this key claimed by `consumer_group` ([`bind_key`]'s order).
    pub fn bind_in(&self, q: AnyQuery, consumer_group: &str) -> AnyQuery {
        bind_key(q, consumer_group, &self.biz_type, &self.biz_id, self.execute_time)
    }

    /// Binds `biz_type = ? AND biz_id = ? AND execute_time = ?`, for a statement that names the
    /// consumer group once for many keys.
    pub fn bind_parts(&self, q: AnyQuery) -> AnyQuery {
        q.bind(self.biz_type.as_str()).bind(self.biz_id.as_str()).bind(self.execute_time)
    }
}

/// Checks a biz_id or biz_type: 1 to `max` characters, letters, digits and [`KEY_PUNCTUATION`].
pub(crate) fn check_key_text(text: &str, max: usize) -> Result<(), String> {
    if text.is_empty() {
        return Err("is empty".to_owned());
    }
    let n = text.chars().count();
    if n > max {
        return Err(format!("is {n} characters long; the limit is {max}"));
    }
    if let Some((pos, c)) =
        text.chars().enumerate().find(|(_, c)| !(c.is_alphanumeric() || KEY_PUNCTUATION.contains(*c)))
    {
        return Err(format!(
            "has a forbidden character {} (U+{:04X}) at position {}; allowed are letters, digits and {}",
            c.escape_debug(),
            c as u32,
            pos + 1,
            KEY_PUNCTUATION.chars().map(String::from).collect::<Vec<_>>().join(" ")
        ));
    }
    Ok(())
}

/// A biz_id or biz_type as the delivery log stores it (`max` is its column's size in
/// characters): a key that passes [`check_key_text`] exactly as it is, byte for byte, since the
/// claim tables, the archive, the reconciler and replay look it up by that same text; anything
/// else (a key refused as invalid) as its [`excerpt`]. What is stored for a refused key is
/// never a valid key (it is the refused text itself, or holds the backslash or `…` that
/// escaping or cutting added, which no key may hold), so a refused message's row can never be
/// taken for a claimed key's.
pub(crate) fn stored_key(text: &str, max: usize) -> Cow<'_, str> {
    match check_key_text(text, max) {
        Ok(()) => Cow::Borrowed(text),
        Err(_) => Cow::Owned(excerpt(text, max)),
    }
}

/// A printable rendition of untrusted text: control and invisible characters, quotes and
/// backslashes escaped, cut to `max` characters with a note of the full length. Safe for a log
/// line and a VARCHAR(max). A combining mark stays on the letter it follows (Thai `สั่ง`,
/// Devanagari `क्ष` stay readable and searchable); only one that opens the text, with nothing
/// to combine with, is escaped.
pub(crate) fn excerpt(text: &str, max: usize) -> String {
    let escaped: String = text.escape_debug().collect();
    if escaped.chars().count() <= max {
        return escaped;
    }
    let note = format!("…({} chars)", text.chars().count());
    let keep = max.saturating_sub(note.chars().count());
    let mut out: String = escaped.chars().take(keep).collect();
    let _ = write!(out, "{note}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys as their scripts write them: Thai and Devanagari with combining vowel signs, Han
    /// with a character outside the Basic Multilingual Plane (four bytes in UTF-8), Hebrew and
    /// Arabic (right to left, Arabic with its vowel marks), digits of each script, and a key
    /// that opens with a combining mark (which a rendition for reading escapes).
    const KEYS_IN_MANY_SCRIPTS: [&str; 6] =
        ["สีดำ-ดี-๑๒", "आदेश-कु-१२", "订单-𠮷-7", "הזמנה-42", "طلب-مُحَمَّد-١٢٣", "\u{e35}ด"];

    #[test]
    fn a_valid_key_in_any_script_is_stored_exactly_as_it_is() {
        for key in KEYS_IN_MANY_SCRIPTS {
            assert_eq!(check_key_text(key, MAX_BIZ_ID_CHARS), Ok(()), "{key}");
            assert!(matches!(stored_key(key, MAX_BIZ_ID_CHARS), Cow::Borrowed(k) if k == key), "{key:?}");
        }
    }

    #[test]
    fn a_refused_key_is_stored_as_a_readable_excerpt_that_no_valid_key_equals() {
        let long = "9".repeat(300);
        for (refused, stored) in [
            // Emoji are not letters or digits.
            ("ORDER-😀", "ORDER-😀"),
            // A Thai tone mark is not a letter either, yet the key stays readable.
            ("สั่ง-1", "สั่ง-1"),
            ("x'y", "x\\'y"),
            ("a\u{0}b", "a\\0b"),
            ("\u{e48}x y", "\\u{e48}x y"),
        ] {
            assert!(check_key_text(refused, MAX_BIZ_ID_CHARS).is_err(), "{refused:?}");
            assert_eq!(stored_key(refused, MAX_BIZ_ID_CHARS), stored, "{refused:?}");
            assert!(check_key_text(stored, MAX_BIZ_ID_CHARS).is_err(), "{stored:?} passes for a valid key");
        }
        let cut = stored_key(&long, MAX_BIZ_ID_CHARS);
        assert!(cut.ends_with("…(300 chars)") && cut.chars().count() == MAX_BIZ_ID_CHARS, "{cut}");
        assert!(check_key_text(&cut, MAX_BIZ_ID_CHARS).is_err());
    }
}
