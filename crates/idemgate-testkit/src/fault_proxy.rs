//! A TCP proxy in front of PostgreSQL or MariaDB that injects faults at chosen points of the
//! conversation, for the tests of what a lost connection does to a delivery.
//!
//! It understands just enough of each wire protocol to find the points: the framing (PostgreSQL:
//! a type byte and a length; MySQL/MariaDB: a 3-byte length and a sequence id), which client
//! message is a `COMMIT`, and which statement a prepared execution runs (PostgreSQL's `Parse` and
//! `Bind`, MySQL's `COM_STMT_PREPARE` and its answer, `COM_STMT_EXECUTE`). TLS must be off, as
//! [`FaultProxy::url`] sets it. Its faults ([`Plan`]):
//!
//! - **the ambiguous commit**: the `COMMIT` is forwarded, the server's whole answer read and
//!   dropped, then the connection cut. The server committed; the client hears only the cut;
//! - **a cut in the middle of a statement**: half of the message that executes a statement
//!   whose text holds every given needle (a group's multi-row insert) is forwarded, then the
//!   connection cut. The server sees half a message and rolls the transaction back;
//! - **a delayed answer**: the end of an answer (PostgreSQL's `ReadyForQuery`, the first packet
//!   of a MySQL answer) is held back for a while.
//!
//! Every fault is recorded with its time and connection ([`Fault`]), for a failing test to print
//! beside the service's log. Every task the proxy starts is aborted when it is dropped; every
//! wait it makes on its own behalf (the upstream connect, an answer it drops) is bounded.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use idemgate::store::Backend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

/// The longest wait for the upstream server to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest wait for the answer of a `COMMIT` the proxy drops.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest message the proxy reads whole (both protocols' messages are far smaller here).
const MAX_FRAME: usize = 64 << 20;

/// Which wire protocol the proxy speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    Postgres,
    MySql,
}

impl Wire {
    /// The protocol of `backend`; none for SQLite, which has no wire.
    pub fn of(backend: Backend) -> Option<Self> {
        match backend {
            Backend::Postgres => Some(Self::Postgres),
            Backend::MySql => Some(Self::MySql),
            Backend::Sqlite => None,
        }
    }
}

/// How often a fault strikes: on every `every`-th event it applies to, at most `limit` times in
/// all. The default strikes never.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Budget {
    pub every: u32,
    pub limit: u32,
}

impl Budget {
    pub fn every(every: u32, limit: u32) -> Self {
        Self { every, limit }
    }
}

/// The faults to inject from now on. The default injects none.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// `COMMIT`s whose answer is dropped and whose connection is cut after the server ran them.
    pub ambiguous_commits: Budget,
    /// The needles a statement's text must all hold for [`Plan::cuts`] to cut its execution.
    pub cut_statement: Vec<String>,
    /// Executions of a [`Plan::cut_statement`] statement cut halfway through their message.
    pub cuts: Budget,
    /// How long a delayed answer is held back.
    pub delay: Duration,
    /// Answers held back for [`Plan::delay`].
    pub delays: Budget,
}

/// What the proxy did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    AmbiguousCommit,
    CutMidStatement,
    DelayedAnswer,
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::AmbiguousCommit => "ambiguous commit",
            Self::CutMidStatement => "cut mid-statement",
            Self::DelayedAnswer => "delayed answer",
        })
    }
}

/// One injected fault.
#[derive(Debug, Clone)]
pub struct Fault {
    /// The wall clock when it struck, to read against the service's log.
    pub at: SystemTime,
    /// Since the proxy started.
    pub since_start: Duration,
    /// The proxy's number for the client connection (from 1, in order of arrival).
    pub connection: u64,
    pub kind: FaultKind,
    pub detail: String,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let epoch_ms = self.at.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis());
        write!(
            f,
            "+{:>8.3}s (epoch ms {epoch_ms}) connection {:>4}  {}: {}",
            self.since_start.as_secs_f64(),
            self.connection,
            self.kind,
            self.detail
        )
    }
}

