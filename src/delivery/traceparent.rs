//! The trace a message belongs to: the W3C Trace Context `traceparent` property a producer's
//! tracing sets on it (OpenTelemetry's RocketMQ instrumentation writes one), read strictly.
//!
//! A `traceparent` is `version-traceid-parentid-flags`: `00-<32 hex>-<16 hex>-<2 hex>`, lowercase
//! hex only. Version `00` is exactly that, 55 characters. A later version is read as the
//! specification asks: at least 55 characters, the same three fields in the same places, and
//! after the flags either the end or a `-` before fields this reader does not know; version `ff`
//! is forbidden. An all-zero trace id or parent id is invalid.
//!
//! This module owns the reading and the closed set of reasons a `traceparent` is refused
//! ([`TraceparentFault`], the label of `idemgate_invalid_traceparents_total`). It must not
//! refuse a delivery: a message with an unreadable `traceparent` is processed as one without.
//! It reads bytes, never slices text by position, so no value a producer sends can make it
//! panic, and it looks at no more than the fields' 55 bytes and the one after them.

use crate::labelled::labelled;

use super::Delivery;

/// The message property OpenTelemetry's propagators write the W3C trace context to.
pub const TRACEPARENT_PROPERTY: &str = "traceparent";

/// The length of a version `00` traceparent, and the least of any version.
const FIELDS_LEN: usize = 55;
/// Where each field starts and ends, in bytes.
const VERSION: std::ops::Range<usize> = 0..2;
const TRACE_ID: std::ops::Range<usize> = 3..35;
const PARENT_ID: std::ops::Range<usize> = 36..52;
const FLAGS: std::ops::Range<usize> = 53..55;
/// The `-` between the fields.
const DASHES: [usize; 3] = [2, 35, 52];

labelled! {
    /// Why a message's `traceparent` was not read: the closed set of reasons
    /// `idemgate_invalid_traceparents_total` counts.
    TraceparentFault {
        /// The version is not two lowercase hex digits, or is the forbidden `ff`.
        Version => "version",
        /// The wrong length for its version: version `00` is exactly 55 characters, a later
        /// one at least 55.
        Length => "length",
        /// A `-` missing between the fields, or after the flags of a later version's longer value.
        Delimiter => "delimiter",
        /// A field in uppercase hex: the specification allows lowercase only.
        Uppercase => "uppercase",
        /// A field with a character that is not a hex digit.
        NotHex => "not_hex",
        /// The trace id is all zeros.
        ZeroTraceId => "zero_trace_id",
        /// The parent id is all zeros.
        ZeroParentId => "zero_parent_id",
    }
}

/// A W3C trace id: 32 lowercase hex digits, not all zero. What `delivery_log.trace_id` holds
/// and a trace search looks for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TraceId(String);

impl TraceId {
    /// The trace id of a `traceparent` value, read strictly (see the module's documentation).
    pub fn from_traceparent(value: &str) -> Result<Self, TraceparentFault> {
        let b = value.as_bytes();
        let version = b.get(VERSION).ok_or(TraceparentFault::Length)?;
        if !version.iter().all(|c| is_lower_hex(*c)) || version == b"ff" {
            return Err(TraceparentFault::Version);
        }
        let later_version = version != b"00";
        match b.len() {
            FIELDS_LEN => {}
            n if n > FIELDS_LEN && later_version => {
                if b[FIELDS_LEN] != b'-' {
                    return Err(TraceparentFault::Delimiter);
                }
            }
            _ => return Err(TraceparentFault::Length),
        }
        if DASHES.iter().any(|&at| b[at] != b'-') {
            return Err(TraceparentFault::Delimiter);
        }
        for field in [TRACE_ID, PARENT_ID, FLAGS] {
            hex_field(&b[field])?;
        }
        if all_zero(&b[TRACE_ID]) {
            return Err(TraceparentFault::ZeroTraceId);
        }
        if all_zero(&b[PARENT_ID]) {
            return Err(TraceparentFault::ZeroParentId);
        }
        Ok(Self(b[TRACE_ID].iter().map(|&c| char::from(c)).collect()))
    }

