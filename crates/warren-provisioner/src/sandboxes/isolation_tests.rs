//! The isolation tier as part of a sandbox's binding (issue 19): the server's default, a
//! live sandbox's tier kept, a tier the backend cannot run refused before anything is
//! written, the tier carried into the runtime, and never a runtime of another tier adopted.

use warren_backend::{Backend, BackendKind, DiscoveredRuntime, MemoryBackend};
use warren_core::{IsolationTier, RuntimeScope, SandboxId, Uid};

use crate::testing::{Fixture, ScriptedBackend};
use crate::{ProvisionerError, SandboxRequest};

/// A provisioner over `backend` whose sandboxes default to `default_isolation`. The double
/// said to run the gVisor tier ([`ScriptedBackend::with_gvisor`]) is the seam for the paths
/// where the backend *can*, since no backend of a unit test runs gVisor; it still runs
/// nothing, and records its runtimes, so the spec a runtime got can be read back.
async fn fixture(backend: ScriptedBackend, default_isolation: IsolationTier) -> Fixture {
    Fixture::builder()
        .backend(backend)
        .configure(move |config| config.default_isolation = default_isolation)
        .build()
        .await
}

fn alice() -> Uid {
    Uid::plain("alice").unwrap()
}

fn request(isolation: Option<IsolationTier>) -> SandboxRequest {
    SandboxRequest {
        isolation,
        ..SandboxRequest::new(alice(), RuntimeScope::new("t").unwrap())
    }
}

#[tokio::test]
async fn a_sandbox_that_names_no_tier_gets_the_servers_default() {
    let kernel = fixture(ScriptedBackend::new(), IsolationTier::Kernel).await;
    let (record, _) = kernel
        .provisioner
        .create_sandbox(request(None))
        .await
        .unwrap();
    assert_eq!(record.binding.isolation, IsolationTier::Kernel);

    let gvisor = fixture(ScriptedBackend::new().with_gvisor(), IsolationTier::Gvisor).await;
    let (record, _) = gvisor
        .provisioner
        .create_sandbox(request(None))
        .await
        .unwrap();
    assert_eq!(record.binding.isolation, IsolationTier::Gvisor);
    // A sandbox may still ask for the kernel tier on a gVisor server.
    let (kernel_record, _) = gvisor
        .provisioner
        .create_sandbox(SandboxRequest {
            isolation: Some(IsolationTier::Kernel),
            ..SandboxRequest::new(alice(), RuntimeScope::new("other").unwrap())
        })
        .await
        .unwrap();
    assert_eq!(kernel_record.binding.isolation, IsolationTier::Kernel);
}

#[tokio::test]
async fn a_live_sandbox_keeps_its_tier_and_another_is_a_conflict_that_changes_nothing() {
    let fixture = fixture(ScriptedBackend::new().with_gvisor(), IsolationTier::Kernel).await;
    let (created, _) = fixture
        .provisioner
        .create_sandbox(request(Some(IsolationTier::Gvisor)))
        .await
        .unwrap();
    assert_eq!(created.binding.isolation, IsolationTier::Gvisor);
    // Naming none keeps the live sandbox's tier, not the server's default.
    let (joined, how) = fixture
        .provisioner
        .create_sandbox(request(None))
        .await
        .unwrap();
    assert_eq!(
        (joined.binding.isolation, how),
        (IsolationTier::Gvisor, crate::Created::Existing)
    );

    let refused = fixture
        .provisioner
        .create_sandbox(request(Some(IsolationTier::Kernel)))
        .await
        .unwrap_err();
    match &refused {
        ProvisionerError::IsolationConflict {
            sandbox,
            bound,
            requested,
        } => assert_eq!(
            (sandbox, *bound, *requested),
            (&created.id, IsolationTier::Gvisor, IsolationTier::Kernel)
        ),
        other => panic!("expected an isolation conflict, got {other:?}"),
    }
    assert!(refused.to_string().contains("gvisor"), "{refused}");
    assert_eq!(
        fixture.store.get_sandbox(&created.id).await.unwrap(),
        Some(joined),
        "the refusal changed nothing"
    );
}

