//! Branches of a workdir and their merger (I27): `/v1/users/{uid}/branches` and
//! `/v1/sandboxes/{id}/merge`.
//!
//! A workdir has slashes, so it travels in the body or the query, never as a path segment.

use reqwest::Method;
use warren_protocol::{
    BranchDiff, BranchInfo, BranchList, CreateBranch, MergeBranches, MergeResult,
};

use crate::{encode, ClientError, WarrenClient, FENCE_HEADER};

impl WarrenClient {
    /// `POST /v1/users/{uid}/branches`: a branch of a workdir as it is now (which is then
    /// read-only while the branch exists) or of one of its checkpoints.
    pub async fn create_branch(
        &self,
        uid: &str,
        request: &CreateBranch,
    ) -> Result<BranchInfo, ClientError> {
        self.json(
            self.request(Method::POST, &format!("/v1/users/{}/branches", encode(uid)))
                .json(request),
        )
        .await
    }

    /// `GET /v1/users/{uid}/branches`: of one workdir, or of all, oldest first.
    pub async fn list_branches(
        &self,
        uid: &str,
        workdir: Option<&str>,
    ) -> Result<BranchList, ClientError> {
        let query: Vec<(&str, &str)> = workdir.map(|w| ("workdir", w)).into_iter().collect();
        self.json(
            self.request(Method::GET, &format!("/v1/users/{}/branches", encode(uid)))
                .query(&query),
        )
        .await
    }

    /// `GET /v1/users/{uid}/branches/{branch}/diff?workdir=`: what the branch changed
    /// against its baseline.
    pub async fn branch_diff(
        &self,
        uid: &str,
        workdir: &str,
        name: &str,
    ) -> Result<BranchDiff, ClientError> {
        self.json(
            self.request(
                Method::GET,
                &format!("/v1/users/{}/branches/{}/diff", encode(uid), encode(name)),
            )
            .query(&[("workdir", workdir)]),
        )
        .await
    }

    /// `DELETE /v1/users/{uid}/branches/{branch}?workdir=`: 409 `branch_in_use` while a
    /// sandbox that is not terminated is bound to it.
    pub async fn delete_branch(
        &self,
        uid: &str,
        workdir: &str,
        name: &str,
    ) -> Result<(), ClientError> {
        self.send(
            self.request(
                Method::DELETE,
                &format!("/v1/users/{}/branches/{}", encode(uid), encode(name)),
            )
            .query(&[("workdir", workdir)]),
        )
        .await
        .map(drop)
    }

    /// `POST /v1/sandboxes/{id}/merge`: the branches merged into the sandbox's workdir,
    /// fenced by `fence` (the execution guard's token; default: the client's
    /// [`WarrenClient::with_fence`]), which only a dry run may go without. A merge that
    /// cannot combine everything is 409 `merge_conflict`, whose conflicts
    /// [`ClientError::conflicts`] gives.
    pub async fn merge_branches(
        &self,
        id: &str,
        request: &MergeBranches,
        fence: Option<u64>,
    ) -> Result<MergeResult, ClientError> {
        let path = format!("/v1/sandboxes/{}/merge", encode(id));
        let call = match fence {
            Some(token) => self
                .request(Method::POST, &path)
                .header(FENCE_HEADER, token.to_string()),
            None => self.mutating(Method::POST, &path),
        };
        self.json(call.json(request)).await
    }
}