/// Counts the events a [`Budget`] applies to, and the strikes.
#[derive(Debug, Default)]
struct Counter {
    seen: u32,
    struck: u32,
}

impl Counter {
    fn strike(&mut self, budget: Budget) -> bool {
        if budget.every == 0 || self.struck >= budget.limit {
            return false;
        }
        self.seen += 1;
        let strike = self.seen.is_multiple_of(budget.every);
        self.struck += u32::from(strike);
        strike
    }
}

#[derive(Default)]
struct State {
    plan: Plan,
    commits: Counter,
    cuts: Counter,
    delays: Counter,
    faults: Vec<Fault>,
    connections: u64,
    tasks: Vec<AbortHandle>,
}

struct Shared {
    state: Mutex<State>,
    started: Instant,
    wire: Wire,
    upstream: SocketAddr,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn strike(&self, kind: FaultKind) -> bool {
        let mut state = self.state();
        let state = &mut *state;
        match kind {
            FaultKind::AmbiguousCommit => state.commits.strike(state.plan.ambiguous_commits),
            FaultKind::CutMidStatement => state.cuts.strike(state.plan.cuts),
            FaultKind::DelayedAnswer => state.delays.strike(state.plan.delays),
        }
    }

    fn record(&self, connection: u64, kind: FaultKind, detail: String) {
        let fault =
            Fault { at: SystemTime::now(), since_start: self.started.elapsed(), connection, kind, detail };
        tracing::info!(%fault, "fault injected");
        self.state().faults.push(fault);
    }
}

/// A running proxy; dropping it stops it and cuts every connection through it.
pub struct FaultProxy {
    shared: Arc<Shared>,
    addr: SocketAddr,
    accept: AbortHandle,
}

impl FaultProxy {
    /// A proxy on a free local port in front of the server at `upstream` (`host:port`), speaking
    /// `wire`, with no faults planned yet.
    pub async fn start(wire: Wire, upstream: &str) -> std::io::Result<Self> {
        let upstream = tokio::net::lookup_host(upstream)
            .await?
            .next()
            .ok_or_else(|| std::io::Error::other(format!("{upstream} names no address")))?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared { state: Mutex::default(), started: Instant::now(), wire, upstream });
        let accepting = shared.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else { continue };
                let id = {
                    let mut state = accepting.state();
                    state.connections += 1;
                    state.connections
                };
                let serving = accepting.clone();
                let task = tokio::spawn(async move {
                    if let Err(e) = serve(&serving, client, id).await {
                        tracing::debug!(connection = id, error = %e, "a proxied connection ended");
                    }
                });
                let mut state = accepting.state();
                state.tasks.retain(|t| !t.is_finished());
                state.tasks.push(task.abort_handle());
            }
        })
        .abort_handle();
        Ok(Self { shared, addr, accept })
    }

    /// The proxy in front of the server `url` names (a `postgres://` or `mysql://` URL).
    pub async fn in_front_of(url: &str) -> std::io::Result<Self> {
        let parsed = url::Url::parse(url).map_err(std::io::Error::other)?;
        let wire = match parsed.scheme() {
            "postgres" | "postgresql" => Wire::Postgres,
            "mysql" | "mariadb" => Wire::MySql,
            other => return Err(std::io::Error::other(format!("no wire protocol for {other}://"))),
        };
        let host = parsed.host_str().unwrap_or("127.0.0.1");
        let port = parsed.port().unwrap_or(match wire {
            Wire::Postgres => 5432,
            Wire::MySql => 3306,
        });
        Self::start(wire, &format!("{host}:{port}")).await
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `url` (a database URL of the proxied server) pointed at the proxy, with TLS off, which
    /// the proxy cannot read through.
    pub fn url(&self, url: &str) -> String {
        let Ok(mut parsed) = url::Url::parse(url) else { return url.to_owned() };
        let _ = parsed.set_host(Some(&self.addr.ip().to_string()));
        let _ = parsed.set_port(Some(self.addr.port()));
        let (name, value) = match self.shared.wire {
            Wire::Postgres => ("sslmode", "disable"),
            Wire::MySql => ("ssl-mode", "disabled"),
        };
        parsed.query_pairs_mut().append_pair(name, value);
        parsed.to_string()
    }

    /// Injects `plan`'s faults from now on, counting each kind's events afresh.
    pub fn set_plan(&self, plan: Plan) {
        let mut state = self.shared.state();
        state.plan = plan;
        state.commits = Counter::default();
        state.cuts = Counter::default();
        state.delays = Counter::default();
    }

    /// Every fault injected so far, in order.
    pub fn faults(&self) -> Vec<Fault> {
        self.shared.state().faults.clone()
    }

    /// How many faults of `kind` were injected.
    pub fn count(&self, kind: FaultKind) -> usize {
        self.shared.state().faults.iter().filter(|f| f.kind == kind).count()
    }

    /// The faults, one a line, after a line of counts: what a failing test prints.
    pub fn report(&self) -> String {
        let faults = self.faults();
        let mut out = format!(
            "fault proxy {}: {} faults ({} ambiguous commits, {} cuts mid-statement, {} delayed answers), {} connections\n",
            self.addr,
            faults.len(),
            faults.iter().filter(|f| f.kind == FaultKind::AmbiguousCommit).count(),
            faults.iter().filter(|f| f.kind == FaultKind::CutMidStatement).count(),
            faults.iter().filter(|f| f.kind == FaultKind::DelayedAnswer).count(),
            self.shared.state().connections,
        );
        for fault in &faults {
            out.push_str(&format!("  {fault}\n"));
        }
        out
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        for task in self.shared.state().tasks.drain(..) {
            task.abort();
        }
    }
}

