//! A sandbox of E2B's over a real provisioner for the envd tests: SQLite in memory, the
//! memory backend, a workspace in a temporary directory removed afterwards.

use std::sync::Arc;

use warren_backend::MemoryBackend;
use warren_core::{LayoutName, RuntimeScope, Uid, Workdir};
use warren_fs::WorkspaceRoot;
use warren_provisioner::{Provisioner, ProvisionerConfig, SandboxRequest};
use warren_store::SqliteStore;

use crate::envd::EnvdContext;
use crate::state::E2bSandbox;
use crate::{E2b, E2bConfig};

pub(crate) struct Fixture {
    pub(crate) ctx: EnvdContext,
    /// The sandbox's workdir (`/home/user`), written as a runtime would.
    pub(crate) files: WorkspaceRoot,
    pub(crate) data_dir: std::path::PathBuf,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

/// The running E2B sandbox `sandbox_id` (20 letters and digits, as E2B's ids) of uid
/// `alice`, on a server of its own.
pub(crate) async fn fixture(sandbox_id: &str) -> Fixture {
    let data_dir =
        std::env::temp_dir().join(format!("warren-e2b-envd-{:032x}", rand::random::<u128>()));
    std::fs::create_dir_all(&data_dir).unwrap();
    let store = SqliteStore::open_in_memory().await.unwrap();
    let provisioner = Arc::new(Provisioner::new(
        ProvisionerConfig::new(&data_dir),
        Arc::new(store),
        Arc::new(MemoryBackend::new()),
    ));
    let e2b = E2b::new(provisioner.clone(), E2bConfig::new(vec![]), b"digest");
    let uid = Uid::plain("alice").unwrap();
    let workdir = format!("e2b/{sandbox_id}");
    provisioner
        .create_workdir(&uid, Some(&workdir))
        .await
        .unwrap();
    let mut request = SandboxRequest::new(
        uid.clone(),
        RuntimeScope::new(format!("e2b-{sandbox_id}")).unwrap(),
    );
    request.workdir = Some(workdir.clone());
    request.layout = Some(LayoutName::E2b);
    let (record, _) = provisioner.create_sandbox(request).await.unwrap();
    let sandbox = E2bSandbox {
        sandbox_id: sandbox_id.to_owned(),
        warren_id: record.id,
        uid: uid.clone(),
        template_id: "base".to_owned(),
        alias: None,
        env_vars: Default::default(),
        secure: true,
        allow_internet_access: true,
        cpu_count: 2,
        memory_mb: 512,
    };
    crate::control::save_new(&e2b.shared, &sandbox)
        .await
        .unwrap();
    let files = provisioner
        .workspaces()
        .workdir_root(&uid, &Workdir::new(workdir).unwrap())
        .await
        .unwrap();
    Fixture {
        ctx: EnvdContext {
            shared: e2b.shared.clone(),
            sandbox,
            user: None,
        },
        files,
        data_dir,
    }
}
