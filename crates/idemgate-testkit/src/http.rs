//! The tests' one HTTP/1.1 client, on a bare socket on purpose: the tests send what no
//! well-behaved client would (a foreign `Host`, a cross-site `Origin`, headers cut short) and
//! read the status, the headers and the body exactly as the server wrote them. One request per
//! connection (`Connection: close`); a chunked body is decoded.

use std::io::{Read, Write};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An HTTP answer.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    /// The header block, lower-cased.
    pub headers: String,
    pub body: String,
}

/// The request line and headers of a request with a body of `length` bytes; `Host` is `addr`
/// unless `headers` name another.
pub fn head(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], length: usize) -> Vec<u8> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {length}\r\n");
    if !headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("host")) {
        head.push_str(&format!("Host: {addr}\r\n"));
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    head.into_bytes()
}

/// One request over a fresh connection, from a test's runtime; fails the test when no answer
/// comes within 60 s.
pub async fn request(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect to the service");
    stream.write_all(&head(addr, method, path, headers, body.len())).await.expect("send");
    stream.write_all(body).await.expect("send body");
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), stream.read_to_end(&mut raw))
        .await
        .expect("an answer within 60 s")
        .expect("read");
    parse(&raw).unwrap_or_else(|| panic!("not an HTTP answer: {}", String::from_utf8_lossy(&raw)))
}

/// [`request`] from a plain thread, waiting at most `timeout` for each read; `None` when the
/// service cannot be reached or does not answer in time (a service still starting, say).
pub fn request_blocking(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> Option<Reply> {
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.write_all(&head(addr, method, path, headers, body.len())).ok()?;
    stream.write_all(body).ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).ok()?;
    parse(&raw)
}

/// An answer as read from the socket; `None` without a status line.
pub fn parse(raw: &[u8]) -> Option<Reply> {
    let text = String::from_utf8_lossy(raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let headers = head.to_ascii_lowercase();
    let body = if headers.contains("transfer-encoding: chunked") { dechunk(body) } else { body.to_owned() };
    Some(Reply { status, headers, body })
}

/// A chunked body's chunks, joined; what follows a malformed size is left out.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else { break };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunked_answer_is_read_as_its_joined_chunks() {
        let raw =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n7\r\n, world\r\n0\r\n\r\n";
        let reply = parse(raw).expect("an answer");
        assert_eq!((reply.status, reply.body.as_str()), (200, "hello, world"));
        assert!(reply.headers.contains("transfer-encoding: chunked"));
    }

    #[test]
    fn a_plain_answer_keeps_its_body_and_garbage_is_no_answer() {
        let reply =
            parse(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n\r\nno").expect("an answer");
        assert_eq!((reply.status, reply.body.as_str()), (503, "no"));
        assert!(parse(b"garbage").is_none());
    }

    #[test]
    fn the_host_is_the_address_unless_a_header_names_another() {
        let own = String::from_utf8(head("127.0.0.1:9", "GET", "/", &[], 0)).unwrap();
        assert!(own.contains("Host: 127.0.0.1:9\r\n"), "{own}");
        let other =
            String::from_utf8(head("127.0.0.1:9", "GET", "/", &[("Host", "evil.example")], 0)).unwrap();
        assert!(!other.contains("127.0.0.1:9") && other.contains("Host: evil.example\r\n"), "{other}");
    }
}