/// One message as it crossed the wire, header included.
struct Frame {
    bytes: Vec<u8>,
}

impl Frame {
    /// PostgreSQL: the type byte. MySQL: the sequence id.
    fn tag(&self, wire: Wire) -> u8 {
        match wire {
            Wire::Postgres => self.bytes[0],
            Wire::MySql => self.bytes[3],
        }
    }

    /// The message after its header.
    fn payload(&self, wire: Wire) -> &[u8] {
        match wire {
            Wire::Postgres => &self.bytes[5..],
            Wire::MySql => &self.bytes[4..],
        }
    }
}

/// Reads one message: PostgreSQL's type byte and 4-byte big-endian length (which counts
/// itself), or MySQL's 3-byte little-endian length and sequence id.
async fn read_frame(r: &mut OwnedReadHalf, wire: Wire) -> std::io::Result<Frame> {
    let (mut bytes, len) = match wire {
        Wire::Postgres => {
            let mut header = [0u8; 5];
            r.read_exact(&mut header).await?;
            let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
            (header.to_vec(), len.checked_sub(4).ok_or_else(|| bad("a length below 4"))?)
        }
        Wire::MySql => {
            let mut header = [0u8; 4];
            r.read_exact(&mut header).await?;
            let len = usize::from(header[0]) | (usize::from(header[1]) << 8) | (usize::from(header[2]) << 16);
            (header.to_vec(), len)
        }
    };
    if len > MAX_FRAME {
        return Err(bad("a message too large"));
    }
    let start = bytes.len();
    bytes.resize(start + len, 0);
    r.read_exact(&mut bytes[start..]).await?;
    Ok(Frame { bytes })
}

fn bad(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("the proxy read {what}"))
}

/// A NUL-terminated string at the start of `bytes`, and what follows it.
fn cstr(bytes: &[u8]) -> (&[u8], &[u8]) {
    match bytes.iter().position(|&b| b == 0) {
        Some(end) => (&bytes[..end], &bytes[end + 1..]),
        None => (bytes, &[]),
    }
}

fn is_commit(text: &[u8]) -> bool {
    String::from_utf8_lossy(text).trim().trim_end_matches(';').trim().eq_ignore_ascii_case("commit")
}

