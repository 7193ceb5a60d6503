//! Egress secrets and the egress audit (issue 38): `/v1/users/{uid}/secrets`,
//! `/v1/sandboxes/{id}/secrets` and `/v1/sandboxes/{id}/egress`.

use reqwest::Method;
use warren_protocol::{EgressLog, EgressSecretInfo, EgressSecretList, SetEgressSecret};

use crate::{encode, ClientError, WarrenClient};

/// Whose secrets a call is about.
#[derive(Debug, Clone, Copy)]
pub enum SecretOwner<'a> {
    /// A uid's: every sandbox of theirs may present them.
    Uid(&'a str),
    /// One sandbox's own (the list shows its uid's too).
    Sandbox(&'a str),
}

impl SecretOwner<'_> {
    fn path(self) -> String {
        match self {
            Self::Uid(uid) => format!("/v1/users/{}/secrets", encode(uid)),
            Self::Sandbox(id) => format!("/v1/sandboxes/{}/secrets", encode(id)),
        }
    }
}

impl WarrenClient {
    /// `GET …/secrets`: names, bindings and hints, never values.
    pub async fn egress_secrets(
        &self,
        owner: SecretOwner<'_>,
    ) -> Result<EgressSecretList, ClientError> {
        self.json(self.request(Method::GET, &owner.path())).await
    }

    /// `PUT …/secrets/{name}`: sets or rotates one.
    pub async fn set_egress_secret(
        &self,
        owner: SecretOwner<'_>,
        name: &str,
        secret: &SetEgressSecret,
    ) -> Result<EgressSecretInfo, ClientError> {
        let path = format!("{}/{}", owner.path(), encode(name));
        self.json(self.mutating(Method::PUT, &path).json(secret))
            .await
    }

    /// `DELETE …/secrets/{name}`.
    pub async fn remove_egress_secret(
        &self,
        owner: SecretOwner<'_>,
        name: &str,
    ) -> Result<(), ClientError> {
        let path = format!("{}/{}", owner.path(), encode(name));
        self.send(self.mutating(Method::DELETE, &path))
            .await
            .map(drop)
    }

    /// `GET /v1/sandboxes/{id}/egress`: the connections after `after`, oldest first.
    pub async fn egress_log(
        &self,
        id: &str,
        after: Option<i64>,
        limit: u32,
    ) -> Result<EgressLog, ClientError> {
        let mut path = format!("/v1/sandboxes/{}/egress?limit={limit}", encode(id));
        if let Some(after) = after {
            path.push_str(&format!("&after={after}"));
        }
        self.json(self.request(Method::GET, &path)).await
    }
}
