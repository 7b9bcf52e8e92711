//! A private network for the fault tests: hosts in their own network namespaces, joined to
//! this machine by veth pairs, and partitions between them made of nftables rules.
//!
//! - **The services host** is the machine's own namespace, where PostgreSQL, MariaDB, Redis and
//!   the RocketMQ servers run, bound to the loopback. A [`Network`] gives it an address the
//!   other hosts reach it by ([`Network::services`]: one of 198.18.0.0/15, the range RFC 2544
//!   keeps for tests of networks, put on `lo`), and forwards every TCP port of that address to
//!   the loopback: nftables DNAT, and SNAT to 127.0.0.1, so that servers which trust only the
//!   loopback (PostgreSQL's `pg_hba.conf`, MariaDB's `root@localhost`, Redis's protected mode)
//!   take the connection as they take a local one.
//! - **A [`Host`]** is a network namespace with its own loopback and a veth pair to the services
//!   host, whose default route leads there. [`Host::command`] runs a program in it
//!   (`ip netns exec`), as the process itself, so it is stopped by its own id.
//! - **A partition** ([`Host::partition`]) drops, in the host's namespace, every packet to
//!   (outbound) or from (inbound) chosen ports of the services host, or both. Dropped, not
//!   refused: a connection that was open hangs as it does when a real network fails, and each
//!   side learns of it only from its own timeouts. [`Host::heal`] removes the rules.
//!
//! Every partition and heal is recorded with its time ([`Network::faults`]), for a failing test to
//! print beside the services' logs.
//!
//! The tests create and remove all of it: dropping a [`Host`] deletes its namespace, and with it
//! the veth pair and its rules; dropping the [`Network`] removes the address and the forwarding
//! table. A watchdog per host and per network does the same if the test process dies first.
//! Addresses and names carry this process's id, so two test processes do not meet. It needs
//! root (CAP_NET_ADMIN), `ip` (iproute2) and `nft` (nftables); [`Network::start`] fails with the
//! reason when one is missing.

use std::fmt;
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};

use crate::broker::when_this_process_is_gone;

/// How long a new veth pair may take to carry packets.
const CARRIER_WITHIN: Duration = Duration::from_secs(5);

/// Hosts one network may have: each takes a /30 of the process's /24.
const MAX_HOSTS: u8 = 63;

/// The private network of one test process.
pub struct Network {
    inner: Arc<Inner>,
}

struct Inner {
    /// This process's number in the addresses (1..=250).
    subnet: u8,
    /// The nftables table of the forwarding, in the machine's namespace.
    table: String,
    services: Ipv4Addr,
    hosts: AtomicU8,
    started: Instant,
    faults: Mutex<Vec<NetFault>>,
}

/// Which way a partition drops packets, seen from the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// What the host sends to the services host is lost; what comes back still arrives.
    Outbound,
    /// What the services host sends to the host is lost.
    Inbound,
    Both,
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Outbound => "outbound",
            Self::Inbound => "inbound",
            Self::Both => "both ways",
        })
    }
}

/// One partition or heal.
#[derive(Debug, Clone)]
pub struct NetFault {
    /// The wall clock when it took effect, to read against the services' logs.
    pub at: SystemTime,
    /// Since the network was set up.
    pub since_start: Duration,
    pub host: String,
    pub what: String,
}

impl fmt::Display for NetFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let epoch_ms = self.at.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis());
        write!(
            f,
            "+{:>8.3}s (epoch ms {epoch_ms}) host {}: {}",
            self.since_start.as_secs_f64(),
            self.host,
            self.what
        )
    }
}