/// What one connection's client has prepared, by the server's name for it.
#[derive(Default)]
struct Statements {
    /// PostgreSQL: by statement name. MySQL: by statement id, in decimal.
    texts: HashMap<String, String>,
    /// MySQL: the texts of `COM_STMT_PREPARE`s whose answer (the id) has not come yet.
    preparing: VecDeque<String>,
}

/// Per connection: the flag that makes the server half drop the answer to a `COMMIT`, and what
/// the client prepared.
#[derive(Default)]
struct Connection {
    id: u64,
    drop_answer: std::sync::atomic::AtomicBool,
    statements: Mutex<Statements>,
}

impl Connection {
    fn statements(&self) -> MutexGuard<'_, Statements> {
        self.statements.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Relays one client connection until either side ends or a fault cuts it: both halves end
/// together, so both sockets close.
async fn serve(shared: &Shared, client: TcpStream, id: u64) -> std::io::Result<()> {
    let server = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(shared.upstream))
        .await
        .map_err(|_| std::io::Error::other("the upstream server did not accept in time"))??;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (mut client_r, mut client_w) = client.into_split();
    let (mut server_r, mut server_w) = server.into_split();
    if shared.wire == Wire::Postgres {
        startup(&mut client_r, &mut client_w, &mut server_w).await?;
    }
    let conn = Connection { id, ..Connection::default() };
    tokio::select! {
        r = upstream(shared, &conn, &mut client_r, &mut server_w) => r,
        r = downstream(shared, &conn, &mut server_r, &mut client_w) => r,
    }
}

/// PostgreSQL's untyped first messages: a request for TLS (or GSS encryption) is refused with
/// `N`, as a server without it would; the startup message is forwarded.
async fn startup(
    client_r: &mut OwnedReadHalf,
    client_w: &mut OwnedWriteHalf,
    server_w: &mut OwnedWriteHalf,
) -> std::io::Result<()> {
    const SSL_REQUEST: u32 = 80_877_103;
    const GSSENC_REQUEST: u32 = 80_877_104;
    loop {
        let mut len = [0u8; 4];
        client_r.read_exact(&mut len).await?;
        let n = u32::from_be_bytes(len) as usize;
        if !(8..=MAX_FRAME).contains(&n) {
            return Err(bad("a startup message of an impossible length"));
        }
        let mut body = vec![0u8; n - 4];
        client_r.read_exact(&mut body).await?;
        let code = u32::from_be_bytes([body[0], body[1], body[2], body[3]]);
        if n == 8 && (code == SSL_REQUEST || code == GSSENC_REQUEST) {
            client_w.write_all(b"N").await?;
            continue;
        }
        server_w.write_all(&len).await?;
        server_w.write_all(&body).await?;
        return Ok(());
    }
}

/// What a client message does, as far as the faults care.
enum Message {
    Commit,
    /// Executes the statement of this text.
    Executes(String),
    Other,
}

