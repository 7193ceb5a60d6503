//! A sandbox of E2B's over a real provisioner for the envd tests: the provisioner's test
//! fixture (SQLite in memory, a backend double that runs no commands, as the memory backend,
//! a workspace in a temporary directory removed afterwards).

use warren_core::{LayoutName, RuntimeScope, Uid, Workdir};
use warren_fs::WorkspaceRoot;
use warren_provisioner::testing::{self, ScriptedBackend};
use warren_provisioner::SandboxRequest;

use crate::envd::EnvdContext;
use crate::state::E2bSandbox;
use crate::{E2b, E2bConfig};

pub(crate) struct Fixture {
    pub(crate) ctx: EnvdContext,
    /// The sandbox's workdir (`/home/user`), written as a runtime would.
    pub(crate) files: WorkspaceRoot,
    pub(crate) data_dir: std::path::PathBuf,
    /// The provisioner's fixture: removes the data directory when dropped.
    _provisioner: testing::Fixture,
}

/// The running E2B sandbox `sandbox_id` (20 letters and digits, as E2B's ids) of uid
/// `alice`, on a server of its own.
pub(crate) async fn fixture(sandbox_id: &str) -> Fixture {
    let fixture = testing::Fixture::builder()
        .backend(ScriptedBackend::new().without_exec())
        .build()
        .await;
    let provisioner = fixture.provisioner.clone();
    let data_dir = fixture.data_dir().to_owned();
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
        network: None,
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
        _provisioner: fixture,
    }
}
