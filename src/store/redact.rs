//! Secrets out of URLs: a database or Redis URL as logs, error messages and `idemgate config`
//! may show it.

/// Hides the secrets of a database or Redis URL, for logs, error messages and `idemgate
/// config`: the password of `user:password@`, and the value of every query parameter whose
/// name looks secret ([`is_secret_parameter`]: `password`, `sslpassword`, `token`, …; the name
/// compared percent-decoded and in any case).
///
/// It errs towards hiding, whatever the URL's shape, since a password is often pasted in raw:
/// - the password is everything from the first `:` after the scheme (or, without one, from
///   the start) to the **last** `@` of the whole text, so a raw `/`, `?`, `#`, `@` or `:` in it
///   is hidden with the rest (an `@` later in the query hides more than the password);
/// - a secret parameter's value runs to the next `&` (a `#` is part of it), and a piece after
///   it with no `=` of its own (a raw `&` in the secret) is hidden with it;
/// - the query is read from the first `?`, and again from the first `?` after the password,
///   so a raw `?` in the password cannot hide a secret parameter behind it.
pub fn redact_url(url: &str) -> String {
    let mut hidden = vec![false; url.len()];
    let mut hide = |range: std::ops::Range<usize>| hidden[range].iter_mut().for_each(|h| *h = true);
    let start = url.find("://").map_or(0, |i| i + 3);
    let user_info_end = url[start..].rfind('@').map(|at| start + at);
    if let Some(at) = user_info_end
        && let Some(colon) = url[start..at].find(':')
    {
        hide(start + colon + 1..at);
    }
    let queries = [url.find('?'), user_info_end.and_then(|at| url[at..].find('?').map(|q| at + q))];
    for query in queries.into_iter().flatten() {
        for range in secret_values(url, query + 1) {
            hide(range);
        }
    }
    let mut out = String::with_capacity(url.len());
    let mut in_hidden = false;
    for (i, c) in url.char_indices() {
        match (hidden[i], in_hidden) {
            (true, false) => out.push_str("***"),
            (true, true) => {}
            (false, _) => out.push(c),
        }
        in_hidden = hidden[i];
    }
    out
}

/// The byte ranges of `url` that hold the values of secret parameters of the query that starts
/// at `from`.
fn secret_values(url: &str, from: usize) -> Vec<std::ops::Range<usize>> {
    let mut ranges: Vec<std::ops::Range<usize>> = Vec::new();
    let mut in_secret = false;
    let mut at = from;
    for piece in url[from..].split('&') {
        let end = at + piece.len();
        match piece.split_once('=') {
            Some((name, value)) => {
                in_secret = !value.is_empty() && is_secret_parameter(name);
                if in_secret {
                    ranges.push(at + name.len() + 1..end);
                }
            }
            // A piece with no `=` after a secret is the rest of it: a raw `&` in the value.
            None if in_secret => {
                if let Some(last) = ranges.last_mut() {
                    last.end = end;
                }
            }
            None => {}
        }
        at = end + 1;
    }
    ranges
}

/// The parts of a URL query parameter's name that mark its value as a secret.
const SECRET_NAME_PARTS: [&str; 9] =
    ["pass", "pwd", "secret", "token", "key", "auth", "credential", "cert", "private"];

/// True when a URL query parameter's name (as written: percent-encoded, `+` for a space) looks
/// like it carries a secret, whatever its case.
pub(crate) fn is_secret_parameter(name: &str) -> bool {
    let name = percent_decode(&name.replace('+', " ")).to_lowercase();
    SECRET_NAME_PARTS.iter().any(|part| name.contains(part))
}