/// Reads what a client message does, noting the statements it prepares.
fn read_message(wire: Wire, conn: &Connection, frame: &Frame) -> Message {
    let payload = frame.payload(wire);
    match wire {
        Wire::Postgres => match frame.tag(wire) {
            b'Q' => {
                let (text, _) = cstr(payload);
                if is_commit(text) {
                    Message::Commit
                } else {
                    Message::Executes(String::from_utf8_lossy(text).into_owned())
                }
            }
            b'P' => {
                let (name, rest) = cstr(payload);
                let (text, _) = cstr(rest);
                conn.statements().texts.insert(
                    String::from_utf8_lossy(name).into_owned(),
                    String::from_utf8_lossy(text).into_owned(),
                );
                Message::Other
            }
            b'B' => {
                let (_portal, rest) = cstr(payload);
                let (name, _) = cstr(rest);
                let text = conn.statements().texts.get(String::from_utf8_lossy(name).as_ref()).cloned();
                text.map_or(Message::Other, Message::Executes)
            }
            _ => Message::Other,
        },
        // A command is the first packet (sequence 0) of its exchange.
        Wire::MySql if frame.tag(wire) != 0 || payload.is_empty() => Message::Other,
        Wire::MySql => match payload[0] {
            // COM_QUERY
            0x03 if is_commit(&payload[1..]) => Message::Commit,
            0x03 => Message::Executes(String::from_utf8_lossy(&payload[1..]).into_owned()),
            // COM_STMT_PREPARE: the id comes in the answer.
            0x16 => {
                conn.statements().preparing.push_back(String::from_utf8_lossy(&payload[1..]).into_owned());
                Message::Other
            }
            // COM_STMT_EXECUTE
            0x17 if payload.len() >= 5 => {
                let id = u32::from_le_bytes([payload[1], payload[2], payload[3], payload[4]]);
                let text = conn.statements().texts.get(&id.to_string()).cloned();
                text.map_or(Message::Other, Message::Executes)
            }
            _ => Message::Other,
        },
    }
}

/// Client to server: forwards each message, or injects the faults that strike there.
async fn upstream(
    shared: &Shared,
    conn: &Connection,
    client_r: &mut OwnedReadHalf,
    server_w: &mut OwnedWriteHalf,
) -> std::io::Result<()> {
    let wire = shared.wire;
    loop {
        let frame = read_frame(client_r, wire).await?;
        match read_message(wire, conn, &frame) {
            Message::Commit if shared.strike(FaultKind::AmbiguousCommit) => {
                conn.drop_answer.store(true, std::sync::atomic::Ordering::SeqCst);
                server_w.write_all(&frame.bytes).await?;
                // The other half drops the answer and ends the connection; if no answer comes,
                // the connection ends here.
                tokio::time::sleep(ANSWER_TIMEOUT).await;
                return Err(std::io::Error::other("no answer to a COMMIT whose answer was to be dropped"));
            }
            Message::Executes(text)
                if !shared.state().plan.cut_statement.is_empty()
                    && shared
                        .state()
                        .plan
                        .cut_statement
                        .iter()
                        .all(|needle| text.contains(needle.as_str()))
                    && shared.strike(FaultKind::CutMidStatement) =>
            {
                let half = frame.bytes.len() / 2;
                server_w.write_all(&frame.bytes[..half]).await?;
                server_w.flush().await?;
                let head: String = text.chars().take(80).collect();
                shared.record(
                    conn.id,
                    FaultKind::CutMidStatement,
                    format!("cut after {half} of the {} bytes executing `{head}…`", frame.bytes.len()),
                );
                return Ok(());
            }
            _ => server_w.write_all(&frame.bytes).await?,
        }
    }
}

