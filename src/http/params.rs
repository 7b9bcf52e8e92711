//! Query-string parameters, read leniently but bounded: a query string longer than
//! [`MAX_QUERY_BYTES`] or not valid URL encoding is refused with its reason, never a panic.

use crate::inspect::InspectError;

/// The longest query string a page or API call accepts.
pub(crate) const MAX_QUERY_BYTES: usize = 4096;

/// Decoded `name=value` pairs; the first of a repeated name wins.
#[derive(Debug, Default)]
pub(crate) struct Params(Vec<(String, String)>);

impl Params {
    pub(crate) fn parse(raw: Option<&str>) -> Result<Self, InspectError> {
        let raw = raw.unwrap_or("");
        if raw.len() > MAX_QUERY_BYTES {
            return Err(InspectError::BadRequest(format!(
                "the query string is {} bytes; the most accepted is {MAX_QUERY_BYTES}",
                raw.len()
            )));
        }
        serde_urlencoded::from_str::<Vec<(String, String)>>(raw).map(Self).map_err(|e| {
            InspectError::BadRequest(format!("the query string is not valid URL encoding ({e})"))
        })
    }

    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_decoded_and_hostile_ones_refused_with_a_reason() {
        let p = Params::parse(Some("biz_id=%3Cscript%3E&biz_id=second&by=biz_id")).unwrap();
        assert_eq!(p.get("biz_id"), Some("<script>"));
        assert_eq!(p.get("missing"), None);
        let long = "q=".to_owned() + &"x".repeat(MAX_QUERY_BYTES);
        assert!(Params::parse(Some(&long)).unwrap_err().to_string().contains("bytes"));
        // Bytes that are not UTF-8 decode to U+FFFD rather than failing the page.
        assert_eq!(Params::parse(Some("q=%FF")).unwrap().get("q"), Some("\u{FFFD}"));
    }
}