    /// A trace id as a person types it into a search: 32 hex digits in either case (a tracing
    /// UI may show them in capitals), not all zero; `None` otherwise. Stored trace ids are
    /// lowercase, so this one is too.
    pub fn from_search(text: &str) -> Option<Self> {
        let b = text.as_bytes();
        let valid = b.len() == TRACE_ID.len() && b.iter().all(u8::is_ascii_hexdigit) && !all_zero(b);
        valid.then(|| Self(text.to_ascii_lowercase()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for TraceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Delivery {
    /// The trace this message belongs to, from its `traceparent` property: `Ok(None)` when it
    /// carries none, the fault when it carries one that cannot be read.
    pub fn trace_id(&self) -> Result<Option<TraceId>, TraceparentFault> {
        self.property(TRACEPARENT_PROPERTY).map(TraceId::from_traceparent).transpose()
    }
}

fn is_lower_hex(c: u8) -> bool {
    c.is_ascii_digit() || (b'a'..=b'f').contains(&c)
}

/// Checks that every byte of a field is a lowercase hex digit.
fn hex_field(field: &[u8]) -> Result<(), TraceparentFault> {
    match field.iter().find(|c| !is_lower_hex(**c)) {
        None => Ok(()),
        Some(c) if c.is_ascii_hexdigit() => Err(TraceparentFault::Uppercase),
        Some(_) => Err(TraceparentFault::NotHex),
    }
}

fn all_zero(field: &[u8]) -> bool {
    field.iter().all(|c| *c == b'0')
}

#[cfg(test)]
mod tests {
    use super::*;
    use TraceparentFault::*;

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn read(value: &str) -> Result<String, TraceparentFault> {
        TraceId::from_traceparent(value).map(|t| t.as_str().to_owned())
    }

    #[test]
    fn a_version_00_traceparent_gives_its_trace_id() {
        assert_eq!(read(VALID), Ok(TRACE.to_owned()));
        assert_eq!(read("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"), Ok(TRACE.to_owned()));
        assert_eq!(read("00-00000000000000000000000000000001-0000000000000001-ff"), Ok("0".repeat(31) + "1"));
    }

    #[test]
    fn a_later_version_is_read_by_its_first_fields_and_may_carry_more() {
        let v = |version: &str, tail: &str| format!("{version}{}{tail}", &VALID[2..]);
        assert_eq!(read(&v("01", "")), Ok(TRACE.to_owned()));
        assert_eq!(read(&v("cc", "-what-comes-next")), Ok(TRACE.to_owned()));
        assert_eq!(read(&v("fe", "-")), Ok(TRACE.to_owned()));
        assert_eq!(read(&v("cc", "x-more")), Err(Delimiter), "after the flags: the end or a '-'");
        assert_eq!(read(&v("00", "-more")), Err(Length), "version 00 has exactly four fields");
    }

    #[test]
    fn the_version_is_two_lowercase_hex_digits_and_never_ff() {
        for version in ["ff", "FF", "0A", "Ab", "0g", "-0", "  ", "é"] {
            let value = format!("{version}{}", &VALID[2..]);
            assert_eq!(read(&value), Err(Version), "{value:?}");
        }
    }

    #[test]
    fn uppercase_hex_is_refused_in_every_field() {
        assert_eq!(read(&VALID.to_uppercase()), Err(Uppercase));
        assert_eq!(read("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"), Err(Uppercase));
        assert_eq!(read("00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01"), Err(Uppercase));
        assert_eq!(read("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0A"), Err(Uppercase));
    }

    #[test]
    fn all_zero_ids_are_invalid() {
        assert_eq!(read(&format!("00-{}-00f067aa0ba902b7-01", "0".repeat(32))), Err(ZeroTraceId));
        assert_eq!(read(&format!("00-{TRACE}-{}-01", "0".repeat(16))), Err(ZeroParentId));
    }

    #[test]
    fn wrong_lengths_and_missing_dashes_are_refused() {
        assert_eq!(read(""), Err(Length));
        assert_eq!(read("0"), Err(Length));
        assert_eq!(read("00"), Err(Length));
        assert_eq!(read(&VALID[..54]), Err(Length));
        assert_eq!(read(&format!("{VALID}0")), Err(Length));
        assert_eq!(read(&format!("00-{TRACE}0-0f067aa0ba902b7-01")), Err(Delimiter), "a trace id of 33");
        assert_eq!(read(&format!("00-{}-00f067aa0ba902b7-01", &TRACE[..31])), Err(Length));
        assert_eq!(read(&VALID.replace('-', "_")), Err(Delimiter));
        assert_eq!(read(&format!("00-{TRACE}-00f067aa0ba902b7_01")), Err(Delimiter));
        assert_eq!(read(&format!(" {}", &VALID[..54])), Err(Version), "no trimming");
        assert_eq!(read(&format!("{VALID} ")), Err(Length), "no trimming");
    }

    #[test]
    fn hostile_values_are_refused_without_panicking() {
        // Multi-byte characters where the fields and dashes are: positions are bytes here.
        let accented = format!("00-{}é-00f067aa0ba902b7-01", &TRACE[..30]);
        assert_eq!(accented.len(), FIELDS_LEN);
        assert_eq!(read(&accented), Err(NotHex));
        let wide = format!("00-{}-00f067aa0ba902b7-€", TRACE);
        assert_eq!(read(&wide), Err(Length));
        let dash_split = format!("00-{}\u{2010}{}", TRACE, "0".repeat(16));
        assert!(read(&dash_split).is_err());
        for hostile in [
            "00-<script>alert(1)</script>aaaaaaaaaaaaaa-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473'-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-\u{0}1",
            "\u{0}\u{0}-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\n",
            "🙂🙂🙂🙂🙂🙂🙂🙂🙂🙂🙂🙂🙂🙂",
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-🙂",
        ] {
            let answer = read(hostile);
            let expected_ok = hostile.starts_with("cc-");
            assert_eq!(answer.is_ok(), expected_ok, "{hostile:?}: {answer:?}");
        }
        let huge = format!("cc-{TRACE}-00f067aa0ba902b7-01-{}", "x".repeat(1 << 20));
        assert_eq!(read(&huge), Ok(TRACE.to_owned()), "a later version may carry more");
        let huge_00 = format!("{VALID}{}", "-x".repeat(1 << 20));
        assert_eq!(read(&huge_00), Err(Length));
    }

    #[test]
    fn a_delivery_without_the_property_has_no_trace_and_one_with_a_bad_one_says_why() {
        let mut d = Delivery::default();
        assert_eq!(d.trace_id(), Ok(None));
        d.properties.insert(TRACEPARENT_PROPERTY.to_owned(), VALID.to_owned());
        assert_eq!(d.trace_id().map(|t| t.map(|t| t.to_string())), Ok(Some(TRACE.to_owned())));
        d.properties.insert(TRACEPARENT_PROPERTY.to_owned(), String::new());
        assert_eq!(d.trace_id(), Err(Length));
        d.properties.remove(TRACEPARENT_PROPERTY);
        d.properties.insert("Traceparent".to_owned(), VALID.to_owned());
        assert_eq!(d.trace_id(), Ok(None), "the property's name is exact");
    }

    #[test]
    fn a_search_takes_32_hex_digits_in_either_case_and_stores_lowercase() {
        assert_eq!(TraceId::from_search(TRACE).map(|t| t.0), Some(TRACE.to_owned()));
        assert_eq!(TraceId::from_search(&TRACE.to_uppercase()).map(|t| t.0), Some(TRACE.to_owned()));
        for not_one in [
            "",
            &TRACE[..31],
            &format!("{TRACE}0"),
            &"0".repeat(32),
            "4bf92f3577b34da6a3ce929d0e0e473g",
            VALID,
        ] {
            assert_eq!(TraceId::from_search(not_one), None, "{not_one:?}");
        }
        assert_eq!(TraceId::from_search("4bf92f3577b34da6a3ce929d0e0e47é"), None);
    }

    #[test]
    fn every_fault_has_a_label_of_its_own() {
        let labels: std::collections::BTreeSet<_> =
            TraceparentFault::ALL.iter().map(|f| f.as_str()).collect();
        assert_eq!(labels.len(), TraceparentFault::ALL.len());
    }
}
