//! warren's egress proxy for pods: a command with egress is pointed at it, and it serves
//! a connection only from the address of a pod warren runs with egress.

use std::net::SocketAddr;
use std::time::Duration;

use super::{Known, KubernetesBackend, Runtimes};

impl KubernetesBackend {
    /// A command with egress uses warren's proxy, not the runtime's loopback (a pod has no
    /// proxy port of its own).
    pub(super) fn point_at_proxy(
        &self,
        known: &Known,
        spec: &mut warren_agent::protocol::ExecSpec,
    ) {
        if known.spec.binding.network.has_egress() {
            // Not the runtime's loopback (a pod has no proxy port of its own): warren's.
            let host = match self.config.proxy_host.as_deref() {
                Some("node") | None => known.host_ip.map(|ip| ip.to_string()).unwrap_or_default(),
                Some(host) => host.to_owned(),
            };
            let port = self.proxy_port.unwrap_or(0);
            let url = match host.parse::<std::net::Ipv6Addr>() {
                Ok(_) => format!("http://[{host}]:{port}"),
                Err(_) => format!("http://{host}:{port}"),
            };
            // In place of the loopback proxy only: a value the runtime's or the call's own
            // environment set still wins (I14).
            let loopback = format!("http://127.0.0.1:{}", warren_agent::environment::PROXY_PORT);
            for (name, value) in warren_agent::client::proxy_environment_at(&url) {
                if spec.env.get(&name) == Some(&loopback) {
                    spec.env.insert(name, value);
                }
            }
        }
    }
}

/// Serves warren's egress proxy to pods on `address`: a connection is a runtime's when it
/// comes from the address of a pod warren runs with network `open` or `allowlist`, and is
/// then checked against that runtime's policy (`warren_agent::egress`); any other is closed
/// at once. Returns the port it listens on.
pub(super) fn serve_proxy(address: SocketAddr, runtimes: Runtimes) -> std::io::Result<u16> {
    let handle = tokio::runtime::Handle::try_current()
        .map_err(|_| std::io::Error::other("the egress proxy needs a tokio runtime"))?;
    let listener = std::net::TcpListener::bind(address)?;
    let port = listener.local_addr()?.port();
    listener.set_nonblocking(true)?;
    let listener = {
        let _entered = handle.enter();
        tokio::net::TcpListener::from_std(listener)?
    };
    let runtime = handle.clone();
    handle.spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "the egress proxy for pods could not accept");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let found = runtimes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .find(|known| known.pod_ip == peer.ip() && known.spec.binding.network.has_egress())
                .map(|known| known.egress.clone());
            let Some(egress) = found else {
                tracing::debug!(%peer, "an egress connection from no sandbox with egress");
                continue;
            };
            let Ok(stream) = stream.into_std() else {
                continue;
            };
            warren_agent::egress::spawn_connection(stream, &egress, &runtime);
        }
    });
    Ok(port)
}
