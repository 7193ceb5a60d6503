//! `/v1/users/{uid}/secrets`, `/v1/sandboxes/{id}/secrets` and `/v1/sandboxes/{id}/egress`
//! (issue 38): egress secrets, whose values go in and never come back out, and the record
//! of every connection a sandbox made.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Deserialize;
use warren_core::{
    EgressSecret, EgressVerdict, Presentation, SandboxId, SecretName, SecretRule, SecretTarget,
};
use warren_protocol::{
    EgressConnection, EgressLog, EgressSecretInfo, EgressSecretList, NewEgressSecret,
    SecretPresentation, SecretScope, SecretTargetSpec, SetEgressSecret,
};
use warren_provisioner::{Created, ProvisionerError};
use warren_store::EgressSecretRecord;

use crate::extract::{sandbox_id, uid, ApiJson, ApiPath, ApiQuery, Fence, SandboxPath};
use crate::{ApiError, ApiState};

/// A checked secret from its wire form.
pub(crate) fn secret(
    name: String,
    targets: Vec<SecretTargetSpec>,
    present: SecretPresentation,
    value: Option<String>,
    source: Option<String>,
) -> Result<EgressSecret, ApiError> {
    let core = |e| ApiError::from(ProvisionerError::from(e));
    let rule = SecretRule {
        targets: targets
            .into_iter()
            .map(|t| SecretTarget {
                host: t.host,
                ports: t.ports,
                path_prefix: t.path_prefix,
            })
            .collect(),
        present: match present {
            SecretPresentation::Bearer {} => Presentation::Bearer,
            SecretPresentation::Header { name, prefix } => Presentation::Header { name, prefix },
            SecretPresentation::Query { name } => Presentation::Query { name },
            SecretPresentation::Basic { username } => Presentation::Basic { username },
        },
        source,
    };
    EgressSecret::new(
        SecretName::new(name).map_err(core)?,
        rule,
        value.unwrap_or_default(),
    )
    .map_err(core)
}

/// The secrets given with `POST /v1/sandboxes`.
pub(crate) fn new_secrets(secrets: Vec<NewEgressSecret>) -> Result<Vec<EgressSecret>, ApiError> {
    secrets
        .into_iter()
        .map(|s| secret(s.name, s.targets, s.present, s.value, s.source))
        .collect()
}

fn info(record: &EgressSecretRecord) -> EgressSecretInfo {
    let secret = &record.secret;
    EgressSecretInfo {
        name: secret.name.to_string(),
        scope: if record.sandbox.is_some() {
            SecretScope::Sandbox
        } else {
            SecretScope::Uid
        },
        env: secret.name.env_name(),
        targets: secret
            .rule
            .targets
            .iter()
            .map(|t| SecretTargetSpec {
                host: t.host.clone(),
                ports: t.ports.clone(),
                path_prefix: t.path_prefix.clone(),
            })
            .collect(),
        present: match &secret.rule.present {
            Presentation::Bearer => SecretPresentation::Bearer {},
            Presentation::Header { name, prefix } => SecretPresentation::Header {
                name: name.clone(),
                prefix: prefix.clone(),
            },
            Presentation::Query { name } => SecretPresentation::Query { name: name.clone() },
            Presentation::Basic { username } => SecretPresentation::Basic {
                username: username.clone(),
            },
        },
        source: secret.rule.source.clone(),
        length: secret.value.len(),
        hint: secret.hint(),
        updated_at: record.updated_at.to_rfc3339(),
    }
}

fn list(records: &[EgressSecretRecord]) -> EgressSecretList {
    EgressSecretList {
        secrets: records.iter().map(info).collect(),
    }
}

fn name(raw: String) -> Result<SecretName, ApiError> {
    SecretName::new(raw).map_err(|e| ProvisionerError::from(e).into())
}

fn status(created: Created) -> StatusCode {
    match created {
        Created::New => StatusCode::CREATED,
        Created::Existing => StatusCode::OK,
    }
}

/// The one just set, read back (without its value).
fn find(
    records: &[EgressSecretRecord],
    wanted: &SecretName,
    sandbox: bool,
) -> Result<EgressSecretInfo, ApiError> {
    records
        .iter()
        .find(|r| r.secret.name == *wanted && r.sandbox.is_some() == sandbox)
        .map(info)
        // Set a moment ago; only a concurrent removal can make it vanish again.
        .ok_or_else(|| {
            ProvisionerError::EgressSecretNotFound {
                name: wanted.to_string(),
            }
            .into()
        })
}

