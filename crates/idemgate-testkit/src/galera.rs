//! A private three-node MariaDB Galera cluster on loopback, for tests and benchmarks, and
//! HAProxy in front of it. [`LocalGalera`] starts three `mariadbd` processes with the wsrep
//! provider of the `galera-4` package, each with a data directory of its own (made by
//! `mariadb-install-db`) and free ports: node 1 bootstraps the cluster, nodes 2 and 3 join it
//! by state transfer, and the start returns once the cluster has three members, every one of
//! them `Synced`. A node can be SIGKILLed and started again; it rejoins by incremental state
//! transfer. [`LocalProxy`] is HAProxy with a MySQL health check on each node: the one database
//! URL that survives the loss of a node. `scripts/install-galera.sh` installs what they run.
//!
//! Each node has a loopback address of its own (`127.0.0.11`, `.12`, `.13`), and Galera binds
//! the connections a node opens to its listening address, so [`LocalGalera::partition`] cuts one
//! node off from the other two with nftables rules on those addresses and the cluster's ports,
//! while clients (which connect from `127.0.0.1`) still reach every node.
//!
//! Every process is stopped by process id when its owner is dropped, and a watchdog per process
//! stops it too if this process dies first, so a killed test run leaves nothing behind. It never
//! touches the machine's own MariaDB server: its processes, ports and directories are its own.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sqlx::{Connection, Row};

use crate::broker::{free_port_run, remove_when_gone, watch_over, when_this_process_is_gone};

/// The wsrep provider the `galera-4` package installs.
const PROVIDER: &str = "/usr/lib/galera/libgalera_smm.so";

/// What installs the servers, the provider and HAProxy, named in every error about them.
const INSTALL: &str = "scripts/install-galera.sh";

/// The cluster's size.
pub const NODES: usize = 3;

/// How long a node may take to become `Synced` (a joiner's state transfer included).
const SYNCED_WITHIN: Duration = Duration::from_secs(120);

/// The MySQL user HAProxy's health check logs in as (no password, no privilege), as
/// [`LocalGalera::start`] creates it.
const CHECK_USER: &str = "haproxy";

/// A running three-node cluster.
pub struct LocalGalera {
    nodes: Vec<Node>,
    dir: tempfile::TempDir,
    started: Instant,
    /// The nftables table of this cluster's partitions, `idemgate_galera_<pid>_<n>`.
    table: String,
    /// Every partition and heal so far, with its time since the start.
    faults: Mutex<Vec<(Duration, String)>>,
}

/// One `mariadbd` of the cluster: its ports, its data directory, and its process while it runs.
struct Node {
    /// 1, 2 or 3.
    number: usize,
    /// `127.0.0.1<number>`: every port of the node listens there, and the connections it opens
    /// to other nodes start there.
    address: Ipv4Addr,
    /// The MySQL protocol's port.
    port: u16,
    /// Galera's group communication, incremental and snapshot state transfer ports.
    gcomm: u16,
    ist: u16,
    sst: u16,
    data: PathBuf,
    starts: u32,
    child: Option<Child>,
}

/// How a node that started again caught up with the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateTransfer {
    /// Only the write sets it missed, from a donor's gcache (IST).
    Incremental,
    /// A full copy of a donor's data directory (SST).
    Snapshot,
    /// Neither: it had missed nothing.
    None,
}

impl StateTransfer {
    /// Reads a joiner's error log since its start. The state transfer script runs either way and
    /// logs `SST received` either way; what it did is in its own line: `rsync SST completed on
    /// joiner` when it copied the data files, `rsync IST completed on joiner` when the donor
    /// bypassed the copy. The write sets themselves arrive after it, `IST received: <uuid>:<seqno>`.
    fn from_joiner_log(log: &str) -> Self {
        if log.contains(" SST completed on joiner") {
            Self::Snapshot
        } else if log.contains("IST received") {
            Self::Incremental
        } else {
            Self::None
        }
    }
}

/// A node's state as `SHOW STATUS` tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NodeState {
    comment: String,
    cluster_size: u32,
    /// `wsrep_cluster_status` is `Primary`.
    primary: bool,
}

