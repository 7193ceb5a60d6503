//! Egress secrets and the egress audit (issue 38): `warren secret list|set|rm` and
//! `warren egress`. All of it is the server's API; a value is read from stdin and never
//! printed.

use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use warren_client::SecretOwner;
use warren_protocol::{SecretPresentation, SecretTargetSpec, SetEgressSecret};

use super::client::{print_json, report, value_from_stdin, Connection};

#[derive(Debug, Args)]
pub struct SecretArgs {
    #[command(subcommand)]
    command: SecretCommand,
    #[command(flatten)]
    connection: Connection,
}

/// Whose secret: a uid's (every sandbox of theirs) or one sandbox's own.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
struct Owner {
    /// A uid's secrets.
    #[arg(long)]
    uid: Option<String>,
    /// One sandbox's own secrets (a list shows its uid's too).
    #[arg(long)]
    sandbox: Option<String>,
}

impl Owner {
    fn owner(&self) -> SecretOwner<'_> {
        match (&self.uid, &self.sandbox) {
            (Some(uid), _) => SecretOwner::Uid(uid),
            (None, Some(id)) => SecretOwner::Sandbox(id),
            (None, None) => unreachable!("clap requires one"),
        }
    }
}

#[derive(Debug, Subcommand)]
enum SecretCommand {
    /// List secrets: names, bindings, lengths and hints, never values.
    List {
        #[command(flatten)]
        owner: Owner,
    },
    /// Set a secret, or rotate it in place; the value is read from stdin (one trailing
    /// newline removed) unless a --source mints it. Inside a sandbox only `WARREN_SECRET_<NAME>` exists, holding a
    /// placeholder; warren's proxy presents the value to the bound destinations only.
    Set {
        #[command(flatten)]
        owner: Owner,
        /// The name: A-Z, 0-9 and _, starting with a letter.
        name: String,
        /// A destination, repeatable: `host` (port 443), `host:port[,port...]`, each
        /// optionally followed by a path prefix (`api.example.com:443/v1/`).
        #[arg(long = "target", required = true)]
        targets: Vec<String>,
        /// Present it as `<name>: <prefix><value>` (`X-Api-Key` or `X-Api-Key:token `)
        /// instead of `Authorization: Bearer <value>`.
        #[arg(long, conflicts_with_all = ["query", "basic"])]
        header: Option<String>,
        /// Present it as the query parameter `<name>=<value>`.
        #[arg(long, conflicts_with = "basic")]
        query: Option<String>,
        /// Present it as basic authentication with this user name.
        #[arg(long)]
        basic: Option<String>,
        /// Mint it per sandbox from this operator's source (`network.secret_sources`)
        /// instead of reading a value from stdin.
        #[arg(long)]
        source: Option<String>,
    },
    /// Remove a secret.
    Rm {
        #[command(flatten)]
        owner: Owner,
        /// The name.
        name: String,
    },
}

#[derive(Debug, Args)]
pub struct EgressArgs {
    /// The sandbox.
    id: String,
    /// Only connections after this id.
    #[arg(long)]
    after: Option<i64>,
    /// Most connections shown (1 to 1000).
    #[arg(long, default_value_t = 100)]
    limit: u32,
    #[command(flatten)]
    connection: Connection,
}

/// `host[:port[,port...]][/prefix]`.
fn target(text: &str) -> anyhow::Result<SecretTargetSpec> {
    let (authority, path_prefix) = match text.find('/') {
        Some(i) => (&text[..i], Some(text[i..].to_owned())),
        None => (text, None),
    };
    let (host, ports) = match authority.strip_prefix('[') {
        Some(rest) => {
            let (host, after) = rest.split_once(']').context("an unclosed [ in a target")?;
            (host, after.strip_prefix(':'))
        }
        None => match authority.split_once(':') {
            Some((host, ports)) => (host, Some(ports)),
            None => (authority, None),
        },
    };
    let ports = ports
        .map(|list| {
            list.split(',')
                .map(|p| p.parse::<u16>().with_context(|| format!("port {p:?}")))
                .collect::<anyhow::Result<Vec<_>>>()
        })
        .transpose()?
        .unwrap_or_default();
    if host.is_empty() {
        bail!("a target names a host: {text:?}");
    }
    Ok(SecretTargetSpec {
        host: host.to_owned(),
        ports,
        path_prefix,
    })
}

pub async fn secret(args: SecretArgs) -> anyhow::Result<ExitCode> {
    let client = args.connection.client()?;
    let result = match args.command {
        SecretCommand::List { owner } => client
            .egress_secrets(owner.owner())
            .await
            .map(|list| serde_json::to_value(list).unwrap_or_default()),
        SecretCommand::Set {
            owner,
            name,
            targets,
            header,
            query,
            basic,
            source,
        } => {
            let value = match source {
                Some(_) => None,
                None => Some(value_from_stdin()?),
            };
            let present = match (header, query, basic) {
                (Some(header), _, _) => {
                    let (name, prefix) = header.split_once(':').unwrap_or((&header, ""));
                    SecretPresentation::Header {
                        name: name.to_owned(),
                        prefix: prefix.to_owned(),
                    }
                }
                (None, Some(name), _) => SecretPresentation::Query { name },
                (None, None, Some(username)) => SecretPresentation::Basic { username },
                (None, None, None) => SecretPresentation::Bearer {},
            };
            let secret = SetEgressSecret {
                targets: targets
                    .iter()
                    .map(|t| target(t))
                    .collect::<anyhow::Result<_>>()?,
                present,
                value,
                source,
            };
            client
                .set_egress_secret(owner.owner(), &name, &secret)
                .await
                .map(|info| serde_json::to_value(info).unwrap_or_default())
        }
        SecretCommand::Rm { owner, name } => client
            .remove_egress_secret(owner.owner(), &name)
            .await
            .map(|()| serde_json::json!({ "removed": name })),
    };
    match result {
        Ok(value) => print_json(&value).map(|()| ExitCode::SUCCESS),
        Err(e) => report(e),
    }
}

pub async fn egress(args: EgressArgs) -> anyhow::Result<ExitCode> {
    let client = args.connection.client()?;
    match client.egress_log(&args.id, args.after, args.limit).await {
        Ok(log) => {
            print_json(&serde_json::to_value(log).unwrap_or_default()).map(|()| ExitCode::SUCCESS)
        }
        Err(e) => report(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_read_as_host_ports_and_a_path_prefix() {
        let t = target("api.example.com:443,8443/v1/").unwrap();
        assert_eq!(
            (t.host.as_str(), t.ports, t.path_prefix.as_deref()),
            ("api.example.com", vec![443, 8443], Some("/v1/"))
        );
        let plain = target("h.example").unwrap();
        assert_eq!((plain.ports.len(), plain.path_prefix), (0, None));
        let v6 = target("[::1]:8080").unwrap();
        assert_eq!((v6.host.as_str(), v6.ports), ("::1", vec![8080]));
        assert!(target(":443").is_err());
        assert!(target("h:notaport").is_err());
    }
}