#[tokio::test]
async fn gvisor_on_a_backend_that_cannot_run_it_is_refused_before_anything_is_written() {
    // The memory backend has no gVisor tier.
    let fixture = fixture(ScriptedBackend::new(), IsolationTier::Kernel).await;
    let refused = fixture
        .provisioner
        .create_sandbox(request(Some(IsolationTier::Gvisor)))
        .await
        .unwrap_err();
    match &refused {
        ProvisionerError::IsolationUnavailable { backend, reason } => {
            assert_eq!(*backend, "memory");
            assert!(reason.contains("gVisor"), "{reason}");
        }
        other => panic!("expected the tier to be unavailable, got {other:?}"),
    }
    let message = refused.public_message();
    assert!(
        message.contains("memory") && message.contains("\"isolation\": \"kernel\""),
        "the message names the backend and what to do: {message}"
    );
    assert_eq!(
        refused.transport_status(),
        400,
        "never 422 on other transports"
    );
    // No sandbox record, and no workdir: the refusal came first.
    assert!(fixture.store.list_sandboxes(None).await.unwrap().is_empty());
    assert!(fixture
        .store
        .list_workdirs(&alice())
        .await
        .unwrap()
        .is_empty());

    // An ephemeral sandbox made no scratch tree either.
    let refused = fixture
        .provisioner
        .create_sandbox(SandboxRequest {
            ephemeral: true,
            ..request(Some(IsolationTier::Gvisor))
        })
        .await
        .unwrap_err();
    assert!(matches!(
        refused,
        ProvisionerError::IsolationUnavailable { .. }
    ));
    assert!(fixture.store.list_sandboxes(None).await.unwrap().is_empty());
    let id = SandboxId::derive(&alice(), &RuntimeScope::new("t").unwrap());
    assert!(!fixture.provisioner.layout().scratch(&id).exists());
}

#[test]
fn the_kernel_tier_is_every_backends_and_gvisor_needs_a_backend_that_runs_it() {
    let memory = MemoryBackend::new();
    assert!(crate::check_isolation(&memory, BackendKind::Memory, IsolationTier::Kernel).is_ok());
    assert!(matches!(
        crate::check_isolation(&memory, BackendKind::Memory, IsolationTier::Gvisor),
        Err(ProvisionerError::IsolationUnavailable {
            backend: "memory",
            ..
        })
    ));
    let capable = ScriptedBackend::new().with_gvisor();
    assert!(crate::check_isolation(&capable, BackendKind::Memory, IsolationTier::Gvisor).is_ok());
}

/// The runtime is started on the sandbox's tier, and a restarted provisioner adopts a
/// runtime only on that tier: one of another tier is destroyed (issue 19, I16).
#[tokio::test]
async fn the_runtime_gets_the_sandboxs_tier_and_one_of_another_tier_is_never_adopted() {
    let first = fixture(ScriptedBackend::new().with_gvisor(), IsolationTier::Kernel).await;
    first.provisioner.join_cluster().await.unwrap();
    let (gvisor, _) = first
        .provisioner
        .create_sandbox(request(Some(IsolationTier::Gvisor)))
        .await
        .unwrap();
    let (kernel, _) = first
        .provisioner
        .create_sandbox(SandboxRequest {
            isolation: Some(IsolationTier::Kernel),
            ..SandboxRequest::new(alice(), RuntimeScope::new("k").unwrap())
        })
        .await
        .unwrap();
    for record in [&gvisor, &kernel] {
        first.provisioner.start_runtime(&record.id).await.unwrap();
    }
    let tier_of = |runtimes: &[DiscoveredRuntime], id: &SandboxId| {
        runtimes
            .iter()
            .find(|runtime| &runtime.spec.sandbox == id)
            .map(|runtime| runtime.spec.binding.isolation)
    };
    let runtimes = first.backend.discover().await.unwrap();
    assert_eq!(tier_of(&runtimes, &gvisor.id), Some(IsolationTier::Gvisor));
    assert_eq!(tier_of(&runtimes, &kernel.id), Some(IsolationTier::Kernel));

    // The gVisor sandbox's runtime is swapped for one of the kernel tier, identical
    // otherwise, as if a backend had lost track of the tier.
    let mut swapped = runtimes
        .into_iter()
        .find(|runtime| runtime.spec.sandbox == gvisor.id)
        .unwrap()
        .spec;
    swapped.binding.isolation = IsolationTier::Kernel;
    first.backend.destroy(&gvisor.id).await.unwrap();
    first.backend.create(&swapped).await.unwrap();

    // A restart: a new provisioner on the same store and backend reconciles.
    let restarted = first.restarted();
    restarted.join_cluster().await.unwrap();
    let report = restarted.recover().await.unwrap();
    assert_eq!(
        (report.runtimes_adopted, report.runtimes_destroyed),
        (1, 1),
        "{report:?}"
    );
    let runtimes = first.backend.discover().await.unwrap();
    assert_eq!(
        tier_of(&runtimes, &gvisor.id),
        None,
        "the other tier's runtime is gone"
    );
    assert_eq!(tier_of(&runtimes, &kernel.id), Some(IsolationTier::Kernel));
}
