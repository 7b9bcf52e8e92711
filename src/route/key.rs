//! A business key and its rules: the limits and the characters a `biz_type` or `biz_id` may
//! hold, how a valid key is stored (exactly as written) and a refused one shown (an escaped,
//! bounded excerpt, which [`delivered_text`] reads back), how the ids and names a delivery
//! carries are stored, and the one order a claim key is bound in.

use std::borrow::Cow;
use std::fmt::Write as _;

use unicode_properties::{GeneralCategoryGroup, UnicodeGeneralCategory};

use crate::store::AnyQuery;

/// Longest `biz_type`, in characters (the column is VARCHAR(64)).
pub const MAX_BIZ_TYPE_CHARS: usize = 64;
/// Longest `biz_id`, in characters (the column is VARCHAR(128)). Order numbers, UUIDs and
/// composite keys such as `ORDER-2026-000123:LINE-2` fit with room to spare.
pub const MAX_BIZ_ID_CHARS: usize = 128;
/// Longest msgId, UNIQ_KEY and consumer group, in characters.
pub const MAX_ID_CHARS: usize = 128;
/// Longest topic and tags, in characters (RocketMQ's own topic limit is 127).
pub(crate) const MAX_TOPIC_CHARS: usize = 255;

/// Punctuation allowed in a `biz_id` or `biz_type` besides the characters of words.
///
/// Quotes, angle brackets, semicolons, backslashes, whitespace and control characters never
/// belong in a business key; where they appear, a producer is broken or someone is probing.
pub(crate) const KEY_PUNCTUATION: &str = "-_.:/@#+=,|~";

/// ZERO WIDTH NON-JOINER and ZERO WIDTH JOINER: invisible, yet part of how Persian, Urdu and the
/// Indian scripts spell words (`می‌خواهم`, `क्‍ष`). A key may hold them between the characters of
/// a word, never at its edge or beside punctuation, where they could only hide a difference.
const JOINERS: [char; 2] = ['\u{200C}', '\u{200D}'];

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
    pub(crate) fn bind_in(&self, q: AnyQuery, consumer_group: &str) -> AnyQuery {
        bind_key(q, consumer_group, &self.biz_type, &self.biz_id, self.execute_time)
    }

    /// Binds `biz_type = ? AND biz_id = ? AND execute_time = ?`, for a statement that names the
    /// consumer group once for many keys.
    pub(crate) fn bind_parts(&self, q: AnyQuery) -> AnyQuery {
        q.bind(self.biz_type.as_str()).bind(self.biz_id.as_str()).bind(self.execute_time)
    }
}

/// Whether `c` is a character of a word in some script: a letter, a combining mark (Mn, Mc,
/// Me: vowel signs, the virama and the pulli, Thai tone marks, Arabic and Hebrew points), a
/// number (digits of every script), or what `is_alphanumeric` has always let through besides
/// (letter-like symbols such as `Ⓐ`), so that no key valid before is refused now. Controls,
/// format characters, separators, other symbols, private-use and unassigned code points are not.
fn is_word_char(c: char) -> bool {
    c.is_alphanumeric()
        || matches!(
            c.general_category_group(),
            GeneralCategoryGroup::Letter | GeneralCategoryGroup::Mark | GeneralCategoryGroup::Number
        )
}

