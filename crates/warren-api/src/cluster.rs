//! `/v1/cluster`: the nodes registered in the state store and their leases (issue 14).
//! Membership rules live in the provisioner (`membership.rs`); this module only answers.

use axum::extract::State;
use axum::Json;
use warren_protocol::{ClusterInfo, ClusterNode, ClusterNodeState};
use warren_provisioner::{NodeRecord, NodeState};

use crate::{ApiError, ApiState};

fn node(record: &NodeRecord, runtimes: u64) -> ClusterNode {
    let time = |at: &chrono::DateTime<chrono::Utc>| {
        at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
    };
    ClusterNode {
        node_id: record.node_id.clone(),
        advertise: record.advertise.clone(),
        epoch: record.epoch,
        state: match record.state {
            NodeState::Live => ClusterNodeState::Live,
            NodeState::Lapsed => ClusterNodeState::Lapsed,
            NodeState::Left => ClusterNodeState::Left,
        },
        registered_at: time(&record.registered_at),
        renewed_at: time(&record.renewed_at),
        expires_at: time(&record.expires_at),
        left_at: record.left_at.as_ref().map(time),
        runtimes,
    }
}

/// Every node that registered in this server's state store, with its epoch and whether
/// its lease is live, lapsed or left, by the store's clock.
#[utoipa::path(
    get, path = "/v1/cluster", tag = "cluster",
    responses(
        (status = 200, body = ClusterInfo),
        (status = 503, body = warren_protocol::ErrorBody, description = "The state store is unreachable"),
    ),
    security(("bearer" = []))
)]
pub(crate) async fn get(State(state): State<ApiState>) -> Result<Json<ClusterInfo>, ApiError> {
    let nodes = state.provisioner.cluster_nodes().await?;
    let owners = state.provisioner.runtime_owners().await?;
    Ok(Json(ClusterInfo {
        node_id: state.provisioner.node().node_id.clone(),
        nodes: nodes
            .iter()
            .map(|record| {
                let runtimes = owners
                    .iter()
                    .filter(|owner| {
                        owner.node_id.as_deref() == Some(record.node_id.as_str())
                            && owner.epoch == record.epoch
                    })
                    .count();
                node(record, u64::try_from(runtimes).unwrap_or(u64::MAX))
            })
            .collect(),
    }))
}
