//! `/v1/users/{uid}/env`: a uid's agent environment (I13, I14). Values go in and never come
//! back out: reads show names, lengths and at most a four-character hint.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use warren_core::{AgentEnvVar, Uid};
use warren_protocol::{AgentEnv, AgentEnvEntry, AgentEnvValue, ReplaceAgentEnv, SetAgentEnvVar};
use warren_provisioner::{Created, ProvisionerError};
use warren_store::AgentEnvRecord;

use crate::extract::{uid, ApiJson, ApiPath};
use crate::{ApiError, ApiState};

fn view(uid: &Uid, records: &[AgentEnvRecord]) -> AgentEnv {
    AgentEnv {
        uid: uid.to_string(),
        variables: records
            .iter()
            .map(|record| AgentEnvEntry {
                name: record.var.name.clone(),
                secret: record.var.secret,
                length: record.var.value.len(),
                hint: record.var.hint(),
                updated_at: record.updated_at.to_rfc3339(),
            })
            .collect(),
    }
}

/// A checked variable; the provisioner refuses the token in its value (I13).
fn variable(name: String, value: SetAgentEnvVar) -> Result<AgentEnvVar, ApiError> {
    AgentEnvVar::new(name, value.value, value.secret.unwrap_or(true))
        .map_err(|e| ProvisionerError::from(e).into())
}

/// The uid's agent environment, without its values.
#[utoipa::path(
    get, path = "/v1/users/{uid}/env", tag = "env",
    params(("uid" = String, Path, description = "The workspace owner")),
    responses((status = 200, body = AgentEnv)),
    security(("bearer" = []))
)]
pub(crate) async fn get(
    State(state): State<ApiState>,
    ApiPath(raw_uid): ApiPath<String>,
) -> Result<Json<AgentEnv>, ApiError> {
    let uid = uid(raw_uid)?;
    let records = state.provisioner.agent_env(&uid).await?;
    Ok(Json(view(&uid, &records)))
}

/// Replaces the uid's whole agent environment. Commands of its sandboxes that inherit the
/// environment (the default) get these variables from their next start on; a bare string
/// value is a secret, masked as `[masked:NAME]` in command output.
#[utoipa::path(
    put, path = "/v1/users/{uid}/env", tag = "env",
    params(("uid" = String, Path, description = "The workspace owner")),
    request_body = ReplaceAgentEnv,
    responses(
        (status = 200, body = AgentEnv, description = "The new environment, without values"),
        (status = 400, body = warren_protocol::ErrorBody, description = "invalid_env, token_in_env"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn replace(
    State(state): State<ApiState>,
    ApiPath(raw_uid): ApiPath<String>,
    ApiJson(request): ApiJson<ReplaceAgentEnv>,
) -> Result<Json<AgentEnv>, ApiError> {
    let uid = uid(raw_uid)?;
    let vars = request
        .env
        .into_iter()
        .map(|(name, value)| {
            let value = match value {
                AgentEnvValue::Secret(value) => SetAgentEnvVar {
                    value,
                    secret: Some(true),
                },
                AgentEnvValue::Detailed(value) => value,
            };
            variable(name, value)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let records = state.provisioner.replace_agent_env(&uid, vars).await?;
    Ok(Json(view(&uid, &records)))
}

/// Removes the uid's whole agent environment.
#[utoipa::path(
    delete, path = "/v1/users/{uid}/env", tag = "env",
    params(("uid" = String, Path, description = "The workspace owner")),
    responses((status = 204, description = "Cleared")),
    security(("bearer" = []))
)]
pub(crate) async fn clear(
    State(state): State<ApiState>,
    ApiPath(raw_uid): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    let uid = uid(raw_uid)?;
    state
        .provisioner
        .replace_agent_env(&uid, Vec::new())
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Sets one variable (201 when new, 200 when replaced), so a client can rotate one secret
/// without knowing the others' values.
#[utoipa::path(
    put, path = "/v1/users/{uid}/env/{name}", tag = "env",
    params(
        ("uid" = String, Path, description = "The workspace owner"),
        ("name" = String, Path, description = "The variable's name"),
    ),
    request_body = SetAgentEnvVar,
    responses(
        (status = 201, body = AgentEnvEntry, description = "Created"),
        (status = 200, body = AgentEnvEntry, description = "Replaced"),
        (status = 400, body = warren_protocol::ErrorBody, description = "invalid_env, token_in_env"),
        (status = 409, body = warren_protocol::ErrorBody, description = "agent_env_full"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn set(
    State(state): State<ApiState>,
    ApiPath((raw_uid, name)): ApiPath<(String, String)>,
    ApiJson(request): ApiJson<SetAgentEnvVar>,
) -> Result<(StatusCode, Json<AgentEnvEntry>), ApiError> {
    let uid = uid(raw_uid)?;
    let var = variable(name, request)?;
    let entry_name = var.name.clone();
    let created = state.provisioner.set_agent_env_var(&uid, var).await?;
    let records = state.provisioner.agent_env(&uid).await?;
    let entry = view(&uid, &records)
        .variables
        .into_iter()
        .find(|entry| entry.name == entry_name)
        // Set a moment ago; only a concurrent removal can make it vanish again.
        .ok_or_else(|| ProvisionerError::EnvVarNotFound {
            uid: uid.to_string(),
            name: entry_name.clone(),
        })?;
    let status = match created {
        Created::New => StatusCode::CREATED,
        Created::Existing => StatusCode::OK,
    };
    Ok((status, Json(entry)))
}

/// Removes one variable.
#[utoipa::path(
    delete, path = "/v1/users/{uid}/env/{name}", tag = "env",
    params(
        ("uid" = String, Path, description = "The workspace owner"),
        ("name" = String, Path, description = "The variable's name"),
    ),
    responses(
        (status = 204, description = "Removed"),
        (status = 404, body = warren_protocol::ErrorBody, description = "env_var_not_found"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn remove(
    State(state): State<ApiState>,
    ApiPath((raw_uid, name)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let uid = uid(raw_uid)?;
    state.provisioner.remove_agent_env_var(&uid, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}
