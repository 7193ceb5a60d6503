//! Reading run records back (I22): what ran in a sandbox, or in any sandbox of a uid, and
//! how it ended.

use warren_store::{RunPage, RunQuery, RunScope};

use crate::{Provisioner, ProvisionerError};

impl Provisioner {
    /// One page of runs, newest first (see [`RunQuery`]). A sandbox never created is
    /// [`ProvisionerError::SandboxNotFound`]; a uid with no sandboxes has no runs.
    pub async fn runs(&self, query: &RunQuery) -> Result<RunPage, ProvisionerError> {
        if let RunScope::Sandbox(id) = &query.scope {
            self.sandbox(id).await?;
        }
        Ok(self.store.query_runs(query).await?)
    }
}