/// `%XX` sequences decoded; malformed ones kept as written.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_a_log_line() {
        assert_eq!(redact_url("postgres://app:s3cret@db:5432/x"), "postgres://app:***@db:5432/x");
        assert_eq!(redact_url("mysql://root@127.0.0.1/test"), "mysql://root@127.0.0.1/test");
        assert_eq!(redact_url("sqlite://demo.db?mode=rwc"), "sqlite://demo.db?mode=rwc");
        assert_eq!(redact_url("postgres://a:b@c@h/x"), "postgres://a:***@h/x");
        assert_eq!(redact_url("postgres://a:b/c@h/x"), "postgres://a:***@h/x", "a raw / in the password");
        assert_eq!(redact_url("redis://:s3cret@cache:6379/0"), "redis://:***@cache:6379/0");
        assert_eq!(redact_url("postgres://db/x"), "postgres://db/x");
        assert_eq!(redact_url("not a url"), "not a url");
    }

    #[test]
    fn a_password_in_the_query_string_is_masked_too() {
        assert_eq!(
            redact_url("postgres://u@127.0.0.1/x?password=hunter2"),
            "postgres://u@127.0.0.1/x?password=***"
        );
        assert_eq!(
            redact_url("postgres://u:p@h/x?sslmode=require&PassWord=hunter2&application_name=gate"),
            "postgres://u:***@h/x?sslmode=require&PassWord=***&application_name=gate",
            "several parameters, any case: only the secret one is masked"
        );
        for name in ["passwd", "pwd", "sslpassword", "token", "auth_token", "secret", "api-key", "sslkey"] {
            let shown = redact_url(&format!("mysql://root@h/test?{name}=hunter2&charset=utf8mb4"));
            assert_eq!(shown, format!("mysql://root@h/test?{name}=***&charset=utf8mb4"));
        }
        assert_eq!(
            redact_url("postgres://u@h/x?pass%77ord=hunter2&%50WD=hunter2"),
            "postgres://u@h/x?pass%77ord=***&%50WD=***",
            "names are compared percent-decoded"
        );
        assert_eq!(
            redact_url("postgres://u@h/x?password=hun@ter2&password=a%26b"),
            "postgres://u@h/x?password=***&password=***",
            "an @ in a query value is not the user information's"
        );
        assert_eq!(
            redact_url("postgres://u:p%40ss@h/x?password=&mode=x"),
            "postgres://u:***@h/x?password=&mode=x",
            "an empty value has nothing to hide"
        );
        assert_eq!(redact_url("sqlite://demo.db"), "sqlite://demo.db", "no query");
        assert_eq!(redact_url("sqlite://demo.db?"), "sqlite://demo.db?");
        assert_eq!(
            redact_url("sqlite:demo.db?key=k3y#frag"),
            "sqlite:demo.db?key=***",
            "a # is part of the value"
        );
    }

    #[test]
    fn a_password_with_raw_url_characters_is_masked_whole_whatever_the_shape() {
        for (url, shown) in [
            ("postgres://u:p#ss?w@h/db", "postgres://u:***@h/db"),
            ("postgres://u:p?ss#w@h:5432/db?sslmode=disable", "postgres://u:***@h:5432/db?sslmode=disable"),
            ("postgres://u:p@ss:w/rd@h/db", "postgres://u:***@h/db"),
            (
                "postgresql://user@server:pa#ss@server.example/db",
                "postgresql://user@server:***@server.example/db",
            ),
            ("u:p#ss?w@h/db", "u:***@h/db"),
            (
                "mysql://root:p#w?d@127.0.0.1:3306/test?ssl-mode=DISABLED&charset=utf8mb4",
                "mysql://root:***@127.0.0.1:3306/test?ssl-mode=DISABLED&charset=utf8mb4",
            ),
            (
                "mysql://root:p?w@h/test?password=s#e&c&charset=utf8mb4",
                "mysql://root:***@h/test?password=***&charset=utf8mb4",
            ),
            ("sqlite://x.db?key=se#cr&et&mode=rwc", "sqlite://x.db?key=***&mode=rwc"),
            ("redis://:p#ss?w@cache:6379/0", "redis://:***@cache:6379/0"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
        assert_eq!(
            redact_url("postgres://u:p@h/x?password=hun@ter2"),
            "postgres://u:***",
            "an @ in the query hides more than the password, never less"
        );
    }
}