/// The uid's egress secrets, without their values.
#[utoipa::path(
    get, path = "/v1/users/{uid}/secrets", tag = "secrets",
    params(("uid" = String, Path, description = "The workspace owner")),
    responses((status = 200, body = EgressSecretList)),
    security(("bearer" = []))
)]
pub(crate) async fn of_user(
    State(state): State<ApiState>,
    ApiPath(raw_uid): ApiPath<String>,
) -> Result<Json<EgressSecretList>, ApiError> {
    let uid = uid(raw_uid)?;
    Ok(Json(list(&state.provisioner.egress_secrets(&uid).await?)))
}

/// Sets one of the uid's egress secrets (201 when new, 200 when rotated): every sandbox of
/// theirs may present it to the destinations it is bound to, from its next connection on.
#[utoipa::path(
    put, path = "/v1/users/{uid}/secrets/{name}", tag = "secrets",
    params(
        ("uid" = String, Path, description = "The workspace owner"),
        ("name" = String, Path, description = "The secret's name"),
    ),
    request_body = SetEgressSecret,
    responses(
        (status = 201, body = EgressSecretInfo, description = "Created"),
        (status = 200, body = EgressSecretInfo, description = "Rotated"),
        (status = 400, body = warren_protocol::ErrorBody, description = "invalid_secret, token_in_env"),
        (status = 409, body = warren_protocol::ErrorBody, description = "egress_secrets_full"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn set_for_user(
    State(state): State<ApiState>,
    ApiPath((raw_uid, raw_name)): ApiPath<(String, String)>,
    ApiJson(request): ApiJson<SetEgressSecret>,
) -> Result<(StatusCode, Json<EgressSecretInfo>), ApiError> {
    let uid = uid(raw_uid)?;
    let secret = secret(
        raw_name,
        request.targets,
        request.present,
        request.value,
        request.source,
    )?;
    let wanted = secret.name.clone();
    let created = state.provisioner.set_egress_secret(&uid, secret).await?;
    let records = state.provisioner.egress_secrets(&uid).await?;
    Ok((status(created), Json(find(&records, &wanted, false)?)))
}

/// Removes one of the uid's egress secrets.
#[utoipa::path(
    delete, path = "/v1/users/{uid}/secrets/{name}", tag = "secrets",
    params(
        ("uid" = String, Path, description = "The workspace owner"),
        ("name" = String, Path, description = "The secret's name"),
    ),
    responses(
        (status = 204, description = "Removed"),
        (status = 400, body = warren_protocol::ErrorBody, description = "invalid_secret"),
        (status = 404, body = warren_protocol::ErrorBody, description = "egress_secret_not_found"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn remove_for_user(
    State(state): State<ApiState>,
    ApiPath((raw_uid, raw_name)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let uid = uid(raw_uid)?;
    let name = name(raw_name)?;
    state.provisioner.remove_egress_secret(&uid, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The egress secrets the sandbox may present: its own, and its uid's it does not shadow.
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/secrets", tag = "secrets",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, body = EgressSecretList),
        (status = 404, body = warren_protocol::ErrorBody, description = "sandbox_not_found"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn of_sandbox(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
) -> Result<Json<EgressSecretList>, ApiError> {
    Ok(Json(list(
        &state.provisioner.sandbox_egress_secrets(&id).await?,
    )))
}

/// Sets one of the sandbox's own egress secrets (201 when new, 200 when rotated).
#[utoipa::path(
    put, path = "/v1/sandboxes/{id}/secrets/{name}", tag = "secrets",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("name" = String, Path, description = "The secret's name"),
    ),
    request_body = SetEgressSecret,
    responses(
        (status = 201, body = EgressSecretInfo, description = "Created"),
        (status = 200, body = EgressSecretInfo, description = "Rotated"),
        (status = 400, body = warren_protocol::ErrorBody, description = "invalid_secret, invalid_sandbox_id, token_in_env"),
        (status = 404, body = warren_protocol::ErrorBody, description = "sandbox_not_found"),
        (status = 409, body = warren_protocol::ErrorBody, description = "egress_secrets_full"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn set_for_sandbox(
    State(state): State<ApiState>,
    ApiPath((raw_id, raw_name)): ApiPath<(String, String)>,
    Fence(fence): Fence,
    ApiJson(request): ApiJson<SetEgressSecret>,
) -> Result<(StatusCode, Json<EgressSecretInfo>), ApiError> {
    let id = sandbox_id(&raw_id)?;
    let _permit = state.provisioner.fence(&id, fence).await?;
    let secret = secret(
        raw_name,
        request.targets,
        request.present,
        request.value,
        request.source,
    )?;
    let wanted = secret.name.clone();
    let created = state
        .provisioner
        .set_sandbox_egress_secret(&id, secret)
        .await?;
    let records = state.provisioner.sandbox_egress_secrets(&id).await?;
    Ok((status(created), Json(find(&records, &wanted, true)?)))
}

/// Removes one of the sandbox's own egress secrets.
#[utoipa::path(
    delete, path = "/v1/sandboxes/{id}/secrets/{name}", tag = "secrets",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("name" = String, Path, description = "The secret's name"),
    ),
    responses(
        (status = 204, description = "Removed"),
        (status = 400, body = warren_protocol::ErrorBody, description = "invalid_secret, invalid_sandbox_id"),
        (status = 404, body = warren_protocol::ErrorBody, description = "sandbox_not_found, egress_secret_not_found"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn remove_for_sandbox(
    State(state): State<ApiState>,
    ApiPath((raw_id, raw_name)): ApiPath<(String, String)>,
    Fence(fence): Fence,
) -> Result<StatusCode, ApiError> {
    let id: SandboxId = sandbox_id(&raw_id)?;
    let _permit = state.provisioner.fence(&id, fence).await?;
    let name = name(raw_name)?;
    state
        .provisioner
        .remove_sandbox_egress_secret(&id, &name)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct EgressQuery {
    /// Only connections after this one (the `id` of the last one read).
    after: Option<i64>,
    /// Most connections returned (default 100, at most 1000).
    limit: Option<u32>,
}

/// Every connection the sandbox made or was refused through warren's egress proxy, oldest
/// first, in all its generations: what it talked to, kept after its runtime is gone (the
/// newest 10000).
#[utoipa::path(
    get, path = "/v1/sandboxes/{id}/egress", tag = "secrets",
    params(("id" = String, Path, description = "Sandbox id"), EgressQuery),
    responses(
        (status = 200, body = EgressLog),
        (status = 400, body = warren_protocol::ErrorBody, description = "invalid_sandbox_id, invalid_query"),
        (status = 404, body = warren_protocol::ErrorBody, description = "sandbox_not_found"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn egress(
    State(state): State<ApiState>,
    SandboxPath(id): SandboxPath,
    ApiQuery(query): ApiQuery<EgressQuery>,
) -> Result<Json<EgressLog>, ApiError> {
    let limit = query.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::bad_request(
            warren_protocol::code!(400, "invalid_query"),
            "limit is 1 to 1000",
        ));
    }
    let records = state
        .provisioner
        .egress_events(&id, query.after, limit as usize)
        .await?;
    let connections = records
        .into_iter()
        .map(|record| {
            let event = record.event;
            let time = |ms: i64| {
                DateTime::<Utc>::from_timestamp_millis(ms)
                    .unwrap_or_default()
                    .to_rfc3339_opts(SecondsFormat::Millis, true)
            };
            EgressConnection {
                id: record.id,
                connection: event.connection,
                at: time(event.at),
                ended_at: event.ended_at.map(time),
                host: event.host,
                port: event.port,
                address: event.address,
                verdict: match event.verdict {
                    EgressVerdict::Allowed => "allowed",
                    EgressVerdict::Refused => "refused",
                }
                .to_owned(),
                rule: event.rule,
                secrets: event.secrets.iter().map(ToString::to_string).collect(),
                intercepted: event.intercepted,
                bytes_out: event.bytes_out,
                bytes_in: event.bytes_in,
                reason: event.reason,
            }
        })
        .collect();
    Ok(Json(EgressLog {
        sandbox_id: id.to_string(),
        connections,
    }))
}
