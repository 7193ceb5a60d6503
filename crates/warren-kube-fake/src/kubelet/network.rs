//! A pod's network: its own network namespace and a veth pair on a free /30.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use super::{Network, Settings, POD_NETWORK, SLOTS};

/// Makes the pod's network namespace and veth pair on the first free /30.
pub(super) fn make_network(settings: &Settings) -> Result<Network, String> {
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    // Processes start at different slots, so concurrent test binaries rarely collide
    // (and when they do, the namespace's name, made exclusively, decides).
    let _ = NEXT.compare_exchange(
        u32::MAX,
        (std::process::id().wrapping_mul(2654435761)) % SLOTS,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    let ip = |args: &[&str]| -> Result<(), String> {
        let output = Command::new(&settings.tools.ip)
            .args(args)
            .output()
            .map_err(|e| format!("run ip: {e}"))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    };
    let mut last_error = String::new();
    for _ in 0..SLOTS {
        let slot = NEXT.fetch_add(1, Ordering::SeqCst) % SLOTS;
        let name = format!("wkl-{slot}");
        if Path::new("/run/netns").join(&name).exists() {
            continue;
        }
        if let Err(error) = ip(&["netns", "add", &name]) {
            // Taken meanwhile by another kubelet (or a leftover): the next slot.
            last_error = error;
            continue;
        }
        let base = u32::from(POD_NETWORK) + slot * 4;
        let host_ip = Ipv4Addr::from(base + 1);
        let pod_ip = Ipv4Addr::from(base + 2);
        let host_interface = format!("wkl{slot}");
        let made = (|| {
            ip(&[
                "link",
                "add",
                &host_interface,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                &name,
            ])?;
            ip(&[
                "addr",
                "add",
                &format!("{host_ip}/30"),
                "dev",
                &host_interface,
            ])?;
            ip(&["link", "set", &host_interface, "up"])?;
            ip(&[
                "-n",
                &name,
                "addr",
                "add",
                &format!("{pod_ip}/30"),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &name, "link", "set", "eth0", "up"])?;
            ip(&["-n", &name, "link", "set", "lo", "up"])
        })();
        match made {
            Ok(()) => {
                return Ok(Network {
                    name,
                    host_interface,
                    host_ip,
                    pod_ip,
                })
            }
            Err(error) => {
                let _ = ip(&["netns", "del", &name]);
                last_error = error;
            }
        }
    }
    Err(format!("no free pod network: {last_error}"))
}
