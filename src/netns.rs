//! A small site out of Linux network namespaces, for the multi-host harness
//! ([`crate::cluster`]): each host is a namespace of its own with one interface (`eth0`) and
//! its own address on one subnet; the hosts are joined by a bridge that lives in a namespace of
//! its own too (the site's switch), so nothing of the site is in the caller's namespace and no
//! packet of it leaves the namespaces the site made. Dropping the [`Site`] deletes them all
//! (a namespace's veth ends go with it).
//!
//! What a site can do to its hosts: start a program on one (`ip netns exec`), cut and mend a
//! host's link (its switch port down or up: the host's packets go nowhere, as when its cable
//! is pulled), give a host a second address it uses toward one other host (what a NAT between
//! them looks like to that other host), and run async code with the network of one host (a
//! thread that entered its namespace).
//!
//! Needs root (`CAP_SYS_ADMIN`) and iproute2's `ip`; [`Site::unavailable`] says why not.
//!
//! Must not know: htfaas's components (what runs on a host is the caller's).

use anyhow::{Context as _, bail};
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd as _;
use std::path::Path;
use std::process::Command;

/// The site's subnet: `10.213.7.0/24`. Each site's namespaces are its own, so two sites (two
/// harnesses at once) may use the same addresses without meeting.
pub const SUBNET: [u8; 3] = [10, 213, 7];

/// One host of a site.
#[derive(Debug, Clone)]
pub struct Host {
    /// Its name in the site (`storage`, `ep1`, …).
    pub name: String,
    /// Its network namespace.
    pub ns: String,
    /// Its address.
    pub addr: Ipv4Addr,
    /// Its port on the switch (the veth end in the switch's namespace).
    port: String,
}

/// The namespaces of a site; deleted on drop.
pub struct Site {
    switch: String,
    hosts: Vec<Host>,
}