/// Server to client: forwards each message, learns the ids of MySQL's prepared statements,
/// holds back delayed answers, and drops a `COMMIT`'s answer when told to, then ends.
async fn downstream(
    shared: &Shared,
    conn: &Connection,
    server_r: &mut OwnedReadHalf,
    client_w: &mut OwnedWriteHalf,
) -> std::io::Result<()> {
    let wire = shared.wire;
    let mut dropped = 0usize;
    loop {
        let frame = read_frame(server_r, wire).await?;
        // The last message of an answer: PostgreSQL's ReadyForQuery; the first packet of a
        // MySQL answer, which for a COMMIT is the whole of it.
        let answer_ends = match wire {
            Wire::Postgres => frame.tag(wire) == b'Z',
            Wire::MySql => frame.tag(wire) == 1,
        };
        if wire == Wire::MySql && frame.tag(wire) == 1 {
            let mut statements = conn.statements();
            if let Some(text) = statements.preparing.pop_front() {
                let payload = frame.payload(wire);
                if payload.len() >= 5 && payload[0] == 0 {
                    let id = u32::from_le_bytes([payload[1], payload[2], payload[3], payload[4]]);
                    statements.texts.insert(id.to_string(), text);
                }
            }
        }
        if conn.drop_answer.load(std::sync::atomic::Ordering::SeqCst) {
            dropped += frame.bytes.len();
            if answer_ends {
                shared.record(
                    conn.id,
                    FaultKind::AmbiguousCommit,
                    format!("COMMIT forwarded, its answer ({dropped} bytes) dropped, the connection cut"),
                );
                return Ok(());
            }
            continue;
        }
        if answer_ends && shared.strike(FaultKind::DelayedAnswer) {
            let delay = shared.state().plan.delay;
            shared.record(
                conn.id,
                FaultKind::DelayedAnswer,
                format!("answer held back {} ms", delay.as_millis()),
            );
            tokio::time::sleep(delay).await;
        }
        client_w.write_all(&frame.bytes).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_strikes_every_nth_event_up_to_its_limit() {
        let mut counter = Counter::default();
        let struck: Vec<bool> = (0..9).map(|_| counter.strike(Budget::every(3, 2))).collect();
        assert_eq!(struck, [false, false, true, false, false, true, false, false, false]);
        assert!(!Counter::default().strike(Budget::default()), "the default strikes never");
    }

    #[test]
    fn a_commit_is_told_from_other_statements() {
        assert!(is_commit(b"COMMIT"));
        assert!(is_commit(b" commit; "));
        assert!(!is_commit(b"COMMIT AND CHAIN x"));
        assert!(!is_commit(b"SELECT 'COMMIT'"));
    }

    fn pg(tag: u8, payload: &[u8]) -> Frame {
        let mut bytes = vec![tag];
        bytes.extend_from_slice(&u32::try_from(payload.len() + 4).unwrap_or(0).to_be_bytes());
        bytes.extend_from_slice(payload);
        Frame { bytes }
    }

    fn mysql(seq: u8, payload: &[u8]) -> Frame {
        let len = payload.len();
        let mut bytes = vec![len as u8, (len >> 8) as u8, (len >> 16) as u8, seq];
        bytes.extend_from_slice(payload);
        Frame { bytes }
    }

    #[test]
    fn a_postgres_bind_executes_the_text_its_parse_named() {
        let conn = Connection::default();
        assert!(matches!(read_message(Wire::Postgres, &conn, &pg(b'Q', b"COMMIT\0")), Message::Commit));
        assert!(matches!(
            read_message(Wire::Postgres, &conn, &pg(b'P', b"s1\0INSERT INTO t VALUES ($1)\0\0\0")),
            Message::Other
        ));
        match read_message(Wire::Postgres, &conn, &pg(b'B', b"\0s1\0\0\0")) {
            Message::Executes(text) => assert_eq!(text, "INSERT INTO t VALUES ($1)"),
            _ => panic!("a Bind of s1 executes its text"),
        }
        assert!(matches!(read_message(Wire::Postgres, &conn, &pg(b'B', b"\0s9\0\0\0")), Message::Other));
    }

    #[test]
    fn a_mysql_execute_runs_the_text_its_prepare_answer_numbered() {
        let conn = Connection::default();
        assert!(matches!(read_message(Wire::MySql, &conn, &mysql(0, b"\x03COMMIT")), Message::Commit));
        // Not a command: a packet later in an exchange.
        assert!(matches!(read_message(Wire::MySql, &conn, &mysql(1, b"\x03COMMIT")), Message::Other));
        read_message(Wire::MySql, &conn, &mysql(0, b"\x16INSERT INTO t VALUES (?)"));
        let prepared = conn.statements().preparing.pop_front();
        conn.statements().texts.insert("7".into(), prepared.unwrap_or_default());
        match read_message(Wire::MySql, &conn, &mysql(0, &[0x17, 7, 0, 0, 0, 0, 1, 0, 0, 0])) {
            Message::Executes(text) => assert_eq!(text, "INSERT INTO t VALUES (?)"),
            _ => panic!("an execute of statement 7 runs its text"),
        }
    }
}
