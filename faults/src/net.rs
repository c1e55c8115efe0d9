//! The hosts a run places its processes on. As root, each host is a network
//! namespace with its own address on a bridge in the root namespace (where
//! the load and the checker run), so a partition is a cut link in the
//! kernel (blackhole routes on both sides), not a killed process; a lossy
//! link is the host's link going down in short bursts (this kernel has no
//! `netem`). Without root (or namespaces), every host is a loopback address
//! of its own and the network faults are skipped, and say so.

use std::net::Ipv4Addr;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// One host: where its processes run and the address they listen on.
#[derive(Debug, Clone)]
pub struct Host {
    pub name: String,
    pub ip: Ipv4Addr,
    /// The namespace (None: loopback mode).
    netns: Option<String>,
    /// The host's link, on the root side of its veth pair.
    link: Option<String>,
}

impl Host {
    /// A command run on this host.
    pub fn command(&self, program: &str) -> tokio::process::Command {
        match &self.netns {
            Some(ns) => {
                let mut c = tokio::process::Command::new("ip");
                c.args(["netns", "exec", ns, program]);
                c
            }
            None => tokio::process::Command::new(program),
        }
    }
}

pub struct Net {
    pub hosts: Vec<Host>,
    /// The address the load (this process) uses: the bridge's, or loopback.
    pub root_ip: Ipv4Addr,
    bridge: Option<String>,
    /// Real namespaces (partitions and lossy links possible).
    pub isolated: bool,
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .with_context(|| format!("ip {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

impl Net {
    /// `names.len()` hosts: namespaces when possible (and not `loopback`).
    pub fn setup(names: &[&str], loopback: bool) -> Result<Self> {
        if !loopback && is_root() {
            match Self::namespaces(names) {
                Ok(n) => return Ok(n),
                Err(e) => {
                    eprintln!("network namespaces unavailable ({e:#}): loopback hosts instead")
                }
            }
        }
        Ok(Self::loopback(names))
    }

    fn loopback(names: &[&str]) -> Self {
        let base = 10 + (std::process::id() % 200) as u8;
        Self {
            hosts: names
                .iter()
                .enumerate()
                .map(|(i, n)| Host {
                    name: (*n).to_owned(),
                    ip: Ipv4Addr::new(127, 77, base, 10 + i as u8),
                    netns: None,
                    link: None,
                })
                .collect(),
            root_ip: Ipv4Addr::new(127, 77, base, 1),
            bridge: None,
            isolated: false,
        }
    }

    fn namespaces(names: &[&str]) -> Result<Self> {
        // The kernel frees a deleted namespace's links lazily: every setup
        // of a run gets names of its own.
        static SETUPS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = SETUPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pid = std::process::id();
        let tag = format!("mf{:04x}{:02x}", pid % 0xffff, n % 0xff);
        let (x, y) = (200 + (pid % 50) as u8, ((pid / 50) % 250) as u8);
        let bridge = format!("{tag}br");
        let mut net = Self {
            hosts: Vec::new(),
            root_ip: Ipv4Addr::new(10, x, y, 1),
            bridge: Some(bridge.clone()),
            isolated: true,
        };
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        ip(&["link", "set", &bridge, "up"])?;
        ip(&[
            "addr",
            "add",
            &format!("{}/24", net.root_ip),
            "dev",
            &bridge,
        ])?;
        for (i, name) in names.iter().enumerate() {
            let ns = format!("{tag}-{name}");
            let (outer, inner) = (format!("{tag}{i}"), format!("{tag}{i}p"));
            let host_ip = Ipv4Addr::new(10, x, y, 10 + i as u8);
            // Pushed first: a failure below still cleans this host up.
            net.hosts.push(Host {
                name: (*name).to_owned(),
                ip: host_ip,
                netns: Some(ns.clone()),
                link: Some(outer.clone()),
            });
            ip(&["netns", "add", &ns])?;
            ip(&[
                "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ])?;
            ip(&["link", "set", &inner, "netns", &ns])?;
            ip(&["link", "set", &outer, "master", &bridge])?;
            ip(&["link", "set", &outer, "up"])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{host_ip}/24"),
                "dev",
                &inner,
            ])?;
            ip(&["-n", &ns, "link", "set", &inner, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    pub fn host(&self, name: &str) -> &Host {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .unwrap_or_else(|| panic!("no host {name}"))
    }

    /// Cuts (or heals) the link between two hosts, both ways: packets
    /// between them are dropped by the kernel.
    pub fn cut(&self, a: &str, b: &str, cut: bool) -> Result<()> {
        let (a, b) = (self.host(a), self.host(b));
        let verb = if cut { "add" } else { "del" };
        for (from, to) in [(a, b), (b, a)] {
            let Some(ns) = &from.netns else {
                bail!("a cut needs network namespaces");
            };
            ip(&[
                "-n",
                ns,
                "route",
                verb,
                "blackhole",
                &format!("{}/32", to.ip),
            ])?;
        }
        Ok(())
    }

    /// The root side of the host's link (namespaces only).
    pub fn link_name(&self, host: &str) -> Option<String> {
        self.host(host).link.clone()
    }

    /// The host's link up or down (every packet to and from it dropped).
    pub fn link(&self, host: &str, up: bool) -> Result<()> {
        let Some(l) = &self.host(host).link else {
            bail!("a link fault needs network namespaces");
        };
        ip(&["link", "set", l, if up { "up" } else { "down" }])
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for h in &self.hosts {
            if let Some(ns) = &h.netns {
                let _ = ip(&["netns", "del", ns]);
            }
        }
        if let Some(b) = &self.bridge {
            let _ = ip(&["link", "del", b]);
        }
    }
}