/// Runs `ip args…`; an error names the command and what `ip` said.
fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip").args(args).output().with_context(|| format!("run ip {}", args.join(" ")))?;
    if !out.status.success() {
        bail!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

impl Site {
    /// Why no site can be made here (not root, no `ip`), or `None`.
    pub fn unavailable() -> Option<String> {
        if !is_root() {
            return Some("network namespaces need root".into());
        }
        match Command::new("ip").arg("-V").output() {
            Ok(out) if out.status.success() => None,
            _ => Some("iproute2's `ip` is not installed".into()),
        }
    }

    /// Makes a site named `prefix` (namespaces `<prefix>-<host>`, at most 15 bytes each with
    /// the switch's `<prefix>-sw`) with `hosts` at `10.213.7.<address>`, each with loopback
    /// up and `eth0` on the switch.
    pub fn create(prefix: &str, hosts: &[(&str, u8)]) -> anyhow::Result<Site> {
        let switch = format!("{prefix}-sw");
        ip(&["netns", "add", &switch])?;
        // From here on, a failure deletes what was made (the drop).
        let mut site = Site { switch: switch.clone(), hosts: Vec::new() };
        ip(&["-n", &switch, "link", "set", "lo", "up"])?;
        ip(&["-n", &switch, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &switch, "link", "set", "br0", "up"])?;
        for (i, (name, last)) in hosts.iter().enumerate() {
            let ns = format!("{prefix}-{name}");
            if ns.len() > 40 {
                bail!("namespace name {ns} is too long");
            }
            ip(&["netns", "add", &ns])?;
            let host = Host {
                name: (*name).to_owned(),
                ns: ns.clone(),
                addr: Ipv4Addr::new(SUBNET[0], SUBNET[1], SUBNET[2], *last),
                port: format!("p{i}"),
            };
            site.hosts.push(host.clone());
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            ip(&["-n", &ns, "link", "add", "eth0", "type", "veth", "peer", "name", &host.port, "netns", &switch])?;
            ip(&["-n", &switch, "link", "set", &host.port, "master", "br0", "up"])?;
            ip(&["-n", &ns, "addr", "add", &format!("{}/24", host.addr), "dev", "eth0"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        }
        Ok(site)
    }

    /// The host `name`.
    pub fn host(&self, name: &str) -> anyhow::Result<&Host> {
        self.hosts.iter().find(|h| h.name == name).with_context(|| format!("no host {name} in the site"))
    }

    /// A command running `program` on host `name` (`ip netns exec <ns> program`: the process
    /// is the program itself, `ip` execs it).
    pub fn command(&self, name: &str, program: &Path) -> anyhow::Result<tokio::process::Command> {
        let host = self.host(name)?;
        let mut cmd = tokio::process::Command::new("ip");
        cmd.args(["netns", "exec", &host.ns]).arg(program);
        Ok(cmd)
    }

    /// Cuts host `name`'s link: its switch port goes down, so nothing it sends arrives and
    /// nothing reaches it; its processes keep running and its connections hang, as behind a
    /// pulled cable.
    pub fn cut(&self, name: &str) -> anyhow::Result<()> {
        let host = self.host(name)?;
        ip(&["-n", &self.switch, "link", "set", &host.port, "down"])
    }

    /// Mends what [`Site::cut`] cut.
    pub fn mend(&self, name: &str) -> anyhow::Result<()> {
        let host = self.host(name)?;
        ip(&["-n", &self.switch, "link", "set", &host.port, "up"])
    }

    /// Gives host `name` a second address, `10.213.7.<last>`, and makes it the source of
    /// everything it sends to host `toward`: `toward` sees the host at an address no one else
    /// does, as a NAT between them would show it. Returns the address.
    pub fn source_toward(&self, name: &str, last: u8, toward: &str) -> anyhow::Result<Ipv4Addr> {
        let host = self.host(name)?;
        let peer = self.host(toward)?;
        let addr = Ipv4Addr::new(SUBNET[0], SUBNET[1], SUBNET[2], last);
        ip(&["-n", &host.ns, "addr", "add", &format!("{addr}/32"), "dev", "eth0"])?;
        ip(&["-n", &host.ns, "route", "add", &format!("{}/32", peer.addr), "dev", "eth0", "src", &addr.to_string()])?;
        Ok(addr)
    }

    /// Runs `f` to its end on a thread of its own that entered host `name`'s network
    /// namespace, with a tokio runtime there: every socket it opens is the host's. Processes
    /// it starts inherit the host's network too.
    pub fn run_on<T, F>(&self, name: &str, f: F) -> anyhow::Result<T>
    where
        T: Send + 'static,
        F: std::future::Future<Output = anyhow::Result<T>> + Send + 'static,
    {
        let path = format!("/var/run/netns/{}", self.host(name)?.ns);
        let handle = std::thread::Builder::new()
            .name(format!("netns-{name}"))
            .spawn(move || -> anyhow::Result<T> {
                let file = std::fs::File::open(&path).with_context(|| format!("open {path}"))?;
                enter_netns(&file).with_context(|| format!("enter {path}"))?;
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .context("start a runtime in the namespace")?;
                rt.block_on(f)
            })
            .context("start the namespace's thread")?;
        handle.join().map_err(|_| anyhow::anyhow!("the namespace's thread panicked"))?
    }

    /// Every host.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }
}

/// Whether this process runs as root.
#[allow(unsafe_code)]
fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Moves the calling thread into the network namespace `file` (a `/var/run/netns/` entry).
#[allow(unsafe_code)]
fn enter_netns(file: &std::fs::File) -> std::io::Result<()> {
    // SAFETY: `file` is an open descriptor alive for the call; setns changes only the calling
    // thread's network namespace (threads it starts afterwards inherit it) and touches no memory.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

impl Drop for Site {
    fn drop(&mut self) {
        for h in &self.hosts {
            if let Err(e) = ip(&["netns", "del", &h.ns]) {
                tracing::warn!("could not delete the namespace {}: {e:#}", h.ns);
            }
        }
        if let Err(e) = ip(&["netns", "del", &self.switch]) {
            tracing::warn!("could not delete the namespace {}: {e:#}", self.switch);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two hosts reach each other over the switch, not while one's link is cut, and again once
    /// it is mended; the namespaces are gone after the drop. Needs root: skipped without.
    #[test]
    fn hosts_reach_each_other_until_a_link_is_cut() {
        if let Some(why) = Site::unavailable() {
            assert!(std::env::var_os("CI").is_none(), "CI must run this: {why}");
            eprintln!("skipped: {why}");
            return;
        }
        let prefix = format!("htt{}", std::process::id() % 100_000);
        let site = Site::create(&prefix, &[("a", 1), ("b", 2)]).expect("site");
        let b = site.host("b").expect("b").addr;
        let listener =
            site.run_on("b", async { Ok(std::net::TcpListener::bind("0.0.0.0:47713")?) }).expect("listen on b");
        let connect = |site: &Site| {
            site.run_on("a", async move {
                let c =
                    tokio::time::timeout(std::time::Duration::from_secs(2), tokio::net::TcpStream::connect((b, 47713)))
                        .await;
                Ok(matches!(c, Ok(Ok(_))))
            })
        };
        assert!(connect(&site).expect("run"), "a reaches b");
        // Loopback of the caller's namespace is not the site's.
        assert!(std::net::TcpStream::connect(("127.0.0.1", 47713)).is_err());
        site.cut("b").expect("cut");
        assert!(!connect(&site).expect("run"), "not while b's link is cut");
        site.mend("b").expect("mend");
        assert!(connect(&site).expect("run"), "again once mended");
        drop(listener);
        let names: Vec<String> = site.hosts().iter().map(|h| h.ns.clone()).collect();
        drop(site);
        let list = String::from_utf8(Command::new("ip").args(["netns", "list"]).output().expect("list").stdout)
            .expect("utf-8");
        for n in names {
            assert!(!list.lines().any(|l| l.split_whitespace().next() == Some(&n)), "{n} left behind");
        }
    }
}