/// Checks a biz_id or biz_type: 1 to `max` characters, each a character of a word in some
/// script ([`is_word_char`]), a joiner between two of them ([`JOINERS`]), or [`KEY_PUNCTUATION`].
pub fn check_key_text(text: &str, max: usize) -> Result<(), String> {
    if text.is_empty() {
        return Err("is empty".to_owned());
    }
    let n = text.chars().count();
    if n > max {
        return Err(format!("is {n} characters long; the limit is {max}"));
    }
    let chars: Vec<char> = text.chars().collect();
    for (pos, &c) in chars.iter().enumerate() {
        if is_word_char(c) || KEY_PUNCTUATION.contains(c) {
            continue;
        }
        let word_on_both_sides = pos > 0
            && chars.get(pos - 1).copied().is_some_and(is_word_char)
            && chars.get(pos + 1).copied().is_some_and(is_word_char);
        if JOINERS.contains(&c) && word_on_both_sides {
            continue;
        }
        let what = if JOINERS.contains(&c) {
            "a joiner that does not stand between two characters of a word".to_owned()
        } else {
            format!("a forbidden character {}", c.escape_debug())
        };
        return Err(format!(
            "has {what} (U+{:04X}) at position {}; allowed are letters, combining marks and digits of \
             any script, ZWNJ and ZWJ within a word, and {}",
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
/// never a valid key: it is the refused text itself, or holds the backslash or `…` that
/// escaping or cutting added, which no key may hold. So a refused message's row can never be
/// taken for a claimed key's, and [`delivered_text`] reads the refused text back from it.
pub(crate) fn stored_key(text: &str, max: usize) -> Cow<'_, str> {
    match check_key_text(text, max) {
        Ok(()) => Cow::Borrowed(text),
        Err(_) => Cow::Owned(excerpt(text, max)),
    }
}

/// A msgId, UNIQ_KEY, topic or tag as the claim and the delivery log store it (`max` is its
/// column's size in characters): exactly as delivered when it fits and can be stored (no NUL,
/// which PostgreSQL's text cannot hold), so that the claim, the log, the trace and the
/// reconciler all hold and compare the same text; else (a delivery refused for it) as its
/// [`excerpt`].
pub(crate) fn stored_id(text: &str, max: usize) -> Cow<'_, str> {
    if text.chars().count() <= max && !text.contains('\0') {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(excerpt(text, max))
    }
}

/// A printable rendition of untrusted text: control and invisible characters, quotes and
/// backslashes escaped, cut to `max` characters with a note of the full length. Safe for a log
/// line and a VARCHAR(max). A combining mark stays on the letter it follows (Thai `สั่ง`,
/// Devanagari `क्ष` stay readable and searchable); only one that opens the text, with nothing
/// to combine with, is escaped, and so are the invisible joiners (`\u{200c}`).
pub fn excerpt(text: &str, max: usize) -> String {
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

/// The text as delivered, read back from what [`stored_key`] stored for it: the text itself
/// for a valid key, the unescaped [`excerpt`] for a refused one. `None` when `stored` is no
/// excerpt of anything. A cut excerpt reads back as its kept part with the note, which holds
/// `…` and so passes for no key.
pub(crate) fn delivered_text(stored: &str) -> Option<String> {
    let mut out = String::with_capacity(stored.len());
    let mut chars = stored.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        out.push(match chars.next()? {
            '\\' => '\\',
            '\'' => '\'',
            '"' => '"',
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            '0' => '\0',
            'u' => {
                let rest = chars.as_str().strip_prefix('{')?;
                let (hex, after) = rest.split_once('}')?;
                let c = u32::from_str_radix(hex, 16).ok().and_then(char::from_u32)?;
                chars = after.chars();
                c
            }
            _ => return None,
        });
    }
    // Only what escaping makes: `\u{41}` is not how an excerpt writes `A`.
    let rendered: String = out.escape_debug().collect();
    (rendered == stored || !stored.contains('\\')).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys as their scripts write them: Thai with vowel signs and tone marks, Devanagari and
    /// Bengali with the virama (conjuncts `क्ष`, `श्री`, `স্ক`), Tamil with the pulli, Persian with a
    /// zero-width non-joiner inside a word, Devanagari with a zero-width joiner after a virama,
    /// Han with a character outside the Basic Multilingual Plane (four bytes in UTF-8), Hangul,
    /// Hebrew with points, Arabic with its vowel marks, digits of each script, a Japanese
    /// ideograph with a variation selector, and a key that opens with a combining mark (which
    /// a rendition for reading escapes).
    const KEYS_IN_MANY_SCRIPTS: [&str; 16] = [
        "สีดำ-ดี-๑๒",
        "สั่ง-1",
        "आदेश-कु-१२",
        "क्ष-1",
        "श्री-42",
        "স্কুল-৭",
        "தமிழ்-௧௨",
        "می\u{200c}خواهم-۱۲",
        "क्\u{200d}ष-3",
        "订单-𠮷-7",
        "주문-한글-9",
        "הזמנה-42",
        "שָׁלוֹם-1",
        "طلب-مُحَمَّد-١٢٣",
        "葛\u{e0100}城-1",
        "\u{e35}ด",
    ];

    #[test]
    fn a_valid_key_in_any_script_is_stored_exactly_as_it_is() {
        for key in KEYS_IN_MANY_SCRIPTS {
            assert_eq!(check_key_text(key, MAX_BIZ_ID_CHARS), Ok(()), "{key}");
            assert!(matches!(stored_key(key, MAX_BIZ_ID_CHARS), Cow::Borrowed(k) if k == key), "{key:?}");
            assert_eq!(delivered_text(key).as_deref(), Some(key), "{key:?}");
        }
    }

    #[test]
    fn controls_format_characters_separators_and_symbols_stay_refused() {
        for (refused, why) in [
            ("ORDER-😀", "forbidden character 😀 (U+1F600) at position 7"),
            ("a\u{0}b", "forbidden character \\0 (U+0000) at position 2"),
            ("a\u{7f}b", "(U+007F) at position 2"),
            ("a b", "forbidden character   (U+0020) at position 2"),
            ("a\u{a0}b", "(U+00A0) at position 2"),
            ("a\u{3000}b", "(U+3000) at position 2"),
            // Bidi overrides and isolates, which make a key read as another.
            ("abc\u{202e}1-A", "(U+202E) at position 4"),
            ("abc\u{2066}1", "(U+2066) at position 4"),
            ("a\u{200b}b", "(U+200B) at position 2"),
            ("a\u{feff}b", "(U+FEFF) at position 2"),
            // Unassigned and private-use code points.
            ("a\u{378}b", "(U+0378) at position 2"),
            ("a\u{e000}b", "(U+E000) at position 2"),
            // A joiner at an edge of a word or beside punctuation hides a difference.
            (
                "\u{200c}می",
                "a joiner that does not stand between two characters of a word (U+200C) at position 1",
            ),
            ("می\u{200c}", "(U+200C) at position 3"),
            ("می\u{200c}-1", "(U+200C) at position 3"),
            ("a-\u{200d}b", "(U+200D) at position 3"),
            ("x'y", "forbidden character \\' (U+0027) at position 2"),
            ("a\\b", "(U+005C) at position 2"),
            ("a…b", "(U+2026) at position 2"),
        ] {
            let err = check_key_text(refused, MAX_BIZ_ID_CHARS).expect_err(refused);
            assert!(err.contains(why), "{refused:?}: {err}");
        }
    }

    #[test]
    fn a_refused_key_is_stored_as_a_readable_excerpt_that_no_valid_key_equals() {
        let long = "9".repeat(300);
        for (refused, stored) in [
            // Emoji are not letters or digits.
            ("ORDER-😀", "ORDER-😀"),
            // A Thai key with a space: the marks stay on their letters, readable.
            ("สั่ง 1", "สั่ง 1"),
            ("x'y", "x\\'y"),
            ("a\u{0}b", "a\\0b"),
            // A mark that opens the text and a joiner are escaped in the rendition.
            ("\u{e48}x y", "\\u{e48}x y"),
            ("می\u{200c}", "می\\u{200c}"),
            ("a\\u{41}", "a\\\\u{41}"),
        ] {
            assert!(check_key_text(refused, MAX_BIZ_ID_CHARS).is_err(), "{refused:?}");
            assert_eq!(stored_key(refused, MAX_BIZ_ID_CHARS), stored, "{refused:?}");
            assert!(check_key_text(stored, MAX_BIZ_ID_CHARS).is_err(), "{stored:?} passes for a valid key");
            assert_eq!(delivered_text(stored).as_deref(), Some(refused), "{stored:?} reads back");
        }
        let cut = stored_key(&long, MAX_BIZ_ID_CHARS);
        assert!(cut.ends_with("…(300 chars)") && cut.chars().count() == MAX_BIZ_ID_CHARS, "{cut}");
        assert!(check_key_text(&cut, MAX_BIZ_ID_CHARS).is_err());
        let read_back = delivered_text(&cut).expect("a cut excerpt reads back as what it kept");
        assert!(check_key_text(&read_back, MAX_BIZ_ID_CHARS).is_err(), "a cut key passes for none");
    }

    #[test]
    fn text_that_escaping_cannot_have_made_reads_back_as_nothing() {
        for stored in ["a\\", "a\\q", "\\u{41}", "\\u{110000}", "\\u{zz}", "\\u41"] {
            assert_eq!(delivered_text(stored), None, "{stored:?}");
        }
    }

    #[test]
    fn ids_are_stored_as_delivered_unless_too_long_or_holding_a_nul() {
        for id in ["7F000001-'quoted'", "C:\\path\\id", "注文-ID-١", "a\nb"] {
            assert!(matches!(stored_id(id, MAX_ID_CHARS), Cow::Borrowed(k) if k == id), "{id:?}");
        }
        assert_eq!(stored_id("a\u{0}b", MAX_ID_CHARS), "a\\0b");
        let long = "m".repeat(200);
        assert!(stored_id(&long, MAX_ID_CHARS).ends_with("…(200 chars)"));
    }
}