impl Network {
    /// Gives the services host its address and forwards it to the loopback.
    pub fn start() -> anyhow::Result<Self> {
        for tool in ["ip", "nft"] {
            let found = Command::new(tool).arg("-V").output().is_ok_and(|o| o.status.success());
            if !found {
                bail!(
                    "`{tool}` is not installed: the network fault tests need iproute2 and nftables (apt-get install nftables)"
                );
            }
        }
        let pid = std::process::id();
        let subnet = (pid % 250) as u8 + 1;
        let services = Ipv4Addr::new(198, 18, subnet, 1);
        let table = format!("idemgate_{pid}");
        let hosts = Ipv4Addr::new(198, 19, subnet, 0);
        let inner = Arc::new(Inner {
            subnet,
            table: table.clone(),
            services,
            hosts: AtomicU8::new(0),
            started: Instant::now(),
            faults: Mutex::default(),
        });
        // A leftover of an earlier process with the same number goes first.
        let _ = run("ip", &["addr", "del", &format!("{services}/32"), "dev", "lo"]);
        let _ = run("nft", &["delete", "table", "ip", &table]);
        run("ip", &["addr", "add", &format!("{services}/32"), "dev", "lo"])
            .context("giving the services host its address (this needs root: CAP_NET_ADMIN)")?;
        // Dropped (or the watchdog below) from here on, which removes the address.
        let network = Self { inner };
        nft(&format!(
            "table ip {table} {{\n\
             \tchain prerouting {{ type nat hook prerouting priority -100; ip daddr {services} dnat to 127.0.0.1; }}\n\
             \tchain output {{ type nat hook output priority -100; ip daddr {services} dnat to 127.0.0.1; }}\n\
             \tchain input {{ type nat hook input priority 100; ip saddr {hosts}/24 ip daddr 127.0.0.1 snat to 127.0.0.1; }}\n\
             }}\n"
        ))
        .context("forwarding the services host's address to the loopback")?;
        // Started once the table is there: the watchdog's test is that the table still is.
        when_this_process_is_gone(
            &format!("nft list table ip {table} >/dev/null 2>&1"),
            &format!("nft delete table ip {table}; ip addr del {services}/32 dev lo"),
        );
        Ok(network)
    }

    /// The address of the services host, as the hosts reach it.
    pub fn services(&self) -> Ipv4Addr {
        self.inner.services
    }

    /// `port` of the services host, as `host:port`.
    pub fn service(&self, port: u16) -> String {
        format!("{}:{port}", self.inner.services)
    }

    /// A new host, `label` naming it in the record of faults.
    pub fn host(&self, label: &str) -> anyhow::Result<Host> {
        let index = self.inner.hosts.fetch_add(1, Ordering::Relaxed) + 1;
        if index > MAX_HOSTS {
            bail!("a network has at most {MAX_HOSTS} hosts");
        }
        let pid = std::process::id();
        let namespace = format!("idemgate-{pid}-{index}");
        let (outside, inside) = (format!("ig{pid}o{index}"), format!("ig{pid}i{index}"));
        let base = index * 4;
        let gateway = Ipv4Addr::new(198, 19, self.inner.subnet, base + 1);
        let address = Ipv4Addr::new(198, 19, self.inner.subnet, base + 2);
        let _ = run("ip", &["netns", "del", &namespace]);
        run("ip", &["netns", "add", &namespace]).context("adding a network namespace (this needs root)")?;
        when_this_process_is_gone(
            &format!("test -e /run/netns/{namespace}"),
            &format!("ip netns del {namespace}"),
        );
        let host = Host { label: label.to_owned(), namespace, address, network: self.inner.clone() };
        let ns = host.namespace.as_str();
        let steps: [&[&str]; 8] = [
            &["link", "add", &outside, "type", "veth", "peer", "name", &inside],
            &["link", "set", &inside, "netns", ns],
            &["addr", "add", &format!("{gateway}/30"), "dev", &outside],
            &["link", "set", &outside, "up"],
            &["-n", ns, "addr", "add", &format!("{address}/30"), "dev", &inside],
            &["-n", ns, "link", "set", &inside, "up"],
            &["-n", ns, "link", "set", "lo", "up"],
            &["-n", ns, "route", "add", "default", "via", &gateway.to_string()],
        ];
        for step in steps {
            run("ip", step).with_context(|| format!("setting up host {label}"))?;
        }
        // The forwarding's DNAT to 127.0.0.1 sends what comes in over the pair to the loopback,
        // which the kernel routes only where this is on.
        std::fs::write(format!("/proc/sys/net/ipv4/conf/{outside}/route_localnet"), "1")
            .with_context(|| format!("route_localnet on {outside}"))?;
        host.wait_for_carrier(&inside, &outside)?;
        host.nft(
            "table inet partition {\n\
             \tchain output { type filter hook output priority 0; }\n\
             \tchain input { type filter hook input priority 0; }\n\
             }\n",
        )?;
        Ok(host)
    }

