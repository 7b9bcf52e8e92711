//! Secrets out of URLs: a database or Redis URL as logs, error messages and `idemgate config`
//! may show it.

/// Hides the secrets of a database or Redis URL, for logs, error messages and `idemgate
/// config`: the password of `user:password@`, and the value of every query parameter whose
/// name looks secret ([`is_secret_parameter`]: `password`, `sslpassword`, `token`, …; the name
/// compared percent-decoded and in any case).
///
/// It errs towards hiding: everything before the last `@` ahead of the query is taken as the
/// user information, so a password with a raw `/` or `@` is still masked.
pub(crate) fn redact_url(url: &str) -> String {
    let (url, fragment) = match url.split_once('#') {
        Some((u, f)) => (u, Some(f)),
        None => (url, None),
    };
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let mut out = match base.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((userinfo, host_and_path)) => match userinfo.split_once(':') {
                Some((user, _)) => format!("{scheme}://{user}:***@{host_and_path}"),
                None => base.to_owned(),
            },
            None => base.to_owned(),
        },
        None => base.to_owned(),
    };
    if let Some(query) = query {
        out.push('?');
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, value)) if !value.is_empty() && is_secret_parameter(name) => {
                    format!("{name}=***")
                }
                _ => pair.to_owned(),
            })
            .collect();
        out.push_str(&pairs.join("&"));
    }
    if let Some(fragment) = fragment {
        out.push('#');
        out.push_str(fragment);
    }
    out
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
        assert_eq!(redact_url("sqlite:demo.db?key=k3y#frag"), "sqlite:demo.db?key=***#frag");
    }
}