impl LocalGalera {
    /// Creates three data directories, bootstraps node 1, lets nodes 2 and 3 join, and waits
    /// until the cluster has three members, all `Synced`.
    pub async fn start() -> anyhow::Result<Self> {
        sqlx::any::install_default_drivers();
        let mariadbd = program("mariadbd")?;
        let install_db = program("mariadb-install-db")?;
        program("rsync")?;
        anyhow::ensure!(
            Path::new(PROVIDER).is_file(),
            "the Galera provider {PROVIDER} is missing (package galera-4): run {INSTALL}"
        );
        let dir = tempfile::Builder::new()
            .prefix(&format!("idemgate-galera-{}-", std::process::id()))
            .tempdir()
            .context("a temporary folder")?;
        remove_when_gone(dir.path());
        let as_root = running_as_root();
        if as_root {
            // The servers run as `mysql` (see `Node::args`) and must reach their directories.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
                .context("opening the cluster's folder to the mysql user")?;
        }
        let mut nodes = Vec::with_capacity(NODES);
        for number in 1..=NODES {
            let base = free_port_run(4)?;
            let data = dir.path().join(format!("node{number}"));
            nodes.push(Node {
                number,
                address: Ipv4Addr::new(127, 0, 0, 10 + number as u8),
                port: base,
                gcomm: base + 1,
                ist: base + 2,
                sst: base + 3,
                data,
                starts: 0,
                child: None,
            });
        }
        // The system databases are made one node after another (a few seconds each): run at
        // once, the installs share the temporary folder of their bootstrap servers and one of
        // three failed now and then ("Unknown table 'mysql.tmp_user_sys'").
        for node in &nodes {
            let log = dir.path().join(format!("node{}-install.log", node.number));
            let mut install = Command::new(&install_db);
            install
                .arg("--no-defaults")
                .arg(format!("--datadir={}", node.data.display()))
                .args(["--auth-root-authentication-method=normal", "--skip-test-db"]);
            if as_root {
                install.arg("--user=mysql");
            }
            let mut child: Child = spawn_logged(&mut install, &log)?;
            let status = tokio::task::spawn_blocking(move || child.wait()).await??;
            if !status.success() {
                // The folder goes with this error, so the log's end is quoted here.
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(15).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                anyhow::bail!(
                    "mariadb-install-db failed for node {} ({status}):\n{}",
                    node.number,
                    tail.join("\n")
                );
            }
        }
        static CLUSTERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let table = format!(
            "idemgate_galera_{}_{}",
            std::process::id(),
            CLUSTERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let mut cluster = Self { nodes, dir, started: Instant::now(), table, faults: Mutex::default() };
        let address = cluster.cluster_address();
        cluster.nodes[0].start(&mariadbd, &address, &["--wsrep-new-cluster".to_owned()])?;
        cluster.wait_synced(0, 1).await?;
        for node in &mut cluster.nodes[1..] {
            node.start(&mariadbd, &address, &[])?;
        }
        for index in 1..NODES {
            cluster.wait_synced(index, NODES as u32).await?;
        }
        cluster.wait_synced(0, NODES as u32).await?;
        // DDL replicates to every node: the health check's user exists everywhere.
        let mut conn = sqlx::AnyConnection::connect(&cluster.admin_url(0)).await?;
        sqlx::query("CREATE USER IF NOT EXISTS 'haproxy'@'127.0.0.1'").execute(&mut conn).await?;
        conn.close().await?;
        Ok(cluster)
    }

    /// `mysql://root@127.0.0.1<n>:<port>/<database>` of node `index` (0-based).
    pub fn url(&self, index: usize, database: &str) -> String {
        let node = &self.nodes[index];
        format!("mysql://root@{}:{}/{database}", node.address, node.port)
    }

    /// An admin URL of node `index`, for [`crate::scratch::ScratchDb::create_at`].
    pub fn admin_url(&self, index: usize) -> String {
        self.url(index, "mysql")
    }

    /// Where the servers' logs and data are.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The lines of node `index`'s error log that speak of state transfers (`SST`, `IST`, the
    /// recovered position), for a failure message.
    pub fn transfer_log(&self, index: usize) -> String {
        let text = std::fs::read_to_string(self.nodes[index].log()).unwrap_or_default();
        let mut lines: Vec<&str> = text
            .lines()
            .filter(|l| {
                ["SST", "IST", "state transfer", "State transfer", "position"].iter().any(|w| l.contains(w))
            })
            .collect();
        lines.drain(..lines.len().saturating_sub(40));
        lines.join("\n")
    }

    /// SIGKILLs node `index`: no chance to flush or to leave the cluster.
    pub fn kill(&mut self, index: usize) {
        self.nodes[index].stop();
    }

    /// Starts node `index` again with its data and waits until it is `Synced` in a cluster of
    /// three.
    ///
    /// A SIGKILLed node's `grastate.dat` says `seqno: -1`: started as it is, it would not know
    /// its position and would ask for a full snapshot (rsync copies every data file: it works,
    /// in seconds here, but grows with the data). So the position is first recovered from
    /// InnoDB with `mariadbd --wsrep-recover` (which logs `WSREP: Recovered position:
    /// <uuid>:<seqno>`) and passed as `--wsrep-start-position`: the node then receives only the
    /// write sets it missed, by incremental state transfer from a donor's gcache (the donor
    /// logs `Bypassing state dump`). Without a recoverable position it falls back to the snapshot.
    ///
    /// Returns how the node caught up, as its error log tells it.
    pub async fn restart(&mut self, index: usize) -> anyhow::Result<StateTransfer> {
        let mariadbd = program("mariadbd")?;
        let address = self.cluster_address();
        let position = self.nodes[index].recover_position(&mariadbd, &address).await?;
        let extra: Vec<String> =
            position.map(|p| format!("--wsrep-start-position={p}")).into_iter().collect();
        let log = self.nodes[index].log();
        let logged_before = std::fs::metadata(&log).map_or(0, |m| m.len());
        self.nodes[index].start(&mariadbd, &address, &extra)?;
        self.wait_synced(index, NODES as u32).await?;
        let text = std::fs::read(&log).with_context(|| format!("reading {}", log.display()))?;
        let since_start = String::from_utf8_lossy(text.get(logged_before as usize..).unwrap_or_default());
        Ok(StateTransfer::from_joiner_log(&since_start))
    }

    /// SIGKILLs every node, `gap` apart: the whole cluster down at once, as when its machines
    /// lose power together, or as an operator's restart of every node would leave it.
    pub fn kill_all(&mut self, gap: Duration) {
        for (i, node) in self.nodes.iter_mut().enumerate() {
            if i > 0 {
                std::thread::sleep(gap);
            }
            node.stop();
        }
        self.record(format!("all {NODES} nodes SIGKILLed, {} ms apart", gap.as_millis()));
    }

    /// Starts the cluster again after every node went down. Each node's position is recovered
    /// from InnoDB (`mariadbd --wsrep-recover`); the most advanced one is marked safe to
    /// bootstrap in its `grastate.dat` and starts a new primary component with its position;
    /// the others join it with theirs, catching up by IST. Waits until all three are `Synced`,
    /// and returns each node's recovered position (`<uuid>:<seqno>`).
    pub async fn restart_all(&mut self) -> anyhow::Result<Vec<Option<String>>> {
        let mariadbd = program("mariadbd")?;
        let address = self.cluster_address();
        let mut positions = Vec::with_capacity(NODES);
        for node in &self.nodes {
            positions.push(node.recover_position(&mariadbd, &address).await?);
        }
        let seqno = |p: &Option<String>| p.as_deref().and_then(|p| p.rsplit_once(':')?.1.parse::<i64>().ok());
        let first = (0..NODES).max_by_key(|i| seqno(&positions[*i]).unwrap_or(-1)).unwrap_or(0);
        let state = self.nodes[first].data.join("grastate.dat");
        let text = std::fs::read_to_string(&state).with_context(|| format!("reading {}", state.display()))?;
        std::fs::write(&state, text.replace("safe_to_bootstrap: 0", "safe_to_bootstrap: 1"))
            .with_context(|| format!("writing {}", state.display()))?;
        let start_at =
            |p: &Option<String>| p.iter().map(|p| format!("--wsrep-start-position={p}")).collect::<Vec<_>>();
        let mut extra = start_at(&positions[first]);
        extra.push("--wsrep-new-cluster".to_owned());
        self.nodes[first].start(&mariadbd, &address, &extra)?;
        self.wait_synced(first, 1).await?;
        for index in (0..NODES).filter(|i| *i != first) {
            let extra = start_at(&positions[index]);
            self.nodes[index].start(&mariadbd, &address, &extra)?;
        }
        for index in 0..NODES {
            self.wait_synced(index, NODES as u32).await?;
        }
        self.record(format!("all {NODES} nodes started again, node {} first, from {positions:?}", first + 1));
        Ok(positions)
    }

    /// `gcomm://` with every node's group-communication address.
    fn cluster_address(&self) -> String {
        let members: Vec<String> = self.nodes.iter().map(|n| format!("{}:{}", n.address, n.gcomm)).collect();
        format!("gcomm://{}", members.join(","))
    }

    /// Waits until node `index` is `Synced` in a cluster of `size` members.
    async fn wait_synced(&mut self, index: usize, size: u32) -> anyhow::Result<()> {
        let url = self.admin_url(index);
        let started = Instant::now();
        let mut last = None;
        while started.elapsed() < SYNCED_WITHIN {
            if let Ok(state) = node_state(&url).await {
                if state.comment == "Synced" && state.cluster_size == size {
                    return Ok(());
                }
                last = Some(state);
            }
            let node = &mut self.nodes[index];
            if let Some(Ok(Some(status))) = node.child.as_mut().map(Child::try_wait) {
                bail!("galera node {} exited with {status}; see {}", node.number, node.log().display());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let node = &self.nodes[index];
        bail!(
            "galera node {} was not Synced in a cluster of {size} within {SYNCED_WITHIN:?} (last seen {last:?}); see {}",
            node.number,
            node.log().display()
        )
    }

    /// Starts HAProxy in front of the three nodes: one URL for every consumer, each new
    /// connection to a node whose health check passes.
    pub async fn proxy(&self) -> anyhow::Result<LocalProxy> {
        let nodes: Vec<(Ipv4Addr, u16)> = self.nodes.iter().map(|n| (n.address, n.port)).collect();
        LocalProxy::start(self.dir.path(), &nodes).await
    }

    /// Cuts node `index` off from the other two, both ways: nftables drops every packet between
    /// its address and theirs to the cluster's ports (group communication, IST, SST). Clients
    /// still reach all three. The node finds itself in a minority of one and, once the group's
    /// timeouts expire (a few seconds), refuses reads and writes (`WSREP has not yet prepared
    /// node for application use`) while the other two go on as the primary component.
    pub fn partition(&self, index: usize) -> anyhow::Result<()> {
        let cut = &self.nodes[index];
        let others: Vec<&Node> = self.nodes.iter().filter(|n| n.number != cut.number).collect();
        let set = |addrs: Vec<String>| addrs.join(", ");
        let other_addrs = set(others.iter().map(|n| n.address.to_string()).collect());
        let other_ports =
            set(others.iter().flat_map(|n| [n.gcomm, n.ist, n.sst]).map(|p| p.to_string()).collect());
        let table = &self.table;
        crate::network::nft(&format!(
            "table ip {table} {{\n\
             \tchain output {{ type filter hook output priority 0;\n\
             \t\tip saddr {a} ip daddr {{ {other_addrs} }} tcp dport {{ {other_ports} }} drop\n\
             \t\tip saddr {{ {other_addrs} }} ip daddr {a} tcp dport {{ {g}, {i}, {s} }} drop\n\
             \t}}\n\
             }}\n",
            a = cut.address,
            g = cut.gcomm,
            i = cut.ist,
            s = cut.sst,
        ))
        .with_context(|| format!("partitioning galera node {}", cut.number))?;
        when_this_process_is_gone(
            &format!("nft list table ip {table} >/dev/null 2>&1"),
            &format!("nft delete table ip {table}"),
        );
        self.record(format!("node {} cut off from the other two", cut.number));
        Ok(())
    }

    /// Removes the partition: the node rejoins, catching up by incremental state transfer.
    pub fn heal(&self) -> anyhow::Result<()> {
        crate::network::nft(&format!("delete table ip {}\n", self.table))
            .context("healing the galera partition")?;
        self.record("healed".to_owned());
        Ok(())
    }

    /// Waits until node `index` is `Synced` in a cluster of all three again.
    pub async fn wait_rejoined(&mut self, index: usize) -> anyhow::Result<()> {
        self.wait_synced(index, NODES as u32).await
    }

    /// Node `index`'s view: its local state (`Synced`, `Initialized`, …), the size of the
    /// component it is in, and whether that component is the primary one.
    pub async fn view(&self, index: usize) -> anyhow::Result<(String, u32, bool)> {
        let state = node_state(&self.admin_url(index)).await?;
        Ok((state.comment, state.cluster_size, state.primary))
    }

    /// Every partition and heal so far, one a line with its time since the cluster started.
    pub fn faults(&self) -> String {
        let faults = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        faults.iter().map(|(at, what)| format!("  +{:.1} s galera: {what}\n", at.as_secs_f64())).collect()
    }

    fn record(&self, what: String) {
        tracing::info!(%what, "galera fault");
        self.faults.lock().unwrap_or_else(|e| e.into_inner()).push((self.started.elapsed(), what));
    }
}

impl Drop for LocalGalera {
    fn drop(&mut self) {
        let _ = Command::new("nft").args(["delete", "table", "ip", &self.table]).output();
        for node in &mut self.nodes {
            node.stop();
        }
    }
}

impl Node {
    fn log(&self) -> PathBuf {
        self.data.join("error.log")
    }

    /// The server's options. Those Galera needs (`docs/galera.md` explains each): row-based
    /// binary log events, InnoDB, interleaved auto-increment locks, the provider and the cluster's
    /// addresses; a snapshot transfer by rsync. The rest keeps a test cluster small: a 64 MiB
    /// buffer pool and gcache, and the redo log written (not flushed) at each commit, which a
    /// killed process does not lose.
    fn args(&self, cluster_address: &str) -> Vec<String> {
        let d = self.data.display();
        let mut args = vec![
            "--no-defaults".to_owned(),
            format!("--datadir={d}"),
            format!("--socket={d}/mariadbd.sock"),
            format!("--pid-file={d}/mariadbd.pid"),
            format!("--log-error={}", self.log().display()),
            format!("--port={}", self.port),
            format!("--bind-address={}", self.address),
            "--skip-name-resolve".to_owned(),
            "--binlog-format=ROW".to_owned(),
            "--default-storage-engine=InnoDB".to_owned(),
            "--innodb-autoinc-lock-mode=2".to_owned(),
            "--innodb-buffer-pool-size=64M".to_owned(),
            "--innodb-flush-log-at-trx-commit=2".to_owned(),
            "--wsrep-on=ON".to_owned(),
            format!("--wsrep-provider={PROVIDER}"),
            "--wsrep-cluster-name=idemgate".to_owned(),
            format!("--wsrep-cluster-address={cluster_address}"),
            format!("--wsrep-node-name=node{}", self.number),
            format!("--wsrep-node-address={}:{}", self.address, self.gcomm),
            format!("--wsrep-node-incoming-address={}:{}", self.address, self.port),
            format!(
                "--wsrep-provider-options=gmcast.listen_addr=tcp://{a}:{};ist.recv_addr={a}:{};gcache.size=64M",
                self.gcomm,
                self.ist,
                a = self.address
            ),
            "--wsrep-sst-method=rsync".to_owned(),
            format!("--wsrep-sst-receive-address={}:{}", self.address, self.sst),
        ];
        // As root, the server runs as `mysql`: the rsync daemon of a snapshot transfer would
        // otherwise drop to `nobody`, who cannot enter the data directory, and the transfer fails.
        if running_as_root() {
            args.push("--user=mysql".to_owned());
        }
        args
    }

    /// Starts the server, with a watchdog that stops it if this process dies first.
    fn start(&mut self, mariadbd: &Path, cluster_address: &str, extra: &[String]) -> anyhow::Result<()> {
        self.starts += 1;
        let out = self.data.with_extension(format!("{}.out", self.starts));
        let child = spawn_logged(Command::new(mariadbd).args(self.args(cluster_address)).args(extra), &out)?;
        watch_over(&child);
        tracing::debug!(node = self.number, port = self.port, pid = child.id(), "a galera node started");
        self.child = Some(child);
        Ok(())
    }

    /// The position InnoDB holds, `<uuid>:<seqno>`, read by `mariadbd --wsrep-recover`.
    async fn recover_position(
        &self,
        mariadbd: &Path,
        cluster_address: &str,
    ) -> anyhow::Result<Option<String>> {
        let log = self.data.join("recover.log");
        let _ = std::fs::remove_file(&log);
        let mut recover = Command::new(mariadbd);
        recover
            .args(self.args(cluster_address))
            .arg("--wsrep-recover")
            .arg(format!("--log-error={}", log.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let status = tokio::task::spawn_blocking(move || recover.status()).await??;
        anyhow::ensure!(
            status.success(),
            "mariadbd --wsrep-recover failed ({status}); see {}",
            log.display()
        );
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        Ok(recovered_position(&text))
    }

    /// SIGKILL, and reap.
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The last `WSREP: Recovered position: <uuid>:<seqno>` of a `--wsrep-recover` log, unless its
/// seqno is -1 (nothing to recover).
fn recovered_position(log: &str) -> Option<String> {
    let position = log.lines().rev().find_map(|l| l.split("WSREP: Recovered position: ").nth(1))?.trim();
    let (uuid, seqno) = position.rsplit_once(':')?;
    (seqno.parse::<i64>().ok()? >= 0 && !uuid.is_empty()).then(|| position.to_owned())
}

/// A node's local state and the cluster's size, as the node tells them.
async fn node_state(url: &str) -> Result<NodeState, sqlx::Error> {
    let mut conn = sqlx::AnyConnection::connect(url).await?;
    let rows = sqlx::query(
        "SELECT VARIABLE_NAME, VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS \
         WHERE VARIABLE_NAME IN ('WSREP_LOCAL_STATE_COMMENT', 'WSREP_CLUSTER_SIZE', 'WSREP_CLUSTER_STATUS')",
    )
    .fetch_all(&mut conn)
    .await?;
    let _ = conn.close().await;
    let mut state = NodeState { comment: String::new(), cluster_size: 0, primary: false };
    for row in rows {
        let (name, value): (String, String) = (row.try_get(0)?, row.try_get(1)?);
        match name.to_ascii_uppercase().as_str() {
            "WSREP_LOCAL_STATE_COMMENT" => state.comment = value,
            "WSREP_CLUSTER_STATUS" => state.primary = value == "Primary",
            _ => state.cluster_size = value.parse().unwrap_or(0),
        }
    }
    Ok(state)
}

/// HAProxy in front of the cluster's nodes, on a free loopback port.
pub struct LocalProxy {
    port: u16,
    child: Child,
}

impl LocalProxy {
    /// Writes the configuration under `dir`, starts HAProxy, and waits until a query through it
    /// answers.
    ///
    /// Each node is checked every 500 ms by logging in as the check user (`mysql-check`, a real
    /// MySQL handshake, not just an open port); two failed checks take it out of the rotation and
    /// close its sessions, two good ones put it back. A connection refused by a node that is
    /// down but not yet marked so is tried again on another (`option redispatch`).
    async fn start(dir: &Path, nodes: &[(Ipv4Addr, u16)]) -> anyhow::Result<Self> {
        let haproxy = program("haproxy")?;
        let port = free_port_run(1)?;
        let servers: String = nodes
            .iter()
            .enumerate()
            .map(|(i, (a, p))| format!("    server node{} {a}:{p} check\n", i + 1))
            .collect();
        let config = dir.join("haproxy.cfg");
        std::fs::write(
            &config,
            format!(
                "global\n    maxconn 2000\n\n\
                 defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 30m\n    timeout server 30m\n    \
                 retries 3\n    option redispatch\n\n\
                 listen galera\n    bind 127.0.0.1:{port}\n    balance roundrobin\n    \
                 option mysql-check user {CHECK_USER} post-41\n    \
                 default-server inter 500ms fall 2 rise 2 on-marked-down shutdown-sessions\n{servers}"
            ),
        )
        .context("writing HAProxy's configuration")?;
        let log = dir.join("haproxy.log");
        let child = spawn_logged(Command::new(&haproxy).arg("-db").arg("-f").arg(&config), &log)?;
        watch_over(&child);
        let mut proxy = Self { port, child };
        let started = Instant::now();
        loop {
            match node_state(&proxy.url("mysql")).await {
                Ok(state) if state.comment == "Synced" => return Ok(proxy),
                _ if started.elapsed() > Duration::from_secs(30) => {
                    bail!("no query through HAProxy answered within 30 s; see {}", log.display())
                }
                _ => {}
            }
            if let Ok(Some(status)) = proxy.child.try_wait() {
                bail!("haproxy exited with {status}; see {}", log.display());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `mysql://root@127.0.0.1:<port>/<database>` through HAProxy.
    pub fn url(&self, database: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/{database}", self.port)
    }
}

impl Drop for LocalProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `command` with its output (both streams) in `log`.
fn spawn_logged(command: &mut Command, log: &Path) -> anyhow::Result<Child> {
    let out = std::fs::File::create(log).context("creating a log file")?;
    command
        .stdin(Stdio::null())
        .stdout(out.try_clone().context("creating a log file")?)
        .stderr(out)
        .spawn()
        .with_context(|| format!("starting {:?}", command.get_program()))
}

/// True when this process runs as root (it owns its own `/proc/self`).
fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// The path of `name`: on `PATH`, or in `/usr/sbin` (where Debian puts `mariadbd` and
/// `haproxy`, outside an ordinary user's `PATH`).
fn program(name: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .with_context(|| format!("{name} is not installed: run {INSTALL}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A joiner's log after a SIGKILL and a start at its recovered position (MariaDB 10.11,
    /// galera-4 26.4, rsync), and after a start that copied the data.
    const IST_LOG: &str = "\
WSREP: State transfer required:
WSREP_SST: [INFO] rsync SST started on joiner (20261203 06:49:30.253)
WSREP: Prepared IST receiver for 1674-5207, listening at: tcp://127.0.0.1:35755
WSREP_SST: [INFO] rsync IST completed on joiner (20261203 06:49:32.732)
WSREP: SST received: 94c7bfe5-eee5-11f1-9940-66de76d450d8:1673
WSREP: Receiving IST: 3534 writesets, seqnos 1674-5207
WSREP: IST received: 94c7bfe5-eee5-11f1-9940-66de76d450d8:5207
";

    #[test]
    fn a_joiner_log_tells_an_incremental_transfer_from_a_snapshot() {
        assert_eq!(StateTransfer::from_joiner_log(IST_LOG), StateTransfer::Incremental);
        let snapshot = IST_LOG.replace("rsync IST completed", "rsync SST completed");
        assert_eq!(StateTransfer::from_joiner_log(&snapshot), StateTransfer::Snapshot);
        assert_eq!(
            StateTransfer::from_joiner_log("WSREP: Synchronized with group, ready for connections"),
            StateTransfer::None
        );
    }

    #[test]
    fn the_recovered_position_is_the_last_one_logged_and_never_minus_one() {
        let log = "2026-12-02 18:42:05 0 [Note] WSREP: Recovered position: 00000000-0000-0000-0000-000000000000:-1\n\
                   2026-12-02 18:42:05 0 [Note] WSREP: Recovered position: dca73576-ee7f-11f1-bdec-ff2cff3a2420:304\n";
        assert_eq!(recovered_position(log).as_deref(), Some("dca73576-ee7f-11f1-bdec-ff2cff3a2420:304"));
        let unknown = "2026-12-02 18:42:05 0 [Note] WSREP: Recovered position: dca73576-ee7f-11f1-bdec-ff2cff3a2420:-1\n";
        assert_eq!(recovered_position(unknown), None);
        assert_eq!(recovered_position("nothing here"), None);
    }
}