    /// Every partition and heal so far, in order.
    pub fn faults(&self) -> Vec<NetFault> {
        self.inner.faults.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The faults, one a line: what a failing test prints.
    pub fn report(&self) -> String {
        let faults = self.faults();
        let mut out = format!("network {}: {} partitions and heals\n", self.inner.services, faults.len());
        for fault in faults {
            out.push_str(&format!("  {fault}\n"));
        }
        out
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        let _ = run("nft", &["delete", "table", "ip", &self.inner.table]);
        let _ = run("ip", &["addr", "del", &format!("{}/32", self.inner.services), "dev", "lo"]);
    }
}

/// A host of a [`Network`]: a network namespace of its own.
pub struct Host {
    label: String,
    namespace: String,
    address: Ipv4Addr,
    network: Arc<Inner>,
}

impl Host {
    /// The host's address, where the services host (and the test) reach what listens in it.
    pub fn address(&self) -> Ipv4Addr {
        self.address
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    /// The network namespace's name (`ip netns`), under /run/netns.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// `program`, to run in this host's namespace. `ip netns exec` becomes the program, so the
    /// child's id is the program's own.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.namespace]).arg(program);
        command
    }

    /// Drops every packet between this host and `ports` of the services host, the way
    /// `direction` says, until [`Host::heal`]. `what` names it in the record.
    pub fn partition(&self, what: &str, ports: &[u16], direction: Direction) -> anyhow::Result<()> {
        if ports.is_empty() {
            bail!("a partition needs at least one port");
        }
        let services = self.network.services;
        let set = ports.iter().map(u16::to_string).collect::<Vec<_>>().join(", ");
        let mut rules = String::new();
        if matches!(direction, Direction::Outbound | Direction::Both) {
            rules.push_str(&format!(
                "add rule inet partition output ip daddr {services} tcp dport {{ {set} }} drop\n"
            ));
        }
        if matches!(direction, Direction::Inbound | Direction::Both) {
            rules.push_str(&format!(
                "add rule inet partition input ip saddr {services} tcp sport {{ {set} }} drop\n"
            ));
        }
        self.nft(&rules)?;
        self.record(format!("partitioned from {what} (ports {set}), {direction}"));
        Ok(())
    }

    /// Removes every partition of this host.
    pub fn heal(&self) -> anyhow::Result<()> {
        self.nft("flush chain inet partition output\nflush chain inet partition input\n")?;
        self.record("healed".to_owned());
        Ok(())
    }

    /// Waits until both ends of the pair carry packets: a veth just set up reports
    /// `LOWERLAYERDOWN` for a moment, and what is sent then is lost.
    fn wait_for_carrier(&self, inside: &str, outside: &str) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            let output = self.command("cat").arg(format!("/sys/class/net/{inside}/operstate")).output()?;
            let outside_up = std::fs::read_to_string(format!("/sys/class/net/{outside}/operstate"))
                .is_ok_and(|state| state.trim() == "up");
            if String::from_utf8_lossy(&output.stdout).trim() == "up" && outside_up {
                return Ok(());
            }
            if started.elapsed() > CARRIER_WITHIN {
                bail!("host {}: {inside} is not up within {CARRIER_WITHIN:?}", self.label);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn record(&self, what: String) {
        let fault = NetFault {
            at: SystemTime::now(),
            since_start: self.network.started.elapsed(),
            host: self.label.clone(),
            what,
        };
        tracing::info!(%fault, "network fault");
        self.network.faults.lock().unwrap_or_else(|e| e.into_inner()).push(fault);
    }

    /// Runs an nftables script in this host's namespace.
    fn nft(&self, script: &str) -> anyhow::Result<()> {
        let mut command = self.command("nft");
        command.args(["-f", "-"]);
        feed(command, script).with_context(|| format!("nftables in host {}", self.label))
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // The veth pair and the namespace's rules go with it.
        let _ = run("ip", &["netns", "del", &self.namespace]);
    }
}

/// Runs `program args`, failing with what it printed.
fn run(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let output = Command::new(program).args(args).output().with_context(|| format!("running {program}"))?;
    if !output.status.success() {
        bail!("{program} {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(())
}

/// Runs an nftables script in the machine's namespace.
pub(crate) fn nft(script: &str) -> anyhow::Result<()> {
    let mut command = Command::new("nft");
    command.args(["-f", "-"]);
    feed(command, script)
}

/// Runs `command` with `input` on its standard input, failing with what it printed.
fn feed(mut command: Command, input: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting nft")?;
    child.stdin.take().context("nft's input")?.write_all(input.as_bytes()).context("writing to nft")?;
    let output = child.wait_with_output().context("waiting for nft")?;
    if !output.status.success() {
        bail!("nft: {}\n{input}", String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(())
}
