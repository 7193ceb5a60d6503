//! The one default network policy: what a request that names none gets.

use warren_core::{NetworkPolicy, RuntimeScope, Uid};

use crate::testing::Fixture;
use crate::{Created, ProvisionerError, SandboxRequest};

fn request(scope: &str, network: Option<NetworkPolicy>) -> SandboxRequest {
    SandboxRequest {
        workdir: Some("projects/a".into()),
        network,
        ..SandboxRequest::new(
            Uid::plain("alice").unwrap(),
            RuntimeScope::new(scope).unwrap(),
        )
    }
}

async fn fixture(default: NetworkPolicy) -> Fixture {
    let fixture = Fixture::builder()
        .configure(move |config| config.default_network = default)
        .build()
        .await;
    fixture
        .provisioner
        .create_workdir(&Uid::plain("alice").unwrap(), Some("projects/a"))
        .await
        .unwrap();
    fixture
}

#[tokio::test]
async fn a_sandbox_that_names_no_network_gets_the_servers_default() {
    let fixture = fixture(NetworkPolicy::Open { deny: vec![] }).await;
    let (record, _) = fixture
        .provisioner
        .create_sandbox(request("t", None))
        .await
        .unwrap();
    assert_eq!(record.binding.network, NetworkPolicy::Open { deny: vec![] });
}

#[tokio::test]
async fn a_network_the_request_names_wins_over_the_default() {
    let fixture = fixture(NetworkPolicy::Open { deny: vec![] }).await;
    let (record, _) = fixture
        .provisioner
        .create_sandbox(request("t", Some(NetworkPolicy::None)))
        .await
        .unwrap();
    assert_eq!(record.binding.network, NetworkPolicy::None);
}

#[tokio::test]
async fn without_a_configured_default_a_sandbox_reaches_only_loopback() {
    let fixture = Fixture::new().await;
    fixture
        .provisioner
        .create_workdir(&Uid::plain("alice").unwrap(), Some("projects/a"))
        .await
        .unwrap();
    let (record, _) = fixture
        .provisioner
        .create_sandbox(request("t", None))
        .await
        .unwrap();
    assert_eq!(record.binding.network, NetworkPolicy::None);
}

#[tokio::test]
async fn naming_no_network_is_naming_the_default_when_joining_a_live_sandbox() {
    let fixture = fixture(NetworkPolicy::Open { deny: vec![] }).await;
    let provisioner = &fixture.provisioner;
    provisioner
        .create_sandbox(request("t", None))
        .await
        .unwrap();
    // The default again: the same binding, joined.
    let (_, created) = provisioner
        .create_sandbox(request("t", None))
        .await
        .unwrap();
    assert_eq!(created, Created::Existing);
    // A live sandbox bound to the default refuses another policy, named or not.
    let err = provisioner
        .create_sandbox(request("t", Some(NetworkPolicy::None)))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ProvisionerError::NetworkConflict { .. }),
        "{err:?}"
    );
    provisioner
        .create_sandbox(request("u", Some(NetworkPolicy::None)))
        .await
        .unwrap();
    let err = provisioner
        .create_sandbox(request("u", None))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ProvisionerError::NetworkConflict { .. }),
        "{err:?}"
    );
}
