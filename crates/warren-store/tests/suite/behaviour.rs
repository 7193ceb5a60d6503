//! What every state store must do, whatever it is built on.
//!
//! Each check takes a [`Backend`] so it can open as many handles as it needs; the macro in
//! `mod.rs` runs each one against every backend.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use warren_core::{
    AgentEnvVar, EgressEvent, EgressSecret, EgressVerdict, IsolationTier, LayoutName,
    NetworkPolicy, Presentation, RuntimeScope, SandboxId, SecretName, SecretRule, SecretTarget,
};
use warren_store::{
    AgentEnvRecord, Artifact, Checkpoint, DeadlineAction, EgressRecord, FenceCheck, Guard,
    GuardAcquire, ItemState, ItemUpdate, MigrationState, NewRun, NewSandbox, NodeState, OwnerFence,
    RecordWrite, RunKind, RunOutcome, RunQuery, RunRecord, RunScope, RunStatus, RuntimeClaim,
    SandboxClaim, SandboxRecord, SandboxSettings, SandboxState, StateStore, StoreError, TakenOver,
    NODE_LOST,
};

use super::backends::Backend;
use super::fixtures::{
    claim, exited, migration, migration_item, next_millisecond, run, runs_of, uid, workdir,
};

/// Claims `new` from `tasks` concurrent tokio tasks, spread over `stores`, and returns every
/// answer.
async fn race_claims(
    stores: &[Arc<dyn StateStore>],
    new: &NewSandbox,
    tasks: usize,
) -> Vec<SandboxClaim> {
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let store = Arc::clone(&stores[task % stores.len()]);
            let new = new.clone();
            tokio::spawn(async move { store.claim_sandbox(&new).await })
        })
        .collect();
    let mut claims = Vec::with_capacity(tasks);
    for handle in handles {
        claims.push(handle.await.expect("task").expect("claim"));
    }
    claims
}

fn count_created(claims: &[SandboxClaim]) -> usize {
    claims
        .iter()
        .filter(|claim| matches!(claim, SandboxClaim::Created(_)))
        .count()
}

fn count_existing(claims: &[SandboxClaim]) -> usize {
    claims
        .iter()
        .filter(|claim| matches!(claim, SandboxClaim::Existing(_)))
        .count()
}

pub async fn claiming_an_unclaimed_sandbox_creates_generation_one(backend: &dyn Backend) {
    let store = backend.open().await;
    let new = claim("alice", "thread-1", "projects/a");

    let SandboxClaim::Created(record) = store.claim_sandbox(&new).await.unwrap() else {
        panic!("an unclaimed sandbox must be created");
    };

    assert_eq!(record.id, new.id);
    assert_eq!(record.uid, new.uid);
    assert_eq!(record.runtime_scope, new.runtime_scope);
    assert_eq!(record.binding.workdir, new.binding.workdir);
    assert_eq!(record.binding.backend, warren_core::BackendKind::Local);
    assert_eq!(record.state, SandboxState::Created);
    assert_eq!(record.generation, 1);
    assert_eq!(record.created_at, record.last_active_at);
    assert_eq!(record.created_at, record.updated_at);
    assert_eq!(store.get_sandbox(&new.id).await.unwrap(), Some(record));
}

pub async fn claiming_a_live_sandbox_on_the_same_workdir_joins_it(backend: &dyn Backend) {
    let store = backend.open().await;
    let new = claim("alice", "thread-1", "projects/a");
    let created = store.claim_sandbox(&new).await.unwrap().into_record();

    let again = store.claim_sandbox(&new).await.unwrap();
    assert_eq!(again, SandboxClaim::Existing(created.clone()));

    // Another backend or image is another binding: a conflict that changes nothing (I16).
    let mut other_backend = new.clone();
    other_backend.binding.backend = warren_core::BackendKind::Docker;
    let mut other_image = new.clone();
    other_image.binding.image = Some("python:3.12".to_owned());
    for claim in [other_backend, other_image] {
        let answer = store.claim_sandbox(&claim).await.unwrap();
        assert_eq!(
            answer,
            SandboxClaim::Conflict {
                part: warren_core::BindingPart::Backend,
                sandbox: created.clone()
            }
        );
    }
    assert_eq!(store.get_sandbox(&new.id).await.unwrap(), Some(created));
}

pub async fn claiming_a_live_sandbox_on_another_workdir_is_a_conflict_that_changes_nothing(
    backend: &dyn Backend,
) {
    let store = backend.open().await;
    let new = claim("alice", "thread-1", "projects/a");
    let created = store.claim_sandbox(&new).await.unwrap().into_record();

    let elsewhere = claim("alice", "thread-1", "projects/b");
    let answer = store.claim_sandbox(&elsewhere).await.unwrap();

    assert_eq!(
        answer,
        SandboxClaim::Conflict {
            part: warren_core::BindingPart::Workdir,
            sandbox: created.clone()
        }
    );
    assert_eq!(store.get_sandbox(&new.id).await.unwrap(), Some(created));
}

pub async fn claiming_a_live_sandbox_under_another_network_policy_is_a_conflict(
    backend: &dyn Backend,
) {
    let store = backend.open().await;
    let new = claim("alice", "thread-1", "projects/a");
    let created = store.claim_sandbox(&new).await.unwrap().into_record();
    assert_eq!(created.binding.network, NetworkPolicy::None);
    let mut open = new.clone();
    open.binding.network = NetworkPolicy::Open { deny: vec![] };
    match store.claim_sandbox(&open).await.unwrap() {
        SandboxClaim::Conflict {
            part: warren_core::BindingPart::Network,
            sandbox: record,
        } => assert_eq!(record, created),
        other => panic!("expected a network conflict, got {other:?}"),
    }
    store
        .set_sandbox_state(&new.id, 1, SandboxState::Created, SandboxState::Terminated)
        .await
        .unwrap();
    let reclaimed = store.claim_sandbox(&open).await.unwrap();
    assert!(
        matches!(&reclaimed, SandboxClaim::Created(r) if r.binding.network == (NetworkPolicy::Open { deny: vec![] }) && r.generation == 2)
    );
}

pub async fn claiming_a_live_sandbox_under_another_env_policy_is_a_conflict(backend: &dyn Backend) {
    let store = backend.open().await;
    let new = claim("alice", "thread-1", "projects/a");
    let created = store.claim_sandbox(&new).await.unwrap().into_record();
    assert!(created.binding.inherit_env && !created.binding.ephemeral);
    let mut bare = new.clone();
    bare.binding.inherit_env = false;
    let mut scratch = new.clone();
    scratch.binding.ephemeral = true;
    for other in [&bare, &scratch] {
        match store.claim_sandbox(other).await.unwrap() {
            SandboxClaim::Conflict {
                part: warren_core::BindingPart::EnvPolicy,
                sandbox: record,
            } => assert_eq!(record, created),
            answer => panic!("expected an env policy conflict, got {answer:?}"),
        }
    }
    store
        .set_sandbox_state(&new.id, 1, SandboxState::Created, SandboxState::Terminated)
        .await
        .unwrap();
    let SandboxClaim::Created(reclaimed) = store.claim_sandbox(&scratch).await.unwrap() else {
        panic!("a terminated sandbox is claimed anew");
    };
    assert!(reclaimed.binding.ephemeral && reclaimed.binding.inherit_env);
    assert_eq!(store.get_sandbox(&new.id).await.unwrap(), Some(reclaimed));
}

pub async fn extra_mounts_are_stored_in_order_and_a_live_sandbox_keeps_them(backend: &dyn Backend) {
    let store = backend.open().await;
    let layout = warren_core::Layout::DEERFLOW;
    let mount = |target: &str, beneath: &str, writable| {
        warren_core::ExtraMount::new(target, "/srv/df".into(), beneath, writable, &layout).unwrap()
    };
    let mut new = claim("alice", "thread-1", "threads/t1/user-data");
    new.binding.layout = LayoutName::Deerflow;
    new.binding.extra_mounts = vec![
        mount("/mnt/scratch", "s/t1", true),
        mount("/mnt/acp-workspace", "threads/t1/acp-workspace", false),
    ];
    let created = store.claim_sandbox(&new).await.unwrap().into_record();
    assert_eq!(
        created.binding.extra_mounts, new.binding.extra_mounts,
        "kept in their order"
    );
    assert_eq!(
        store.get_sandbox(&new.id).await.unwrap(),
        Some(created.clone())
    );
    match store.claim_sandbox(&new).await.unwrap() {
        SandboxClaim::Existing(record) => assert_eq!(record, created),
        answer => panic!("the same mounts join, got {answer:?}"),
    }
    let mut reordered = new.clone();
    reordered.binding.extra_mounts.reverse();
    let mut fewer = new.clone();
    fewer.binding.extra_mounts.pop();
    for other in [reordered, fewer] {
        match store.claim_sandbox(&other).await.unwrap() {
            SandboxClaim::Conflict {
                part: warren_core::BindingPart::ExtraMounts,
                sandbox: record,
            } => assert_eq!(record, created),
            answer => panic!("expected an extra-mounts conflict, got {answer:?}"),
        }
    }
    store
        .set_sandbox_state(&new.id, 1, SandboxState::Created, SandboxState::Terminated)
        .await
        .unwrap();
    let mut none = new.clone();
    none.binding.extra_mounts.clear();
    let SandboxClaim::Created(reclaimed) = store.claim_sandbox(&none).await.unwrap() else {
        panic!("a terminated sandbox is claimed anew");
    };
    assert!(
        reclaimed.binding.extra_mounts.is_empty(),
        "a new generation takes its own"
    );
}

pub async fn a_live_sandbox_keeps_its_layout_and_a_new_generation_may_take_another(
    backend: &dyn Backend,
) {
    let store = backend.open().await;
    let new = claim("alice", "thread-1", "threads/t1/user-data");
    let created = store.claim_sandbox(&new).await.unwrap().into_record();
    assert_eq!(
        created.binding.layout,
        LayoutName::Ars,
        "the default layout"
    );
    let mut deerflow = new.clone();
    deerflow.binding.layout = LayoutName::Deerflow;
    match store.claim_sandbox(&deerflow).await.unwrap() {
        SandboxClaim::Conflict {
            part: warren_core::BindingPart::Layout,
            sandbox: record,
        } => assert_eq!(record, created),
        answer => panic!("expected a layout conflict, got {answer:?}"),
    }
    store
        .set_sandbox_state(&new.id, 1, SandboxState::Created, SandboxState::Terminated)
        .await
        .unwrap();
    let SandboxClaim::Created(reclaimed) = store.claim_sandbox(&deerflow).await.unwrap() else {
        panic!("a terminated sandbox is claimed anew");
    };
    assert_eq!(
        (reclaimed.binding.layout, reclaimed.generation),
        (LayoutName::Deerflow, 2)
    );
    assert_eq!(
        store.get_sandbox(&new.id).await.unwrap(),
        Some(reclaimed.clone())
    );
    assert!(matches!(
        store.claim_sandbox(&deerflow).await.unwrap(),
        SandboxClaim::Existing(record) if record == reclaimed
    ));
}

/// The isolation tier is part of the binding (issue 19): stored and read back as claimed,
/// kept by a live generation (a claim naming another is a conflict that changes nothing),
/// free to change with a new generation.
pub async fn a_live_sandbox_keeps_its_isolation_and_a_new_generation_may_take_another(
    backend: &dyn Backend,
) {
    let store = backend.open().await;
    let new = claim("alice", "thread-1", "threads/t1/user-data");
    let created = store.claim_sandbox(&new).await.unwrap().into_record();
    assert_eq!(
        created.binding.isolation,
        IsolationTier::Kernel,
        "the default tier"
    );
    let mut gvisor = new.clone();
    gvisor.binding.isolation = IsolationTier::Gvisor;
    match store.claim_sandbox(&gvisor).await.unwrap() {
        SandboxClaim::Conflict {
            part: warren_core::BindingPart::Isolation,
            sandbox: record,
        } => assert_eq!(record, created),
        answer => panic!("expected an isolation conflict, got {answer:?}"),
    }
    assert_eq!(
        store.get_sandbox(&new.id).await.unwrap(),
        Some(created),
        "a refused claim changes nothing"
    );
    store
        .set_sandbox_state(&new.id, 1, SandboxState::Created, SandboxState::Terminated)
        .await
        .unwrap();
    let SandboxClaim::Created(reclaimed) = store.claim_sandbox(&gvisor).await.unwrap() else {
        panic!("a terminated sandbox is claimed anew");
    };
    assert_eq!(
        (reclaimed.binding.isolation, reclaimed.generation),
        (IsolationTier::Gvisor, 2)
    );
    assert_eq!(
        store.get_sandbox(&new.id).await.unwrap(),
        Some(reclaimed.clone()),
        "read back as written"
    );
    assert_eq!(
        store.list_sandboxes(None).await.unwrap(),
        vec![reclaimed.clone()]
    );
    assert!(matches!(
        store.claim_sandbox(&gvisor).await.unwrap(),
        SandboxClaim::Existing(record) if record == reclaimed
    ));
    assert!(matches!(
        store.claim_sandbox(&new).await.unwrap(),
        SandboxClaim::Conflict { part: warren_core::BindingPart::Isolation, sandbox: record } if record == reclaimed
    ));
}

pub async fn an_agent_environment_is_kept_per_uid_and_replaced_whole(backend: &dyn Backend) {
    let store = backend.open().await;
    let (alice, bob) = (uid("alice"), uid("bob"));
    let key = AgentEnvVar::new("API_KEY", "sk-0123456789", true).unwrap();
    let mode = AgentEnvVar::new("MODE", "fast", false).unwrap();
    store
        .replace_agent_env(&alice, &[mode.clone(), key.clone()])
        .await
        .unwrap();
    let names = |records: Vec<AgentEnvRecord>| -> Vec<AgentEnvVar> {
        records.into_iter().map(|record| record.var).collect()
    };
    assert_eq!(
        names(store.agent_env(&alice).await.unwrap()),
        vec![key.clone(), mode.clone()]
    );
    assert!(store.agent_env(&bob).await.unwrap().is_empty());

    store
        .replace_agent_env(&alice, std::slice::from_ref(&mode))
        .await
        .unwrap();
    assert_eq!(names(store.agent_env(&alice).await.unwrap()), vec![mode]);
    store.replace_agent_env(&alice, &[]).await.unwrap();
    assert!(store.agent_env(&alice).await.unwrap().is_empty());
}

pub async fn setting_one_agent_variable_adds_or_overwrites_within_the_limit(backend: &dyn Backend) {
    let store = backend.open().await;
    let alice = uid("alice");
    let first = AgentEnvVar::new("A", "one", false).unwrap();
    assert!(store.set_agent_env_var(&alice, &first, 2).await.unwrap());
    let rotated = AgentEnvVar::new("A", "rotated-secret", true).unwrap();
    assert!(!store.set_agent_env_var(&alice, &rotated, 2).await.unwrap());
    let second = AgentEnvVar::new("B", "two", false).unwrap();
    assert!(store.set_agent_env_var(&alice, &second, 2).await.unwrap());
    let third = AgentEnvVar::new("C", "three", false).unwrap();
    let err = store
        .set_agent_env_var(&alice, &third, 2)
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::AgentEnvFull { max: 2, .. }),
        "{err:?}"
    );
    // Overwriting at the limit is still allowed.
    assert!(!store.set_agent_env_var(&alice, &second, 2).await.unwrap());
    let vars: Vec<_> = store
        .agent_env(&alice)
        .await
        .unwrap()
        .into_iter()
        .map(|record| record.var)
        .collect();
    assert_eq!(vars, vec![rotated, second]);

    assert!(store.remove_agent_env_var(&alice, "A").await.unwrap());
    assert!(!store.remove_agent_env_var(&alice, "A").await.unwrap());
    assert!(!store.remove_agent_env_var(&uid("bob"), "B").await.unwrap());
    assert_eq!(store.agent_env(&alice).await.unwrap().len(), 1);
}

/// An egress secret named `name` bound to `host`, presented as a bearer token.
fn egress_secret(name: &str, host: &str, value: &str) -> EgressSecret {
    EgressSecret::new(
        SecretName::new(name).unwrap(),
        SecretRule {
            targets: vec![SecretTarget {
                host: host.to_owned(),
                ports: vec![443, 8443],
                path_prefix: Some("/v1/".to_owned()),
            }],
            present: Presentation::Header {
                name: "X-Api-Key".to_owned(),
                prefix: "token ".to_owned(),
            },
            source: None,
        },
        value.to_owned(),
    )
    .unwrap()
}

/// The secrets of `uid` (or of one sandbox of theirs), by name.
async fn egress_secrets_of(
    store: &dyn StateStore,
    uid_: &str,
    sandbox: Option<&SandboxId>,
) -> Vec<EgressSecret> {
    store
        .egress_secrets(&uid(uid_), sandbox)
        .await
        .unwrap()
        .into_iter()
        .map(|record| record.secret)
        .collect()
}

fn egress_sandbox(uid_: &str, scope: &str) -> SandboxId {
    SandboxId::derive(&uid(uid_), &RuntimeScope::new(scope).unwrap())
}

/// A connection of `sandbox` to `host`, made at `at`.
fn egress_event(sandbox: &SandboxId, host: &str, at: i64) -> EgressEvent {
    EgressEvent {
        at,
        connection: format!("{host}-{at}"),
        ended_at: Some(at + 50),
        sandbox: sandbox.clone(),
        host: host.to_owned(),
        port: 443,
        address: Some("192.0.2.7".to_owned()),
        verdict: EgressVerdict::Allowed,
        rule: "secret TOKEN".to_owned(),
        secrets: vec![SecretName::new("TOKEN").unwrap()],
        intercepted: true,
        bytes_out: 120,
        bytes_in: 4096,
        reason: None,
    }
}

pub async fn egress_secrets_rotate_in_place_and_stay_apart_per_sandbox(backend: &dyn Backend) {
    let store = backend.open().await;
    let alice = uid("alice");
    let (one, two) = (egress_sandbox("alice", "t1"), egress_sandbox("alice", "t2"));
    let own = egress_secret("TOKEN", "api.example.com", "uid-wide-value");
    let scoped = egress_secret("TOKEN", "*.example.org", "sandbox-one-value");
    let other = egress_secret("OTHER", "other.example", "another-value");
    assert!(store
        .set_egress_secret(&alice, None, &own, 8)
        .await
        .unwrap());
    assert!(store
        .set_egress_secret(&alice, Some(&one), &scoped, 8)
        .await
        .unwrap());
    assert!(store
        .set_egress_secret(&alice, Some(&one), &other, 8)
        .await
        .unwrap());

    let records = store.egress_secrets(&alice, None).await.unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(
        (
            &records[0].uid,
            records[0].sandbox.as_ref(),
            &records[0].secret
        ),
        (&alice, None, &own)
    );
    let records = store.egress_secrets(&alice, Some(&one)).await.unwrap();
    assert!(records
        .iter()
        .all(|record| record.uid == alice && record.sandbox.as_ref() == Some(&one)));
    assert_eq!(
        egress_secrets_of(store.as_ref(), "alice", Some(&one)).await,
        vec![other.clone(), scoped.clone()],
        "by name, the rule and value as set"
    );
    assert!(egress_secrets_of(store.as_ref(), "alice", Some(&two))
        .await
        .is_empty());
    assert!(egress_secrets_of(store.as_ref(), "bob", None)
        .await
        .is_empty());

    // Rotating replaces the value and the rule in place, and moves its time.
    let before = store.egress_secrets(&alice, None).await.unwrap()[0].updated_at;
    next_millisecond().await;
    let rotated = egress_secret("TOKEN", "api.example.net", "rotated-value");
    assert!(!store
        .set_egress_secret(&alice, None, &rotated, 8)
        .await
        .unwrap());
    let records = store.egress_secrets(&alice, None).await.unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].secret, rotated);
    assert!(records[0].updated_at > before);
    assert_eq!(
        egress_secrets_of(store.as_ref(), "alice", Some(&one)).await,
        vec![other.clone(), scoped.clone()],
        "the sandbox's own secret of that name is another"
    );

    let token = SecretName::new("TOKEN").unwrap();
    assert!(store
        .remove_egress_secret(&alice, Some(&one), &token)
        .await
        .unwrap());
    assert!(!store
        .remove_egress_secret(&alice, Some(&one), &token)
        .await
        .unwrap());
    assert!(!store
        .remove_egress_secret(&uid("bob"), None, &token)
        .await
        .unwrap());
    assert_eq!(
        egress_secrets_of(store.as_ref(), "alice", None).await,
        vec![rotated.clone()]
    );

    // Removing a sandbox's egress takes its own secrets, never the uid's.
    store.remove_sandbox_egress(&one).await.unwrap();
    assert!(egress_secrets_of(store.as_ref(), "alice", Some(&one))
        .await
        .is_empty());
    assert_eq!(
        egress_secrets_of(store.as_ref(), "alice", None).await,
        vec![rotated]
    );
}

pub async fn a_new_egress_secret_past_the_limit_is_refused(backend: &dyn Backend) {
    let store = backend.open().await;
    let alice = uid("alice");
    let sandbox = egress_sandbox("alice", "t1");
    let a = egress_secret("A", "a.example", "value-of-a");
    let b = egress_secret("B", "b.example", "value-of-b");
    assert!(store.set_egress_secret(&alice, None, &a, 2).await.unwrap());
    assert!(store.set_egress_secret(&alice, None, &b, 2).await.unwrap());
    let c = egress_secret("C", "c.example", "value-of-c");
    let err = store
        .set_egress_secret(&alice, None, &c, 2)
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::EgressSecretsFull { max: 2 }),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "at most 2 egress secrets may be set here; remove one first"
    );
    // Rotating at the limit is still allowed; a sandbox's secrets are counted apart.
    let rotated = egress_secret("B", "b.example", "rotated-b-value");
    assert!(!store
        .set_egress_secret(&alice, None, &rotated, 2)
        .await
        .unwrap());
    assert!(store
        .set_egress_secret(&alice, Some(&sandbox), &c, 2)
        .await
        .unwrap());
    assert_eq!(
        egress_secrets_of(store.as_ref(), "alice", None).await,
        vec![a, rotated]
    );

    // Setters racing for the last places: exactly as many win as there are places.
    let stores: Vec<Arc<dyn StateStore>> = if backend.is_shared() {
        vec![store.clone(), backend.open().await]
    } else {
        vec![store.clone()]
    };
    let racers: Vec<_> = (0..12)
        .map(|task| {
            let store = Arc::clone(&stores[task % stores.len()]);
            let sandbox = sandbox.clone();
            tokio::spawn(async move {
                let secret = egress_secret(&format!("RACER_{task}"), "r.example", "racer-value");
                store
                    .set_egress_secret(&uid("alice"), Some(&sandbox), &secret, 4)
                    .await
            })
        })
        .collect();
    let mut added = 0;
    for racer in racers {
        match racer.await.unwrap() {
            Ok(new) => {
                assert!(new);
                added += 1;
            }
            Err(StoreError::EgressSecretsFull { max: 4 }) => {}
            Err(err) => panic!("{err:?}"),
        }
    }
    assert_eq!(added, 3, "one place was taken by C");
    assert_eq!(
        egress_secrets_of(store.as_ref(), "alice", Some(&sandbox))
            .await
            .len(),
        4
    );
}

pub async fn egress_events_are_read_after_a_cursor_and_trimmed_to_the_newest(
    backend: &dyn Backend,
) {
    let store = backend.open().await;
    let (one, two) = (egress_sandbox("alice", "t1"), egress_sandbox("bob", "t1"));
    let hosts = |records: &[EgressRecord]| -> Vec<String> {
        records.iter().map(|r| r.event.host.clone()).collect()
    };
    assert!(store
        .egress_events(&one, None, 10)
        .await
        .unwrap()
        .is_empty());
    store.record_egress(&[], 3).await.unwrap();

    let batch: Vec<_> = (0..5)
        .map(|n| egress_event(&one, &format!("h{n}.example"), 1_000 + n))
        .chain([egress_event(&two, "b.example", 1_000)])
        .collect();
    store.record_egress(&batch, 10).await.unwrap();
    let all = store.egress_events(&one, None, 100).await.unwrap();
    assert_eq!(
        all.iter().map(|r| r.event.clone()).collect::<Vec<_>>(),
        batch[..5],
        "oldest first, as recorded"
    );
    assert!(all.windows(2).all(|pair| pair[0].id < pair[1].id));

    let first_two = store.egress_events(&one, None, 2).await.unwrap();
    assert_eq!(hosts(&first_two), ["h0.example", "h1.example"]);
    let rest = store
        .egress_events(&one, Some(first_two[1].id), 100)
        .await
        .unwrap();
    assert_eq!(hosts(&rest), ["h2.example", "h3.example", "h4.example"]);
    assert!(store
        .egress_events(&one, Some(all[4].id), 100)
        .await
        .unwrap()
        .is_empty());

    // A batch keeps the newest `keep` of each sandbox it touched, and ids keep growing.
    let refused = EgressEvent {
        verdict: EgressVerdict::Refused,
        rule: "policy".to_owned(),
        secrets: Vec::new(),
        intercepted: false,
        address: None,
        reason: Some("not on the allowlist".to_owned()),
        ..egress_event(&one, "h5.example", 2_000)
    };
    store
        .record_egress(std::slice::from_ref(&refused), 3)
        .await
        .unwrap();
    let kept = store.egress_events(&one, None, 100).await.unwrap();
    assert_eq!(hosts(&kept), ["h3.example", "h4.example", "h5.example"]);
    assert_eq!(kept[2].event, refused);
    assert!(kept[2].id > all[4].id);
    assert_eq!(
        store
            .egress_events(&one, Some(first_two[1].id), 100)
            .await
            .unwrap(),
        kept,
        "a cursor before the trimmed events reads what is left"
    );
    assert_eq!(
        hosts(&store.egress_events(&two, None, 100).await.unwrap()),
        ["b.example"],
        "a sandbox the batch did not touch keeps its events"
    );

    // The audit outlives the sandbox's egress.
    store.remove_sandbox_egress(&one).await.unwrap();
    assert_eq!(store.egress_events(&one, None, 100).await.unwrap(), kept);
}

pub async fn two_servers_racing_for_an_authority_agree_on_one(backend: &dyn Backend) {
    let setup = backend.open().await;
    let sandbox = egress_sandbox("alice", "t1");
    let fresh = |n: usize| (format!("cert-{n}"), format!("key-{n}"));
    let mut racers = Vec::new();
    for task in 0..12 {
        // Separate handles where the backend shares its data, so the race is real.
        let store = if backend.is_shared() && task % 2 == 0 {
            backend.open().await
        } else {
            Arc::clone(&setup)
        };
        let sandbox = sandbox.clone();
        racers.push(tokio::spawn(async move {
            store.egress_authority(&sandbox, fresh(task)).await.unwrap()
        }));
    }
    let mut answers = HashSet::new();
    for racer in racers {
        answers.insert(racer.await.unwrap());
    }
    assert_eq!(answers.len(), 1, "{answers:?}");
    let stored = answers.into_iter().next().unwrap();
    assert!((0..12).map(fresh).any(|pair| pair == stored), "{stored:?}");
    assert_eq!(
        setup.egress_authority(&sandbox, fresh(99)).await.unwrap(),
        stored,
        "the stored one is kept"
    );
    let other = egress_sandbox("alice", "t2");
    assert_eq!(
        setup.egress_authority(&other, fresh(7)).await.unwrap(),
        fresh(7),
        "each sandbox has its own"
    );

    // Once the sandbox's egress is removed, the next one asked for is stored.
    setup.remove_sandbox_egress(&sandbox).await.unwrap();
    assert_eq!(
        setup.egress_authority(&sandbox, fresh(100)).await.unwrap(),
        fresh(100)
    );
    assert_eq!(
        setup.egress_authority(&other, fresh(8)).await.unwrap(),
        fresh(7)
    );
}

pub async fn artifacts_are_recorded_listed_and_found_per_sandbox(backend: &dyn Backend) {
    let store = backend.open().await;
    let sandbox = store
        .claim_sandbox(&claim("alice", "t", "projects/a"))
        .await
        .unwrap()
        .into_record();
    let artifact = |id: &str, sandbox_id: &SandboxId| Artifact {
        id: id.to_owned(),
        sandbox_id: sandbox_id.clone(),
        uid: uid("alice"),
        path: "/home/gem/user-data/projects/a/outputs/r.md".to_owned(),
        size: 3,
        sha256: "ab".repeat(32),
        media_type: "text/markdown".to_owned(),
        created_at: chrono::Utc::now(),
    };
    let first = store
        .record_artifact(&artifact("art-1", &sandbox.id))
        .await
        .unwrap();
    next_millisecond().await;
    let second = store
        .record_artifact(&artifact("art-2", &sandbox.id))
        .await
        .unwrap();
    assert_eq!(
        (first.size, first.path.as_str()),
        (3, "/home/gem/user-data/projects/a/outputs/r.md")
    );
    assert_eq!(
        store.list_artifacts(&sandbox.id).await.unwrap(),
        vec![first.clone(), second]
    );
    assert_eq!(
        store.get_artifact(&sandbox.id, "art-1").await.unwrap(),
        Some(first)
    );
    assert_eq!(
        store
            .list_artifacts_of_uid(&uid("alice"))
            .await
            .unwrap()
            .len(),
        2
    );
    assert!(store
        .list_artifacts_of_uid(&uid("bob"))
        .await
        .unwrap()
        .is_empty());
    let other = SandboxId::derive(&uid("bob"), &RuntimeScope::new("t").unwrap());
    assert_eq!(store.get_artifact(&other, "art-1").await.unwrap(), None);
    let err = store
        .record_artifact(&artifact("art-3", &other))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::UnknownSandbox { .. }), "{err:?}");
}

pub async fn checkpoints_are_recorded_listed_and_forgotten(backend: &dyn Backend) {
    let store = backend.open().await;
    let sandbox = store
        .claim_sandbox(&claim("alice", "t", "projects/a"))
        .await
        .unwrap()
        .into_record();
    let checkpoint = |id: &str, manifest: &str| Checkpoint {
        id: id.to_owned(),
        sandbox_id: sandbox.id.clone(),
        workdir: workdir("projects/a"),
        manifest: manifest.to_owned(),
        files: 2,
        bytes: 10,
        created_at: chrono::Utc::now(),
    };
    let first = store
        .record_checkpoint(&checkpoint("ckpt-1", "m1"))
        .await
        .unwrap();
    next_millisecond().await;
    store
        .record_checkpoint(&checkpoint("ckpt-2", "m2"))
        .await
        .unwrap();
    assert_eq!((first.files, first.bytes), (2, 10));
    let ids: Vec<String> = store
        .list_checkpoints(&sandbox.id)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(ids, ["ckpt-1", "ckpt-2"]);
    assert_eq!(
        store
            .checkpoint_manifests_of_uid(&uid("alice"))
            .await
            .unwrap(),
        ["m1", "m2"]
    );
    assert!(store
        .checkpoint_manifests_of_uid(&uid("bob"))
        .await
        .unwrap()
        .is_empty());
    assert!(store.delete_checkpoint("ckpt-1").await.unwrap());
    assert!(!store.delete_checkpoint("ckpt-1").await.unwrap());
    assert_eq!(
        store
            .checkpoint_manifests_of_uid(&uid("alice"))
            .await
            .unwrap(),
        ["m2"]
    );
}

pub async fn skills_are_granted_and_revoked_per_uid(backend: &dyn Backend) {
    let store = backend.open().await;
    assert!(store.grant_skill(&uid("alice"), "pdf").await.unwrap());
    assert!(!store.grant_skill(&uid("alice"), "pdf").await.unwrap());
    store.grant_skill(&uid("alice"), "charts").await.unwrap();
    assert_eq!(
        store.granted_skills(&uid("alice")).await.unwrap(),
        ["charts", "pdf"]
    );
    assert!(store.granted_skills(&uid("bob")).await.unwrap().is_empty());
    assert!(store.revoke_skill(&uid("alice"), "pdf").await.unwrap());
    assert!(!store.revoke_skill(&uid("alice"), "pdf").await.unwrap());
    assert_eq!(
        store.granted_skills(&uid("alice")).await.unwrap(),
        ["charts"]
    );
}

pub async fn every_state_but_terminated_counts_as_live_for_a_claim(backend: &dyn Backend) {
    let store = backend.open().await;
    let new = claim("alice", "thread-1", "projects/a");
    let elsewhere = claim("alice", "thread-1", "projects/b");
    store.claim_sandbox(&new).await.unwrap();

    let mut from = SandboxState::Created;
    for state in [
        SandboxState::Created,
        SandboxState::Running,
        SandboxState::Stopped,
        SandboxState::Pausing,
        SandboxState::Paused,
        SandboxState::Terminating,
    ] {
        let record = store
            .set_sandbox_state(&new.id, 1, std::mem::replace(&mut from, state), state)
            .await
            .unwrap()
            .expect("generation 1 is current");
        assert_eq!(
            store.claim_sandbox(&new).await.unwrap(),
            SandboxClaim::Existing(record.clone()),
            "{state}"
        );
        assert_eq!(
            store.claim_sandbox(&elsewhere).await.unwrap(),
            SandboxClaim::Conflict {
                part: warren_core::BindingPart::Workdir,
                sandbox: record
            },
            "{state}"
        );
    }
}

pub async fn a_claim_whose_id_is_not_derived_from_its_uid_and_scope_is_refused(
    backend: &dyn Backend,
) {
    let store = backend.open().await;
    let mut new = claim("alice", "thread-1", "projects/a");
    new.id = SandboxId::derive(&uid("bob"), &RuntimeScope::new("thread-1").unwrap());

    let err = store.claim_sandbox(&new).await.unwrap_err();

    assert!(
        matches!(err, StoreError::SandboxIdMismatch { .. }),
        "{err:?}"
    );
    assert!(store.list_sandboxes(None).await.unwrap().is_empty());
}

pub async fn fifty_concurrent_claims_of_one_identity_create_exactly_one_sandbox(
    backend: &dyn Backend,
) {
    let store = backend.open().await;
    let new = claim("alice", "thread-1", "projects/a");

    let claims = race_claims(&[Arc::clone(&store)], &new, 50).await;

    assert_eq!(count_created(&claims), 1);
    assert_eq!(count_existing(&claims), 49);
    let records: HashSet<_> = claims
        .iter()
        .map(|claim| claim.record().generation)
        .collect();
    assert_eq!(records, HashSet::from([1]));
    assert_eq!(store.list_sandboxes(None).await.unwrap().len(), 1);
}

/// Only for backends where two handles share data (see `sqlite.rs`).
pub async fn two_store_handles_racing_to_claim_create_exactly_one_sandbox(backend: &dyn Backend) {
    assert!(backend.is_shared(), "two handles must share one database");
    // Opened concurrently too: creating the schema must itself be race-free.
    let (first, second) = tokio::join!(backend.open(), backend.open());
    let new = claim("alice", "thread-1", "projects/a");

    let claims = race_claims(&[first, Arc::clone(&second)], &new, 50).await;

    assert_eq!(count_created(&claims), 1);
    assert_eq!(count_existing(&claims), 49);
    assert_eq!(second.list_sandboxes(None).await.unwrap().len(), 1);
}

pub async fn reclaiming_a_terminated_sandbox_bumps_its_generation_and_may_take_a_new_workdir(
    backend: &dyn Backend,
) {
    let store = backend.open().await;
    let first = claim("alice", "thread-1", "projects/a");
    let old = store.claim_sandbox(&first).await.unwrap().into_record();
    store
        .set_sandbox_state(
            &first.id,
            1,
            SandboxState::Created,
            SandboxState::Terminated,
        )
        .await
        .unwrap()
        .expect("generation 1 is current");
    next_millisecond().await;

    let mut second = claim("alice", "thread-1", "projects/b");
    second.binding.backend = warren_core::BackendKind::Docker;
    let SandboxClaim::Created(record) = store.claim_sandbox(&second).await.unwrap() else {
        panic!("a terminated sandbox must be claimed afresh");
    };

    assert_eq!(record.id, first.id);
    assert_eq!(record.generation, 2);
    assert_eq!(record.state, SandboxState::Created);
    assert_eq!(record.binding.workdir, workdir("projects/b"));
    assert_eq!(record.binding.backend, warren_core::BackendKind::Docker);
    assert!(record.created_at > old.created_at);
    assert_eq!(record.last_active_at, record.created_at);
    assert_eq!(store.list_sandboxes(None).await.unwrap(), vec![record]);
}

pub async fn concurrent_reclaims_of_a_terminated_sandbox_bump_the_generation_once(
    backend: &dyn Backend,
) {
    let store = backend.open().await;
    let new = claim("alice", "thread-1", "projects/a");
    store.claim_sandbox(&new).await.unwrap();
    store
        .set_sandbox_state(&new.id, 1, SandboxState::Created, SandboxState::Terminated)
        .await
        .unwrap()
        .expect("generation 1 is current");

    let claims = race_claims(&[Arc::clone(&store)], &new, 20).await;

    assert_eq!(count_created(&claims), 1);
    assert_eq!(count_existing(&claims), 19);
    let current = store.get_sandbox(&new.id).await.unwrap().unwrap();
    assert_eq!(current.generation, 2);
}

pub async fn a_stale_generation_cannot_change_the_sandbox_state(backend: &dyn Backend) {
    let store = backend.open().await;
    let new = claim("alice", "thread-1", "projects/a");
    store.claim_sandbox(&new).await.unwrap();
    store
        .set_sandbox_state(&new.id, 1, SandboxState::Created, SandboxState::Terminated)
        .await
        .unwrap()
        .expect("generation 1 is current");
    let current = store.claim_sandbox(&new).await.unwrap().into_record();
    assert_eq!(current.generation, 2);

    // A caller still holding generation 1 tries to tear down generation 2.
    let stale = store
        .set_sandbox_state(&new.id, 1, SandboxState::Created, SandboxState::Terminating)
        .await
        .unwrap();

    assert_eq!(stale, None);
    assert_eq!(store.get_sandbox(&new.id).await.unwrap(), Some(current));
    let unknown = SandboxId::derive(&uid("nobody"), &RuntimeScope::new("t").unwrap());
    assert_eq!(
        store
            .set_sandbox_state(&unknown, 1, SandboxState::Created, SandboxState::Running)
            .await
            .unwrap(),
        None
    );
}

pub async fn the_current_generation_moves_the_sandbox_through_its_states(backend: &dyn Backend) {
    let store = backend.open().await;
    let new = claim("alice", "thread-1", "projects/a");
    let created = store.claim_sandbox(&new).await.unwrap().into_record();
    next_millisecond().await;

    let running = store
        .set_sandbox_state(&new.id, 1, SandboxState::Created, SandboxState::Running)
        .await
        .unwrap()
        .expect("generation 1 is current");

    assert_eq!(running.state, SandboxState::Running);
    assert!(running.updated_at > created.updated_at);
    assert_eq!(running.created_at, created.created_at);
    assert_eq!(running.generation, 1);
    assert_eq!(store.get_sandbox(&new.id).await.unwrap(), Some(running));
}

pub async fn a_state_change_from_a_state_the_sandbox_has_left_changes_nothing(
    backend: &dyn Backend,
) {
    let store = backend.open().await;
    let new = claim("alice", "thread-1", "projects/a");
    store.claim_sandbox(&new).await.unwrap();
    let paused = store
        .set_sandbox_state(&new.id, 1, SandboxState::Created, SandboxState::Pausing)
        .await
        .unwrap()
        .expect("the state was created");
    // A second pause read the sandbox as created too: it loses.
    assert_eq!(
        store
            .set_sandbox_state(&new.id, 1, SandboxState::Created, SandboxState::Pausing)
            .await
            .unwrap(),
        None
    );
    assert_eq!(store.get_sandbox(&new.id).await.unwrap(), Some(paused));
}

pub async fn labels_and_a_deadline_come_with_a_new_generation_and_are_replaced_whole(
    backend: &dyn Backend,
) {
    let store = backend.open().await;
    let mut new = claim("alice", "thread-1", "projects/a");
    let deadline = chrono::DateTime::from_timestamp_millis(4_102_444_800_123).unwrap();
    new.settings = SandboxSettings {
        labels: [("team".to_owned(), "a b=c".to_owned())].into(),
        deadline: Some(deadline),
        on_deadline: DeadlineAction::Pause,
    };
    let created = store.claim_sandbox(&new).await.unwrap().into_record();
    assert_eq!(created.settings, new.settings);

    // Joining the live generation changes none of them.
    let mut again = new.clone();
    again.settings = SandboxSettings::default();
    assert_eq!(
        store.claim_sandbox(&again).await.unwrap(),
        SandboxClaim::Existing(created.clone())
    );

    let cleared = store
        .set_sandbox_settings(&new.id, 1, &SandboxSettings::default())
        .await
        .unwrap()
        .expect("generation 1 is current");
    assert_eq!(cleared.settings, SandboxSettings::default());
    assert_eq!(store.get_sandbox(&new.id).await.unwrap(), Some(cleared));
    assert_eq!(
        store
            .set_sandbox_settings(&new.id, 2, &new.settings)
            .await
            .unwrap(),
        None,
        "a stale generation changes nothing"
    );

    // A new generation takes the settings its claim brings.
    store
        .set_sandbox_state(&new.id, 1, SandboxState::Created, SandboxState::Terminated)
        .await
        .unwrap();
    let second = store.claim_sandbox(&new).await.unwrap().into_record();
    assert_eq!((second.generation, &second.settings), (2, &new.settings));
}

pub async fn only_live_sandboxes_past_their_deadline_are_due_earliest_first(backend: &dyn Backend) {
    let store = backend.open().await;
    let now = chrono::Utc::now();
    let at = |seconds: i64| Some(now + chrono::Duration::seconds(seconds));
    let mut ids = Vec::new();
    for (scope, deadline) in [
        ("late", at(-5)),
        ("later", at(-1)),
        ("future", at(60)),
        ("none", None),
        ("paused", at(-9)),
    ] {
        let mut new = claim("alice", scope, scope);
        new.settings.deadline = deadline;
        store.claim_sandbox(&new).await.unwrap();
        ids.push(new.id);
    }
    store
        .set_sandbox_state(&ids[4], 1, SandboxState::Created, SandboxState::Paused)
        .await
        .unwrap()
        .unwrap();
    let due: Vec<SandboxId> = store
        .sandboxes_due(now, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|record| record.id)
        .collect();
    assert_eq!(due, vec![ids[0].clone(), ids[1].clone()]);
    assert_eq!(store.sandboxes_due(now, 1).await.unwrap().len(), 1);
}

pub async fn touching_a_sandbox_moves_only_its_last_activity(backend: &dyn Backend) {
    let store = backend.open().await;
    let new = claim("alice", "thread-1", "projects/a");
    let created = store.claim_sandbox(&new).await.unwrap().into_record();
    next_millisecond().await;

    store.touch_sandbox(&new.id).await.unwrap();

    let touched = store.get_sandbox(&new.id).await.unwrap().unwrap();
    assert!(touched.last_active_at > created.last_active_at);
    assert_eq!(touched.updated_at, created.updated_at);
    assert_eq!(touched.state, created.state);
    let unknown = SandboxId::derive(&uid("nobody"), &RuntimeScope::new("t").unwrap());
    let err = store.touch_sandbox(&unknown).await.unwrap_err();
    assert!(
        matches!(err, StoreError::UnknownSandbox { ref id } if *id == unknown),
        "{err:?}"
    );
}

pub async fn starting_and_finishing_a_run_count_as_sandbox_activity(backend: &dyn Backend) {
    let store = backend.open().await;
    let new = claim("alice", "thread-1", "projects/a");
    let created = store.claim_sandbox(&new).await.unwrap().into_record();
    next_millisecond().await;
    let started = store.start_run(&run("r1", &new.id, 1)).await.unwrap();
    let after_start = store.get_sandbox(&new.id).await.unwrap().unwrap();
    assert_eq!(after_start.last_active_at, started.started_at);
    assert!(after_start.last_active_at > created.last_active_at);
    next_millisecond().await;
    let finished = store
        .finish_run("r1", &RunOutcome::default())
        .await
        .unwrap();
    let after_finish = store.get_sandbox(&new.id).await.unwrap().unwrap();
    assert_eq!(Some(after_finish.last_active_at), finished.finished_at);
    assert_eq!(
        after_finish.updated_at, created.updated_at,
        "activity is not a state change"
    );
}

pub async fn leases_count_while_live_and_expire_unless_renewed(backend: &dyn Backend) {
    let store = backend.open().await;
    let new = claim("alice", "thread-1", "projects/a");
    store.claim_sandbox(&new).await.unwrap();
    let long = store
        .create_lease(&new.id, 1, "root-run", std::time::Duration::from_secs(60))
        .await
        .unwrap();
    let short = store
        .create_lease(
            &new.id,
            1,
            "child-run",
            std::time::Duration::from_millis(50),
        )
        .await
        .unwrap();
    assert_ne!(long.id, short.id);
    assert_eq!(store.live_leases(&new.id, 1).await.unwrap(), 2);
    assert_eq!(
        store.live_leases(&new.id, 2).await.unwrap(),
        0,
        "another generation"
    );
    tokio::time::sleep(std::time::Duration::from_millis(120)).await;
    assert_eq!(
        store.live_leases(&new.id, 1).await.unwrap(),
        1,
        "the short one expired"
    );
    assert!(
        store
            .renew_lease(&new.id, &short.id, std::time::Duration::from_secs(60))
            .await
            .unwrap()
            .is_none(),
        "an expired lease cannot be renewed"
    );
    let renewed = store
        .renew_lease(&new.id, &long.id, std::time::Duration::from_secs(120))
        .await
        .unwrap()
        .unwrap();
    assert!(renewed.expires_at > long.expires_at);
    assert!(store.release_lease(&new.id, &long.id).await.unwrap());
    assert!(!store.release_lease(&new.id, &long.id).await.unwrap());
    assert_eq!(store.live_leases(&new.id, 1).await.unwrap(), 0);
    let unknown = SandboxId::derive(&uid("nobody"), &RuntimeScope::new("t").unwrap());
    assert!(matches!(
        store
            .create_lease(&unknown, 1, "x", std::time::Duration::from_secs(1))
            .await,
        Err(StoreError::UnknownSandbox { .. })
    ));
}

pub async fn sandboxes_are_listed_per_uid_oldest_first(backend: &dyn Backend) {
    let store = backend.open().await;
    let mut expected_alice = Vec::new();
    for scope in ["t-3", "t-1", "t-2"] {
        let record = store
            .claim_sandbox(&claim("alice", scope, "projects/a"))
            .await
            .unwrap()
            .into_record();
        expected_alice.push(record);
        next_millisecond().await;
    }
    let bob = store
        .claim_sandbox(&claim("bob", "t-1", "projects/a"))
        .await
        .unwrap()
        .into_record();

    assert_eq!(
        store.list_sandboxes(Some(&uid("alice"))).await.unwrap(),
        expected_alice
    );
    assert_eq!(
        store.list_sandboxes(Some(&uid("bob"))).await.unwrap(),
        vec![bob.clone()]
    );
    assert!(store
        .list_sandboxes(Some(&uid("carol")))
        .await
        .unwrap()
        .is_empty());
    let mut everyone = expected_alice;
    everyone.push(bob);
    assert_eq!(store.list_sandboxes(None).await.unwrap(), everyone);
    let unknown = SandboxId::derive(&uid("nobody"), &RuntimeScope::new("t").unwrap());
    assert_eq!(store.get_sandbox(&unknown).await.unwrap(), None);
}

pub async fn a_run_is_recorded_from_start_to_finish(backend: &dyn Backend) {
    let store = backend.open().await;
    let sandbox = store
        .claim_sandbox(&claim("alice", "thread-1", "projects/a"))
        .await
        .unwrap()
        .into_record();
    let new = run("run-1", &sandbox.id, sandbox.generation);

    let started = store.start_run(&new).await.unwrap();

    assert_eq!(started.id, "run-1");
    assert_eq!(started.sandbox_id, sandbox.id);
    assert_eq!(started.generation, 1);
    assert_eq!(started.command, new.command);
    assert_eq!(started.cwd, new.cwd);
    assert_eq!(started.requested_by, "agent-1");
    assert_eq!(started.status, RunStatus::Running);
    assert_eq!(started.finished_at, None);
    assert_eq!(started.exit_code, None);
    assert!(!started.timed_out);
    assert_eq!(
        runs_of(&*store, &sandbox.id, 10).await,
        vec![started.clone()]
    );
    next_millisecond().await;

    let outcome = RunOutcome {
        signal: Some(9),
        timed_out: true,
        ..exited(137)
    };
    let finished = store.finish_run("run-1", &outcome).await.unwrap();

    assert_eq!(finished.status, RunStatus::Finished);
    assert_eq!(finished.started_at, started.started_at);
    assert!(finished.finished_at.unwrap() > started.started_at);
    assert_eq!(finished.exit_code, Some(137));
    assert_eq!(finished.signal, Some(9));
    assert!(finished.timed_out);
    assert_eq!(finished.duration_ms, Some(12));
    assert_eq!(finished.cpu_user_ms, Some(3));
    assert_eq!(finished.cpu_system_ms, Some(1));
    assert_eq!(finished.peak_memory_bytes, Some(4 << 20));
    assert_eq!(finished.failure_reason, None);
    assert_eq!(runs_of(&*store, &sandbox.id, 10).await, vec![finished]);
}

pub async fn a_run_warren_could_not_complete_is_recorded_as_failed(backend: &dyn Backend) {
    let store = backend.open().await;
    let sandbox = store
        .claim_sandbox(&claim("alice", "thread-1", "projects/a"))
        .await
        .unwrap()
        .into_record();
    store
        .start_run(&run("run-1", &sandbox.id, 1))
        .await
        .unwrap();

    let outcome = RunOutcome {
        duration_ms: 5,
        failure: Some("the runtime could not be started".to_owned()),
        ..RunOutcome::default()
    };
    let failed = store.finish_run("run-1", &outcome).await.unwrap();

    assert_eq!(failed.status, RunStatus::Failed);
    assert_eq!(
        failed.failure_reason.as_deref(),
        Some("the runtime could not be started")
    );
    assert_eq!(failed.exit_code, None);
    assert!(failed.finished_at.is_some());
}

pub async fn a_finished_run_cannot_be_finished_again(backend: &dyn Backend) {
    let store = backend.open().await;
    let sandbox = store
        .claim_sandbox(&claim("alice", "thread-1", "projects/a"))
        .await
        .unwrap()
        .into_record();
    store
        .start_run(&run("run-1", &sandbox.id, 1))
        .await
        .unwrap();
    let first = store.finish_run("run-1", &exited(0)).await.unwrap();

    let err = store.finish_run("run-1", &exited(1)).await.unwrap_err();
    assert!(
        matches!(err, StoreError::RunAlreadyFinished { ref run_id } if run_id == "run-1"),
        "{err:?}"
    );
    assert_eq!(runs_of(&*store, &sandbox.id, 1).await, vec![first]);

    let err = store.finish_run("run-404", &exited(0)).await.unwrap_err();
    assert!(
        matches!(err, StoreError::UnknownRun { ref run_id } if run_id == "run-404"),
        "{err:?}"
    );
}

pub async fn runs_are_refused_for_unknown_sandboxes_and_duplicate_ids(backend: &dyn Backend) {
    let store = backend.open().await;
    let unknown = SandboxId::derive(&uid("nobody"), &RuntimeScope::new("t").unwrap());
    let err = store
        .start_run(&run("run-1", &unknown, 1))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::UnknownSandbox { ref id } if *id == unknown),
        "{err:?}"
    );

    let sandbox = store
        .claim_sandbox(&claim("alice", "thread-1", "projects/a"))
        .await
        .unwrap()
        .into_record();
    let first = store
        .start_run(&run("run-1", &sandbox.id, 1))
        .await
        .unwrap();
    let err = store
        .start_run(&run("run-1", &sandbox.id, 1))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::DuplicateRun { ref run_id } if run_id == "run-1"),
        "{err:?}"
    );
    assert_eq!(runs_of(&*store, &sandbox.id, 10).await, vec![first]);
}

pub async fn runs_are_listed_newest_first_up_to_the_limit(backend: &dyn Backend) {
    let store = backend.open().await;
    let sandbox = store
        .claim_sandbox(&claim("alice", "thread-1", "projects/a"))
        .await
        .unwrap()
        .into_record();
    let other = store
        .claim_sandbox(&claim("alice", "thread-2", "projects/a"))
        .await
        .unwrap()
        .into_record();
    // No pause between starts: runs begun within one millisecond list by id.
    for index in 0..5 {
        store
            .start_run(&run(&format!("run-{index}"), &sandbox.id, 1))
            .await
            .unwrap();
    }
    store
        .start_run(&run("elsewhere", &other.id, 1))
        .await
        .unwrap();

    let ids = |runs: Vec<warren_store::RunRecord>| -> Vec<String> {
        runs.into_iter().map(|run| run.id).collect()
    };
    assert_eq!(
        ids(runs_of(&*store, &sandbox.id, 10).await),
        ["run-4", "run-3", "run-2", "run-1", "run-0"]
    );
    assert_eq!(
        ids(runs_of(&*store, &sandbox.id, 2).await),
        ["run-4", "run-3"]
    );
    // A limit out of 1..=500 reads as the nearest of the two.
    assert_eq!(ids(runs_of(&*store, &sandbox.id, 0).await), ["run-4"]);
    assert_eq!(ids(runs_of(&*store, &other.id, 10).await), ["elsewhere"]);
}

pub async fn failing_running_runs_closes_only_the_runs_still_running(backend: &dyn Backend) {
    let store = backend.open().await;
    let sandbox = store
        .claim_sandbox(&claim("alice", "thread-1", "projects/a"))
        .await
        .unwrap()
        .into_record();
    for id in ["done", "stuck-1", "stuck-2"] {
        store.start_run(&run(id, &sandbox.id, 1)).await.unwrap();
    }
    let done = store.finish_run("done", &exited(0)).await.unwrap();

    let closed = store
        .fail_running_runs("node-a", "the provisioner restarted")
        .await
        .unwrap();

    assert_eq!(closed, 2);
    let runs = runs_of(&*store, &sandbox.id, 10).await;
    for stuck in runs.iter().filter(|run| run.id.starts_with("stuck")) {
        assert_eq!(stuck.status, RunStatus::Failed);
        assert_eq!(
            stuck.failure_reason.as_deref(),
            Some("the provisioner restarted")
        );
        assert!(stuck.finished_at.is_some());
    }
    assert!(runs.contains(&done));
    assert_eq!(store.fail_running_runs("node-a", "again").await.unwrap(), 0);
}

/// Every run of `query`, page after page, and how many pages it took.
async fn every_page(store: &dyn StateStore, mut query: RunQuery) -> (Vec<RunRecord>, usize) {
    let mut runs = Vec::new();
    let mut pages = 0;
    loop {
        let page = store.query_runs(&query).await.unwrap();
        pages += 1;
        assert!(page.runs.len() <= query.limit as usize);
        runs.extend(page.runs);
        match page.next {
            Some(next) => query.after = Some(next),
            None => return (runs, pages),
        }
        assert!(pages < 1000, "the pages never end");
    }
}

fn run_ids(runs: &[RunRecord]) -> Vec<&str> {
    runs.iter().map(|run| run.id.as_str()).collect()
}

pub async fn a_runs_kind_tag_and_terminal_are_recorded_and_listed(backend: &dyn Backend) {
    let store = backend.open().await;
    let sandbox = store
        .claim_sandbox(&claim("alice", "thread-1", "projects/a"))
        .await
        .unwrap()
        .into_record();
    let exec = store
        .start_run(&run("exec-1", &sandbox.id, 1))
        .await
        .unwrap();
    let process = store
        .start_run(&NewRun {
            kind: RunKind::Process,
            tag: Some("dev-server".to_owned()),
            pty: true,
            ..run("process-1", &sandbox.id, 1)
        })
        .await
        .unwrap();

    assert_eq!(
        (exec.kind, exec.tag.as_deref(), exec.pty),
        (RunKind::Exec, None, false)
    );
    assert_eq!(
        (process.kind, process.tag.as_deref(), process.pty),
        (RunKind::Process, Some("dev-server"), true)
    );
    let finished = store.finish_run("process-1", &exited(0)).await.unwrap();
    assert_eq!(
        (finished.kind, finished.tag.as_deref(), finished.pty),
        (RunKind::Process, Some("dev-server"), true)
    );
    // One execution of code in a context's kernel, tagged with the context.
    let code = store
        .start_run(&NewRun {
            kind: RunKind::Code,
            tag: Some("default".to_owned()),
            ..run("code-1", &sandbox.id, 1)
        })
        .await
        .unwrap();
    let code = store.finish_run(&code.id, &exited(1)).await.unwrap();
    assert_eq!(
        (code.kind, code.tag.as_deref(), code.exit_code),
        (RunKind::Code, Some("default"), Some(1))
    );
    let listed = runs_of(&*store, &sandbox.id, 10).await;
    assert!(listed.contains(&exec), "{listed:?}");
    assert!(listed.contains(&finished), "{listed:?}");
    assert!(listed.contains(&code), "{listed:?}");
}

pub async fn runs_are_filtered_by_status_and_start_time_in_either_scope(backend: &dyn Backend) {
    let store = backend.open().await;
    let one = store
        .claim_sandbox(&claim("alice", "thread-1", "projects/a"))
        .await
        .unwrap()
        .into_record();
    let two = store
        .claim_sandbox(&claim("alice", "thread-2", "projects/b"))
        .await
        .unwrap()
        .into_record();
    store.start_run(&run("ok", &one.id, 1)).await.unwrap();
    store.finish_run("ok", &exited(0)).await.unwrap();
    next_millisecond().await;
    store.start_run(&run("failed", &two.id, 1)).await.unwrap();
    let failure = RunOutcome {
        failure: Some("the runtime could not be started".to_owned()),
        ..RunOutcome::default()
    };
    store.finish_run("failed", &failure).await.unwrap();
    next_millisecond().await;
    let later = store.start_run(&run("exit-1", &one.id, 1)).await.unwrap();
    store.finish_run("exit-1", &exited(1)).await.unwrap();
    next_millisecond().await;
    store.start_run(&run("running", &two.id, 1)).await.unwrap();

    let alice = || RunScope::Uid(uid("alice"));
    let listed = |query: RunQuery| {
        let store = Arc::clone(&store);
        async move {
            let page = store.query_runs(&query).await.unwrap();
            assert_eq!(page.next, None);
            page.runs.into_iter().map(|run| run.id).collect::<Vec<_>>()
        }
    };
    assert_eq!(
        listed(RunQuery::new(alice(), 10)).await,
        ["running", "exit-1", "failed", "ok"]
    );
    assert_eq!(
        listed(RunQuery::new(RunScope::Sandbox(one.id.clone()), 10)).await,
        ["exit-1", "ok"]
    );
    for (status, expected) in [
        (RunStatus::Finished, vec!["exit-1", "ok"]),
        (RunStatus::Failed, vec!["failed"]),
        (RunStatus::Running, vec!["running"]),
    ] {
        let query = RunQuery {
            status: Some(status),
            ..RunQuery::new(alice(), 10)
        };
        assert_eq!(listed(query).await, expected, "{status}");
    }
    let finished_in_two = RunQuery {
        status: Some(RunStatus::Finished),
        ..RunQuery::new(RunScope::Sandbox(two.id.clone()), 10)
    };
    assert!(listed(finished_in_two).await.is_empty());

    // `since` takes runs started at or after it; a time inside a millisecond is after a
    // run recorded in that millisecond.
    let since = |since: chrono::DateTime<chrono::Utc>, scope: RunScope| RunQuery {
        since: Some(since),
        ..RunQuery::new(scope, 10)
    };
    assert_eq!(
        listed(since(later.started_at, alice())).await,
        ["running", "exit-1"]
    );
    assert_eq!(
        listed(since(later.started_at, RunScope::Sandbox(one.id.clone()))).await,
        ["exit-1"]
    );
    let within = later.started_at + chrono::Duration::microseconds(500);
    assert_eq!(listed(since(within, alice())).await, ["running"]);
    let both = RunQuery {
        status: Some(RunStatus::Finished),
        ..since(later.started_at, alice())
    };
    assert_eq!(listed(both).await, ["exit-1"]);
}

pub async fn a_uid_lists_the_runs_of_its_own_sandboxes_only(backend: &dyn Backend) {
    let store = backend.open().await;
    let mut sandboxes = Vec::new();
    for (owner, scope) in [
        ("alice", "t-1"),
        ("alice", "t-2"),
        ("bob", "t-1"),
        ("alicia", "t-1"),
    ] {
        let sandbox = store
            .claim_sandbox(&claim(owner, scope, "projects/a"))
            .await
            .unwrap()
            .into_record();
        store
            .start_run(&run(&format!("{owner}-{scope}"), &sandbox.id, 1))
            .await
            .unwrap();
        sandboxes.push(sandbox);
    }

    let of = |owner: &str| {
        let store = Arc::clone(&store);
        let scope = RunScope::Uid(uid(owner));
        async move {
            let mut ids: Vec<String> = store
                .query_runs(&RunQuery::new(scope, 10))
                .await
                .unwrap()
                .runs
                .into_iter()
                .map(|run| run.id)
                .collect();
            ids.sort();
            ids
        }
    };
    assert_eq!(of("alice").await, ["alice-t-1", "alice-t-2"]);
    assert_eq!(of("bob").await, ["bob-t-1"]);
    assert_eq!(of("alicia").await, ["alicia-t-1"]);
    assert!(of("ali").await.is_empty());
    assert!(of("nobody").await.is_empty());
    // A sandbox never claimed has no runs either.
    let unknown = SandboxId::derive(&uid("nobody"), &RuntimeScope::new("t").unwrap());
    assert!(runs_of(&*store, &unknown, 10).await.is_empty());
}

pub async fn paging_through_runs_started_in_one_millisecond_loses_and_repeats_none(
    backend: &dyn Backend,
) {
    let store = backend.open().await;
    let sandbox = store
        .claim_sandbox(&claim("alice", "thread-1", "projects/a"))
        .await
        .unwrap()
        .into_record();
    let other = store
        .claim_sandbox(&claim("alice", "thread-2", "projects/a"))
        .await
        .unwrap()
        .into_record();
    // Runs are started four at a time until three of them share a millisecond, so that
    // pages of one and two must end inside a millisecond. Ids are not in start order, so
    // the order within a millisecond is the ids'.
    let mut started: Vec<RunRecord> = Vec::new();
    let shared = |runs: &[RunRecord]| {
        runs.iter()
            .map(|run| {
                runs.iter()
                    .filter(|r| r.started_at == run.started_at)
                    .count()
            })
            .max()
            .unwrap_or(0)
    };
    let mut round = 0;
    while shared(&started) < 3 || started.len() < 12 {
        assert!(
            round < 500,
            "no three runs were recorded in one millisecond"
        );
        let tasks: Vec<_> = (0..4)
            .map(|n| {
                let store = Arc::clone(&store);
                let target = if n == 3 { &other } else { &sandbox }.id.clone();
                let id = format!("run-{:03x}", ((round * 4 + n) * 7919) % 4096);
                tokio::spawn(async move { store.start_run(&run(&id, &target, 1)).await })
            })
            .collect();
        for task in tasks {
            started.push(task.await.expect("task").expect("start a run"));
        }
        round += 1;
    }
    for finished in started.iter_mut().step_by(5) {
        *finished = store.finish_run(&finished.id, &exited(0)).await.unwrap();
    }
    let ours = |scope: &RunScope| match scope {
        RunScope::Sandbox(id) => started.iter().filter(|run| &run.sandbox_id == id).count(),
        RunScope::Uid(_) => started.len(),
    };

    for scope in [
        RunScope::Sandbox(sandbox.id.clone()),
        RunScope::Uid(uid("alice")),
    ] {
        let (whole, pages) = every_page(&*store, RunQuery::new(scope.clone(), 500)).await;
        assert_eq!((whole.len(), pages), (ours(&scope), 1), "{scope:?}");
        let mut sorted = whole.clone();
        sorted.sort_by(|a, b| (b.started_at, &b.id).cmp(&(a.started_at, &a.id)));
        assert_eq!(
            run_ids(&whole),
            run_ids(&sorted),
            "newest first, ties by id"
        );
        for limit in [1, 2, 3, 5] {
            let (paged, pages) = every_page(&*store, RunQuery::new(scope.clone(), limit)).await;
            assert_eq!(
                run_ids(&paged),
                run_ids(&whole),
                "{scope:?}, pages of {limit}"
            );
            assert_eq!(
                pages,
                whole.len().div_ceil(limit as usize),
                "{scope:?}, {limit}"
            );
        }
        // Filters hold on every page.
        let running = RunQuery {
            status: Some(RunStatus::Running),
            ..RunQuery::new(scope.clone(), 2)
        };
        let (paged, _) = every_page(&*store, running).await;
        let expected: Vec<&str> = whole
            .iter()
            .filter(|run| run.status == RunStatus::Running)
            .map(|run| run.id.as_str())
            .collect();
        assert_eq!(run_ids(&paged), expected, "{scope:?}, running only");
    }
}

pub async fn recording_a_workdir_twice_reports_it_new_only_once(backend: &dyn Backend) {
    let store = backend.open().await;
    let alice = uid("alice");

    assert!(store
        .record_workdir(&alice, &workdir("projects/a"))
        .await
        .unwrap());
    let first = store.list_workdirs(&alice).await.unwrap();
    next_millisecond().await;
    assert!(!store
        .record_workdir(&alice, &workdir("projects/a"))
        .await
        .unwrap());

    // The first record, and its time, stand.
    assert_eq!(store.list_workdirs(&alice).await.unwrap(), first);
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].uid, alice);
    assert_eq!(first[0].workdir, workdir("projects/a"));
}

pub async fn one_workdir_record_is_read_and_forgotten_by_uid_and_path(backend: &dyn Backend) {
    let store = backend.open().await;
    let (alice, bob) = (uid("alice"), uid("bob"));
    let path = workdir("projects/a");
    assert_eq!(store.workdir(&alice, &path).await.unwrap(), None);
    store.record_workdir(&alice, &path).await.unwrap();
    store.record_workdir(&bob, &path).await.unwrap();
    let listed = store.list_workdirs(&alice).await.unwrap();
    assert_eq!(
        store.workdir(&alice, &path).await.unwrap().as_ref(),
        listed.first()
    );

    assert!(store.forget_workdir(&alice, &path).await.unwrap());
    assert!(!store.forget_workdir(&alice, &path).await.unwrap());
    assert_eq!(store.workdir(&alice, &path).await.unwrap(), None);
    assert!(store.list_workdirs(&alice).await.unwrap().is_empty());
    // Another uid's record of the same path stays.
    assert!(store.workdir(&bob, &path).await.unwrap().is_some());
}

pub async fn workdirs_are_listed_per_uid_oldest_first(backend: &dyn Backend) {
    let store = backend.open().await;
    let alice = uid("alice");
    for path in ["projects/z", "projects/a", "notes"] {
        store.record_workdir(&alice, &workdir(path)).await.unwrap();
        next_millisecond().await;
    }
    store
        .record_workdir(&uid("bob"), &workdir("projects/b"))
        .await
        .unwrap();

    let paths: Vec<_> = store
        .list_workdirs(&alice)
        .await
        .unwrap()
        .into_iter()
        .map(|record| record.workdir.as_str().to_owned())
        .collect();
    assert_eq!(paths, ["projects/z", "projects/a", "notes"]);
    assert_eq!(store.list_workdirs(&uid("bob")).await.unwrap().len(), 1);
    assert!(store.list_workdirs(&uid("carol")).await.unwrap().is_empty());
}

pub async fn branches_are_named_once_per_workdir_and_bound_only_without_a_runtime(
    backend: &dyn Backend,
) {
    let store = backend.open().await;
    let branch = |uid_: &str, path: &str, name: &str| warren_store::BranchRecord {
        uid: uid(uid_),
        workdir: workdir(path),
        name: warren_core::BranchName::new(name).unwrap(),
        id: format!("br-{uid_}-{name}-{}", path.replace('/', "-")),
        checkpoint: None,
        created_at: chrono::Utc::now(),
        merged_at: None,
    };
    assert!(store
        .record_branch(&branch("alice", "projects/a", "b1"))
        .await
        .unwrap());
    next_millisecond().await;
    let mut second = branch("alice", "projects/a", "b2");
    second.checkpoint = Some("ckpt-1".into());
    assert!(store.record_branch(&second).await.unwrap());
    // One name per workdir; the same name elsewhere, or of another uid, is another branch.
    let mut again = branch("alice", "projects/a", "b1");
    again.id = "br-other".into();
    assert!(!store.record_branch(&again).await.unwrap());
    assert!(store
        .record_branch(&branch("alice", "projects/b", "b1"))
        .await
        .unwrap());
    assert!(store
        .record_branch(&branch("bob", "projects/a", "b1"))
        .await
        .unwrap());

    let of_a = store
        .list_branches(&uid("alice"), Some(&workdir("projects/a")))
        .await
        .unwrap();
    let names: Vec<_> = of_a.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["b1", "b2"]);
    assert_eq!(of_a[1].checkpoint.as_deref(), Some("ckpt-1"));
    assert_eq!(of_a[0].id, "br-alice-b1-projects-a");
    assert_eq!(
        store
            .list_branches(&uid("alice"), None)
            .await
            .unwrap()
            .len(),
        3
    );
    let b1 = warren_core::BranchName::new("b1").unwrap();
    assert!(store
        .forget_branch(&uid("alice"), &workdir("projects/a"), &b1)
        .await
        .unwrap());
    assert!(!store
        .forget_branch(&uid("alice"), &workdir("projects/a"), &b1)
        .await
        .unwrap());
    assert_eq!(
        store.list_branches(&uid("bob"), None).await.unwrap().len(),
        1
    );

    // A sandbox records its branch as part of its binding, and is rebound to one only
    // while it has no runtime.
    let mut new = claim("alice", "forked", "projects/a");
    new.binding.branch = Some(b1.clone());
    let SandboxClaim::Created(created) = store.claim_sandbox(&new).await.unwrap() else {
        panic!("a new sandbox");
    };
    assert_eq!(created.binding.branch, Some(b1.clone()));
    let b2 = warren_core::BranchName::new("b2").unwrap();
    let rebound = store
        .set_sandbox_branch(&created.id, created.generation, Some(&b2))
        .await
        .unwrap()
        .expect("a created sandbox is rebound");
    assert_eq!(rebound.binding.branch, Some(b2.clone()));
    let running = store
        .set_sandbox_state(
            &created.id,
            created.generation,
            SandboxState::Created,
            SandboxState::Running,
        )
        .await
        .unwrap()
        .expect("running");
    assert!(store
        .set_sandbox_branch(&running.id, running.generation, None)
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        store
            .get_sandbox(&created.id)
            .await
            .unwrap()
            .unwrap()
            .binding
            .branch,
        Some(b2)
    );
}

/// Only for backends whose data outlives a handle (see `sqlite.rs`).
pub async fn a_reopened_store_keeps_its_data(backend: &dyn Backend) {
    assert!(
        backend.is_shared(),
        "reopening needs a backend that persists"
    );
    let sandbox;
    let runs;
    let workdirs;
    {
        let store = backend.open().await;
        let claimed = store
            .claim_sandbox(&claim("alice", "thread-1", "projects/a"))
            .await
            .unwrap()
            .into_record();
        store
            .start_run(&run("run-1", &claimed.id, 1))
            .await
            .unwrap();
        store
            .record_workdir(&uid("alice"), &workdir("projects/a"))
            .await
            .unwrap();
        runs = runs_of(&*store, &claimed.id, 10).await;
        workdirs = store.list_workdirs(&uid("alice")).await.unwrap();
        // The run moved the sandbox's last activity; compare against the latest record.
        sandbox = store.get_sandbox(&claimed.id).await.unwrap().unwrap();
    }

    let store = backend.open().await;

    assert_eq!(
        store.get_sandbox(&sandbox.id).await.unwrap(),
        Some(sandbox.clone())
    );
    assert_eq!(runs_of(&*store, &sandbox.id, 10).await, runs);
    assert_eq!(store.list_workdirs(&uid("alice")).await.unwrap(), workdirs);
}

/// Claims a sandbox for guard checks and returns its id.
async fn guarded_sandbox(store: &dyn StateStore) -> SandboxId {
    let new = claim("alice", "guarded", "projects/g");
    store.claim_sandbox(&new).await.unwrap();
    new.id
}

fn acquired(answer: GuardAcquire) -> Guard {
    match answer {
        GuardAcquire::Acquired(guard) => guard,
        GuardAcquire::Held(guard) => panic!("the guard should be free, {guard:?} holds it"),
    }
}

pub async fn a_guard_is_exclusive_until_released_and_each_new_holder_gets_a_larger_token(
    backend: &dyn Backend,
) {
    let store = backend.open().await;
    let id = guarded_sandbox(store.as_ref()).await;
    let ttl = Duration::from_secs(60);

    let first = acquired(store.acquire_guard(&id, "run-1", ttl).await.unwrap());
    assert_eq!(first.token, 1);
    assert_eq!(first.holder, "run-1");
    assert!(first.expires_at > first.acquired_at);

    let GuardAcquire::Held(held) = store.acquire_guard(&id, "run-2", ttl).await.unwrap() else {
        panic!("a live guard must not be taken by another holder");
    };
    assert_eq!(held, first, "a refused acquisition changes nothing");
    assert_eq!(store.current_guard(&id).await.unwrap(), Some(first.clone()));

    assert!(store.release_guard(&id, first.token).await.unwrap());
    assert!(!store.release_guard(&id, first.token).await.unwrap());
    assert_eq!(store.current_guard(&id).await.unwrap(), None);

    let second = acquired(store.acquire_guard(&id, "run-2", ttl).await.unwrap());
    assert_eq!(second.token, 2);
    assert_eq!(second.holder, "run-2");
}

pub async fn a_lapsed_guard_is_free_and_cannot_be_renewed(backend: &dyn Backend) {
    let store = backend.open().await;
    let id = guarded_sandbox(store.as_ref()).await;
    let first = acquired(
        store
            .acquire_guard(&id, "run-1", Duration::from_millis(200))
            .await
            .unwrap(),
    );
    // Renewing a live guard moves its expiry, never its token.
    let renewed = store
        .renew_guard(&id, first.token, Some(Duration::from_millis(300)))
        .await
        .unwrap()
        .expect("a live guard renews");
    assert_eq!(renewed.token, first.token);
    assert!(renewed.expires_at >= first.expires_at);

    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(store.current_guard(&id).await.unwrap(), None);
    assert_eq!(
        store
            .renew_guard(&id, first.token, Some(Duration::from_secs(60)))
            .await
            .unwrap(),
        None,
        "a lapsed holder must acquire again"
    );
    let second = acquired(
        store
            .acquire_guard(&id, "run-2", Duration::from_secs(60))
            .await
            .unwrap(),
    );
    assert!(second.token > first.token);
    // The old token no longer renews or releases the new holder's guard.
    assert_eq!(
        store
            .renew_guard(&id, first.token, Some(Duration::from_secs(60)))
            .await
            .unwrap(),
        None
    );
    assert!(!store.release_guard(&id, first.token).await.unwrap());
    assert_eq!(store.current_guard(&id).await.unwrap(), Some(second));
}

pub async fn only_the_newest_token_passes_the_fence(backend: &dyn Backend) {
    let store = backend.open().await;
    let id = guarded_sandbox(store.as_ref()).await;
    assert_eq!(
        store.check_fence(&id, 1).await.unwrap(),
        FenceCheck::Unknown { newest: None }
    );
    let ttl = Duration::from_secs(60);
    let first = acquired(store.acquire_guard(&id, "run-1", ttl).await.unwrap());
    assert_eq!(
        store.check_fence(&id, first.token).await.unwrap(),
        FenceCheck::Current
    );
    store.release_guard(&id, first.token).await.unwrap();
    // Released but not superseded: still the newest token.
    assert_eq!(
        store.check_fence(&id, first.token).await.unwrap(),
        FenceCheck::Current
    );
    let second = acquired(store.acquire_guard(&id, "run-2", ttl).await.unwrap());
    assert_eq!(
        store.check_fence(&id, first.token).await.unwrap(),
        FenceCheck::Stale {
            newest: second.token
        }
    );
    assert_eq!(
        store.check_fence(&id, second.token + 1).await.unwrap(),
        FenceCheck::Unknown {
            newest: Some(second.token)
        }
    );
}

pub async fn guard_tokens_keep_growing_across_generations(backend: &dyn Backend) {
    let store = backend.open().await;
    let new = claim("alice", "guarded", "projects/g");
    let record = store.claim_sandbox(&new).await.unwrap().into_record();
    let ttl = Duration::from_secs(60);
    let first = acquired(store.acquire_guard(&new.id, "run-1", ttl).await.unwrap());
    store.release_guard(&new.id, first.token).await.unwrap();
    store
        .set_sandbox_state(
            &new.id,
            record.generation,
            SandboxState::Created,
            SandboxState::Terminated,
        )
        .await
        .unwrap();
    store.claim_sandbox(&new).await.unwrap();
    let second = acquired(store.acquire_guard(&new.id, "run-2", ttl).await.unwrap());
    assert!(second.token > first.token);
}

pub async fn a_guard_on_a_sandbox_never_claimed_is_refused(backend: &dyn Backend) {
    let store = backend.open().await;
    let id = claim("nobody", "t", "projects/a").id;
    let err = store
        .acquire_guard(&id, "run-1", Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::UnknownSandbox { .. }), "{err:?}");
}

pub async fn concurrent_acquisitions_of_a_free_guard_grant_it_exactly_once(backend: &dyn Backend) {
    let stores: Vec<Arc<dyn StateStore>> = if backend.is_shared() {
        vec![backend.open().await, backend.open().await]
    } else {
        vec![backend.open().await]
    };
    let id = guarded_sandbox(stores[0].as_ref()).await;
    let handles: Vec<_> = (0..40)
        .map(|task| {
            let store = Arc::clone(&stores[task % stores.len()]);
            let id = id.clone();
            tokio::spawn(async move {
                store
                    .acquire_guard(&id, &format!("run-{task}"), Duration::from_secs(60))
                    .await
            })
        })
        .collect();
    let mut winners = Vec::new();
    for handle in handles {
        if let GuardAcquire::Acquired(guard) = handle.await.unwrap().unwrap() {
            winners.push(guard);
        }
    }
    assert_eq!(winners.len(), 1, "{winners:?}");
    assert_eq!(winners[0].token, 1);
}

pub async fn a_renewal_naming_no_ttl_extends_by_the_last_one_granted(backend: &dyn Backend) {
    let store = backend.open().await;
    let id = guarded_sandbox(store.as_ref()).await;
    let first = acquired(
        store
            .acquire_guard(&id, "run-1", Duration::from_secs(40))
            .await
            .unwrap(),
    );
    let renewed = store
        .renew_guard(&id, first.token, None)
        .await
        .unwrap()
        .expect("a live guard renews");
    let lifetime = renewed.expires_at - chrono::Utc::now();
    assert!(
        lifetime > chrono::TimeDelta::seconds(35) && lifetime <= chrono::TimeDelta::seconds(40),
        "{lifetime}"
    );
    // An explicit TTL becomes the one later renewals use.
    store
        .renew_guard(&id, first.token, Some(Duration::from_secs(600)))
        .await
        .unwrap()
        .unwrap();
    let again = store
        .renew_guard(&id, first.token, None)
        .await
        .unwrap()
        .unwrap();
    assert!(again.expires_at - chrono::Utc::now() > chrono::TimeDelta::seconds(500));
}

pub async fn an_alias_names_one_sandbox_for_good_and_is_recorded_idempotently(
    backend: &dyn Backend,
) {
    let store = backend.open().await;
    let first = store
        .claim_sandbox(&claim("alice", "thread-1", "threads/thread-1/user-data"))
        .await
        .unwrap()
        .into_record();
    let second = store
        .claim_sandbox(&claim("alice", "thread-2", "threads/thread-2/user-data"))
        .await
        .unwrap()
        .into_record();

    let put = store
        .put_sandbox_alias("deerflow", "0a1b2c3d", &first.id)
        .await
        .unwrap();
    assert_eq!(
        (put.namespace.as_str(), put.alias.as_str(), &put.sandbox_id),
        ("deerflow", "0a1b2c3d", &first.id)
    );
    // Again: the same record, not a second one, and its first creation time.
    next_millisecond().await;
    let again = store
        .put_sandbox_alias("deerflow", "0a1b2c3d", &first.id)
        .await
        .unwrap();
    assert_eq!(again, put);

    // Pointing it at another sandbox is a conflict that changes nothing.
    let error = store
        .put_sandbox_alias("deerflow", "0a1b2c3d", &second.id)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, StoreError::AliasConflict { bound, .. } if *bound == first.id),
        "{error:?}"
    );
    assert_eq!(
        store
            .get_sandbox_alias("deerflow", "0a1b2c3d")
            .await
            .unwrap(),
        Some(put.clone())
    );

    // The same alias in another namespace is another name.
    store
        .put_sandbox_alias("other", "0a1b2c3d", &second.id)
        .await
        .unwrap();
    next_millisecond().await;
    let later = store
        .put_sandbox_alias("deerflow", "ffff0000", &second.id)
        .await
        .unwrap();
    assert_eq!(
        store.list_sandbox_aliases("deerflow").await.unwrap(),
        vec![put, later],
        "oldest first, one namespace only"
    );
    assert_eq!(
        store
            .get_sandbox_alias("deerflow", "missing")
            .await
            .unwrap(),
        None
    );
}

pub async fn an_alias_of_a_sandbox_never_claimed_is_refused(backend: &dyn Backend) {
    let store = backend.open().await;
    let never = SandboxId::derive(&uid("nobody"), &RuntimeScope::new("none").unwrap());
    let error = store
        .put_sandbox_alias("deerflow", "0a1b2c3d", &never)
        .await
        .unwrap_err();
    assert!(
        matches!(error, StoreError::UnknownSandbox { .. }),
        "{error:?}"
    );
    assert!(store
        .list_sandbox_aliases("deerflow")
        .await
        .unwrap()
        .is_empty());
}

pub async fn a_transport_record_is_written_only_at_the_version_its_writer_read(
    backend: &dyn Backend,
) {
    let store = backend.open().await;
    // Two handles of one database where the backend shares one; else one handle twice.
    let other = if backend.is_shared() {
        backend.open().await
    } else {
        Arc::clone(&store)
    };
    let first = store
        .put_record("e2b", "sandboxes/a", b"one", RecordWrite::Create)
        .await
        .unwrap();
    assert_eq!(first, 1);
    let again = other
        .put_record("e2b", "sandboxes/a", b"two", RecordWrite::Create)
        .await
        .unwrap_err();
    assert!(
        matches!(again, StoreError::RecordConflict { .. }),
        "{again:?}"
    );
    // Two writers read version 1; only the first replace wins.
    let won = store
        .put_record("e2b", "sandboxes/a", b"two", RecordWrite::Replace(1))
        .await
        .unwrap();
    assert_eq!(won, 2);
    let lost = other
        .put_record("e2b", "sandboxes/a", b"three", RecordWrite::Replace(1))
        .await
        .unwrap_err();
    assert!(
        matches!(lost, StoreError::RecordConflict { .. }),
        "{lost:?}"
    );
    let read = other
        .get_record("e2b", "sandboxes/a")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((read.value.as_slice(), read.version), (&b"two"[..], 2));
    store
        .put_record("e2b", "sandboxes/b", b"b", RecordWrite::Create)
        .await
        .unwrap();
    store
        .put_record("e2b", "keys/k", b"k", RecordWrite::Create)
        .await
        .unwrap();
    store
        .put_record("other", "sandboxes/c", b"c", RecordWrite::Create)
        .await
        .unwrap();
    let listed: Vec<String> = store
        .list_records("e2b", "sandboxes/")
        .await
        .unwrap()
        .into_iter()
        .map(|record| record.key)
        .collect();
    assert_eq!(
        listed,
        ["sandboxes/a", "sandboxes/b"],
        "one namespace, one prefix"
    );
    assert_eq!(store.list_records("e2b", "").await.unwrap().len(), 3);
    assert!(
        !store
            .delete_record("e2b", "sandboxes/a", Some(1))
            .await
            .unwrap(),
        "a stale version deletes nothing"
    );
    assert!(store
        .delete_record("e2b", "sandboxes/a", Some(2))
        .await
        .unwrap());
    assert!(store
        .get_record("e2b", "sandboxes/a")
        .await
        .unwrap()
        .is_none());
    assert!(!store
        .delete_record("e2b", "sandboxes/a", None)
        .await
        .unwrap());
    let too_big = vec![0u8; warren_store::MAX_RECORD_VALUE + 1];
    assert!(matches!(
        store
            .put_record("e2b", "big", &too_big, RecordWrite::Create)
            .await
            .unwrap_err(),
        StoreError::RecordInvalid { .. }
    ));
}

pub async fn each_registration_of_a_node_takes_a_new_epoch_that_supersedes_the_old(
    backend: &dyn Backend,
) {
    let store = backend.open().await;
    let ttl = Duration::from_secs(30);
    let first = store
        .register_node("node-a", "http://10.0.0.1:7878", ttl)
        .await
        .unwrap();
    assert_eq!((first.epoch, first.state), (1, NodeState::Live));
    assert_eq!(first.advertise, "http://10.0.0.1:7878");
    assert!(first.expires_at > first.renewed_at);
    let other = store
        .register_node("node-b", "http://10.0.0.2:7878", ttl)
        .await
        .unwrap();
    assert_eq!(other.epoch, 1, "epochs are per node id");
    // The same id again (a restart, or a second process given it): a new epoch, and the
    // old one can no longer renew or leave.
    let second = store
        .register_node("node-a", "http://10.0.0.9:7878", ttl)
        .await
        .unwrap();
    assert_eq!(second.epoch, 2);
    assert_eq!(store.renew_node("node-a", 1, ttl).await.unwrap(), None);
    assert!(!store.leave_node("node-a", 1).await.unwrap());
    let renewed = store
        .renew_node("node-a", 2, ttl)
        .await
        .unwrap()
        .expect("the newest epoch renews");
    assert_eq!(renewed.epoch, 2);
    assert!(renewed.expires_at >= second.expires_at);
    let listed = store.list_nodes().await.unwrap();
    let summary: Vec<_> = listed
        .iter()
        .map(|n| (n.node_id.as_str(), n.epoch, n.advertise.as_str(), n.state))
        .collect();
    assert_eq!(
        summary,
        [
            ("node-a", 2, "http://10.0.0.9:7878", NodeState::Live),
            ("node-b", 1, "http://10.0.0.2:7878", NodeState::Live),
        ]
    );
}

pub async fn a_node_lease_lapses_unless_renewed_and_a_lapsed_epoch_cannot_renew(
    backend: &dyn Backend,
) {
    let store = backend.open().await;
    let short = Duration::from_millis(300);
    let node = store
        .register_node("node-a", "http://a", short)
        .await
        .unwrap();
    let renewed = store
        .renew_node("node-a", node.epoch, short)
        .await
        .unwrap()
        .expect("a live lease renews");
    assert!(renewed.expires_at >= node.expires_at);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let listed = store.list_nodes().await.unwrap();
    assert_eq!(listed[0].state, NodeState::Lapsed, "{listed:?}");
    assert_eq!(
        store
            .renew_node("node-a", node.epoch, Duration::from_secs(60))
            .await
            .unwrap(),
        None,
        "a lapsed epoch must register again, never renew"
    );
    let again = store
        .register_node("node-a", "http://a", short)
        .await
        .unwrap();
    assert_eq!(
        (again.epoch, again.state),
        (node.epoch + 1, NodeState::Live)
    );
}

pub async fn a_node_that_leaves_is_listed_as_left_and_cannot_renew(backend: &dyn Backend) {
    let store = backend.open().await;
    let ttl = Duration::from_secs(30);
    let node = store
        .register_node("node-a", "http://a", ttl)
        .await
        .unwrap();
    assert!(store.leave_node("node-a", node.epoch).await.unwrap());
    assert!(
        !store.leave_node("node-a", node.epoch).await.unwrap(),
        "leaving twice changes nothing"
    );
    let listed = store.list_nodes().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].state, NodeState::Left);
    assert!(listed[0].left_at.is_some());
    assert!(listed[0].expires_at <= listed[0].left_at.unwrap());
    assert_eq!(
        store.renew_node("node-a", node.epoch, ttl).await.unwrap(),
        None
    );
    let back = store
        .register_node("node-a", "http://a", ttl)
        .await
        .unwrap();
    assert_eq!(
        (back.epoch, back.state, back.left_at),
        (2, NodeState::Live, None)
    );
}

pub async fn concurrent_registrations_of_one_node_id_take_distinct_epochs(backend: &dyn Backend) {
    let store = backend.open().await;
    let registrations = (0..8).map(|n| {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .register_node("node-a", &format!("http://a{n}"), Duration::from_secs(30))
                .await
                .unwrap()
                .epoch
        })
    });
    let mut epochs = Vec::new();
    for registration in registrations {
        epochs.push(registration.await.unwrap());
    }
    epochs.sort_unstable();
    assert_eq!(epochs, (1..=8).collect::<Vec<i64>>());
    let listed = store.list_nodes().await.unwrap();
    assert_eq!(
        listed[0].epoch, 8,
        "the newest registration is the one recorded"
    );
}

/// A sandbox claimed for the ownership tests, and its id.
async fn owned_sandbox(store: &dyn StateStore, scope: &str) -> SandboxRecord {
    store
        .claim_sandbox(&claim("alice", scope, "projects/a"))
        .await
        .unwrap()
        .into_record()
}

pub async fn a_runtime_has_one_owner_and_a_live_owner_is_deferred_to(backend: &dyn Backend) {
    let store = backend.open().await;
    let ttl = Duration::from_secs(30);
    let a = store
        .register_node("node-a", "http://a:7878", ttl)
        .await
        .unwrap();
    let b = store
        .register_node("node-b", "http://b:7878", ttl)
        .await
        .unwrap();
    let sandbox = owned_sandbox(store.as_ref(), "owners-1").await;
    assert_eq!(store.runtime_owner(&sandbox.id).await.unwrap(), None);

    let first = store
        .claim_runtime(&sandbox.id, "node-a", a.epoch, false)
        .await
        .unwrap();
    assert_eq!(
        first,
        RuntimeClaim::Owned {
            token: 1,
            took_over: None
        }
    );
    // Claiming again keeps the same ownership and token.
    assert_eq!(
        store
            .claim_runtime(&sandbox.id, "node-a", a.epoch, false)
            .await
            .unwrap(),
        first
    );
    // Another live node is sent to the owner, and changes nothing.
    assert_eq!(
        store
            .claim_runtime(&sandbox.id, "node-b", b.epoch, false)
            .await
            .unwrap(),
        RuntimeClaim::Elsewhere {
            node_id: "node-a".into(),
            advertise: "http://a:7878".into(),
            token: 1
        }
    );
    let owners = store.runtime_owners().await.unwrap();
    assert_eq!(owners.len(), 1);
    assert_eq!(owners[0].node_id.as_deref(), Some("node-a"));

    // Released, the runtime is free, and the next owner's token is larger.
    assert!(!store
        .release_runtime(&sandbox.id, "node-b", 1)
        .await
        .unwrap());
    assert!(store
        .release_runtime(&sandbox.id, "node-a", 1)
        .await
        .unwrap());
    assert!(store.runtime_owners().await.unwrap().is_empty());
    assert_eq!(
        store
            .claim_runtime(&sandbox.id, "node-b", b.epoch, false)
            .await
            .unwrap(),
        RuntimeClaim::Owned {
            token: 2,
            took_over: None
        }
    );
    // A stale epoch of a node may claim nothing: it must join again first.
    let superseded = store
        .register_node("node-a", "http://a:7878", ttl)
        .await
        .unwrap();
    assert_eq!(
        store
            .claim_runtime(&sandbox.id, "node-a", a.epoch, false)
            .await
            .unwrap(),
        RuntimeClaim::NotMember
    );
    assert_eq!(
        store
            .claim_runtime(&sandbox.id, "node-a", superseded.epoch, false)
            .await
            .unwrap(),
        RuntimeClaim::Elsewhere {
            node_id: "node-b".into(),
            advertise: "http://b:7878".into(),
            token: 2
        }
    );
    // The only server on the store (its lock says so) takes a live-looking owner's
    // runtime over: that owner is a dead server's node.
    assert_eq!(
        store
            .claim_runtime(&sandbox.id, "node-a", superseded.epoch, true)
            .await
            .unwrap(),
        RuntimeClaim::Owned {
            token: 3,
            took_over: Some(TakenOver {
                node_id: "node-b".into(),
                epoch: b.epoch,
                lost_runs: 0
            })
        }
    );
}

pub async fn a_takeover_from_a_lapsed_owner_fences_its_writes_and_closes_its_runs(
    backend: &dyn Backend,
) {
    let store = backend.open().await;
    let short = Duration::from_millis(300);
    let long = Duration::from_secs(30);
    let a = store
        .register_node("node-a", "http://a", short)
        .await
        .unwrap();
    let b = store
        .register_node("node-b", "http://b", long)
        .await
        .unwrap();
    let sandbox = owned_sandbox(store.as_ref(), "owners-2").await;
    let RuntimeClaim::Owned { token, .. } = store
        .claim_runtime(&sandbox.id, "node-a", a.epoch, false)
        .await
        .unwrap()
    else {
        panic!("a free runtime is taken");
    };
    let fence_a = OwnerFence {
        node_id: "node-a".into(),
        token,
    };
    let running = store
        .set_runtime_state(
            &sandbox.id,
            1,
            SandboxState::Created,
            SandboxState::Running,
            &fence_a,
        )
        .await
        .unwrap()
        .expect("the owner sets the state");
    assert_eq!(running.state, SandboxState::Running);
    let mut in_flight = run("on-a", &sandbox.id, 1);
    in_flight.owner = Some(fence_a.clone());
    store.start_run(&in_flight).await.unwrap();

    // node-a stops renewing; once its lease lapsed, node-b takes the runtime over.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let claim = store
        .claim_runtime(&sandbox.id, "node-b", b.epoch, false)
        .await
        .unwrap();
    assert_eq!(
        claim,
        RuntimeClaim::Owned {
            token: token + 1,
            took_over: Some(TakenOver {
                node_id: "node-a".into(),
                epoch: a.epoch,
                lost_runs: 1
            })
        }
    );
    let lost = runs_of(&*store, &sandbox.id, 10).await;
    assert_eq!(lost[0].status, RunStatus::Failed);
    assert_eq!(lost[0].failure_reason.as_deref(), Some(NODE_LOST));
    let after = store.get_sandbox(&sandbox.id).await.unwrap().unwrap();
    assert_eq!(
        after.state,
        SandboxState::Stopped,
        "the new owner starts a runtime afresh"
    );

    // Every late write of node-a is refused; its late outcome does not overwrite node_lost.
    let mut late = run("late-on-a", &sandbox.id, 1);
    late.owner = Some(fence_a.clone());
    let error = store.start_run(&late).await.unwrap_err();
    assert!(
        matches!(error, StoreError::NotOwner { token: t, .. } if t == token),
        "{error:?}"
    );
    let error = store
        .set_runtime_state(
            &sandbox.id,
            1,
            SandboxState::Running,
            SandboxState::Running,
            &fence_a,
        )
        .await
        .unwrap_err();
    assert!(matches!(error, StoreError::NotOwner { .. }), "{error:?}");
    assert!(matches!(
        store.finish_run("on-a", &exited(0)).await.unwrap_err(),
        StoreError::RunAlreadyFinished { .. }
    ));
    let late_snapshot = warren_store::RuntimeSnapshot {
        id: "snap-late".into(),
        sandbox_id: sandbox.id.clone(),
        generation: 1,
        cow_manifest: "c".into(),
        home_manifest: "h".into(),
        bytes: 1,
        reason: "reap".into(),
        created_at: chrono::Utc::now(),
    };
    let error = store
        .record_runtime_snapshot(&late_snapshot, Some(&fence_a))
        .await
        .unwrap_err();
    assert!(matches!(error, StoreError::NotOwner { .. }), "{error:?}");
    assert!(store
        .list_runtime_snapshots(&sandbox.id)
        .await
        .unwrap()
        .is_empty());
    assert!(!store
        .release_runtime(&sandbox.id, "node-a", token)
        .await
        .unwrap());
    assert_eq!(runs_of(&*store, &sandbox.id, 10).await.len(), 1);
    // The new owner's writes pass.
    let fence_b = OwnerFence {
        node_id: "node-b".into(),
        token: token + 1,
    };
    let mut next = run("on-b", &sandbox.id, 1);
    next.owner = Some(fence_b.clone());
    store.start_run(&next).await.unwrap();
    assert!(store
        .set_runtime_state(
            &sandbox.id,
            1,
            SandboxState::Stopped,
            SandboxState::Running,
            &fence_b
        )
        .await
        .unwrap()
        .is_some());
    // A generation that is not the sandbox's is no refusal of ownership: just no change.
    assert_eq!(
        store
            .set_runtime_state(
                &sandbox.id,
                7,
                SandboxState::Running,
                SandboxState::Stopped,
                &fence_b
            )
            .await
            .unwrap(),
        None
    );
}

pub async fn a_restarted_node_adopts_only_the_runtimes_still_recorded_as_its_own(
    backend: &dyn Backend,
) {
    let store = backend.open().await;
    let ttl = Duration::from_secs(30);
    let a = store
        .register_node("node-a", "http://a", ttl)
        .await
        .unwrap();
    let b = store
        .register_node("node-b", "http://b", ttl)
        .await
        .unwrap();
    let kept = owned_sandbox(store.as_ref(), "adopt-kept").await;
    let lost = owned_sandbox(store.as_ref(), "adopt-lost").await;
    let released = owned_sandbox(store.as_ref(), "adopt-released").await;
    let legacy = owned_sandbox(store.as_ref(), "adopt-legacy").await;
    for sandbox in [&kept, &lost, &released] {
        store
            .claim_runtime(&sandbox.id, "node-a", a.epoch, false)
            .await
            .unwrap();
    }
    assert!(store.release_runtime(&lost.id, "node-a", 1).await.unwrap());
    store
        .claim_runtime(&lost.id, "node-b", b.epoch, false)
        .await
        .unwrap();
    assert!(store
        .release_runtime(&released.id, "node-a", 1)
        .await
        .unwrap());

    // node-a restarts: a new epoch, and its runtimes survived the restart.
    let again = store
        .register_node("node-a", "http://a", ttl)
        .await
        .unwrap();
    assert_eq!(
        store
            .adopt_runtime(&kept.id, "node-a", again.epoch)
            .await
            .unwrap(),
        Some(1),
        "still ours: kept, with its token"
    );
    assert_eq!(
        store
            .claim_runtime(&kept.id, "node-b", b.epoch, false)
            .await
            .unwrap(),
        RuntimeClaim::Elsewhere {
            node_id: "node-a".into(),
            advertise: "http://a".into(),
            token: 1
        },
        "adopted at the live epoch, so nobody takes it over"
    );
    assert_eq!(
        store
            .adopt_runtime(&lost.id, "node-a", again.epoch)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store
            .adopt_runtime(&released.id, "node-a", again.epoch)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store
            .adopt_runtime(&legacy.id, "node-a", again.epoch)
            .await
            .unwrap(),
        Some(1),
        "a runtime from before ownership was recorded is adopted"
    );
}

pub async fn recovery_closes_only_the_runs_of_its_own_node(backend: &dyn Backend) {
    let store = backend.open().await;
    let ttl = Duration::from_secs(30);
    let a = store
        .register_node("node-a", "http://a", ttl)
        .await
        .unwrap();
    let b = store
        .register_node("node-b", "http://b", ttl)
        .await
        .unwrap();
    let on_a = owned_sandbox(store.as_ref(), "runs-a").await;
    let on_b = owned_sandbox(store.as_ref(), "runs-b").await;
    for (sandbox, node, epoch) in [(&on_a, "node-a", a.epoch), (&on_b, "node-b", b.epoch)] {
        let RuntimeClaim::Owned { token, .. } = store
            .claim_runtime(&sandbox.id, node, epoch, false)
            .await
            .unwrap()
        else {
            panic!("free runtimes are taken");
        };
        let mut new = run(&format!("run-{node}"), &sandbox.id, 1);
        new.owner = Some(OwnerFence {
            node_id: node.into(),
            token,
        });
        store.start_run(&new).await.unwrap();
    }
    assert_eq!(
        store
            .fail_running_runs("node-a", "provisioner_restarted")
            .await
            .unwrap(),
        1
    );
    let b_runs = runs_of(&*store, &on_b.id, 10).await;
    assert_eq!(
        b_runs[0].status,
        RunStatus::Running,
        "node-b's run is node-b's"
    );
}

pub async fn concurrent_claims_of_one_runtime_leave_exactly_one_owner(backend: &dyn Backend) {
    let ttl = Duration::from_secs(30);
    let setup = backend.open().await;
    let sandbox = owned_sandbox(setup.as_ref(), "owners-race").await;
    let mut nodes = Vec::new();
    for n in 0..8 {
        let id = format!("node-{n}");
        let record = setup.register_node(&id, "http://n", ttl).await.unwrap();
        nodes.push((id, record.epoch));
    }
    let mut claims = Vec::new();
    for (id, epoch) in nodes {
        // Separate handles where the backend shares its data, so the race is real.
        let store = if backend.is_shared() {
            backend.open().await
        } else {
            setup.clone()
        };
        let sandbox = sandbox.id.clone();
        claims.push(tokio::spawn(async move {
            (
                id.clone(),
                store
                    .claim_runtime(&sandbox, &id, epoch, false)
                    .await
                    .unwrap(),
            )
        }));
    }
    let mut owners = Vec::new();
    for claim in claims {
        let (id, claim) = claim.await.unwrap();
        if let RuntimeClaim::Owned { token, .. } = claim {
            owners.push((id, token));
        }
    }
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(owners[0].1, 1);
}

/// Two handles of one database where the backend shares one (a rerun is another process);
/// else one handle twice.
async fn second_handle(backend: &dyn Backend, store: &Arc<dyn StateStore>) -> Arc<dyn StateStore> {
    if backend.is_shared() {
        backend.open().await
    } else {
        Arc::clone(store)
    }
}

/// The states of a migration's items, by key.
async fn item_states(store: &dyn StateStore, id: &str) -> Vec<(String, ItemState)> {
    store
        .migration_items(id)
        .await
        .unwrap()
        .into_iter()
        .map(|item| (item.key, item.state))
        .collect()
}

pub async fn a_migration_begun_twice_with_the_same_digest_is_resumed_unchanged(
    backend: &dyn Backend,
) {
    let store = backend.open().await;
    let rerun = second_handle(backend, &store).await;
    let items = [
        migration_item("a", Some("alice")),
        migration_item("b", Some("bob")),
    ];
    let begun = store
        .begin_migration(&migration("m-1", "digest-1"), &items)
        .await
        .unwrap();
    assert_eq!(begun.id, "m-1");
    assert_eq!(begun.kind, "deerflow");
    assert_eq!(begun.plan_digest, "digest-1");
    assert_eq!(begun.plan, migration("m-1", "digest-1").plan);
    assert_eq!(begun.state, MigrationState::Planned);
    assert_eq!(begun.created_at, begun.updated_at);
    assert_eq!(
        store.get_migration("m-1").await.unwrap(),
        Some(begun.clone())
    );
    assert!(store
        .advance_migration_item(
            "m-1",
            "a",
            ItemState::Planned,
            ItemState::Copied,
            ItemUpdate::default()
        )
        .await
        .unwrap());
    next_millisecond().await;

    // The rerun after a crash: the same plan, whatever items it lists now.
    let resumed = rerun
        .begin_migration(&migration("m-1", "digest-1"), &[migration_item("c", None)])
        .await
        .unwrap();

    assert_eq!(resumed, begun, "resumed unchanged");
    assert_eq!(
        item_states(&*rerun, "m-1").await,
        [
            ("a".to_owned(), ItemState::Copied),
            ("b".to_owned(), ItemState::Planned)
        ],
        "the items keep the steps they took, and no item is added"
    );
    assert_eq!(rerun.list_migrations().await.unwrap(), [begun]);
}

pub async fn a_migration_begun_again_with_another_digest_is_refused_and_changes_nothing(
    backend: &dyn Backend,
) {
    let store = backend.open().await;
    let rerun = second_handle(backend, &store).await;
    let begun = store
        .begin_migration(
            &migration("m-1", "digest-1"),
            &[migration_item("a", Some("alice"))],
        )
        .await
        .unwrap();

    let err = rerun
        .begin_migration(
            &migration("m-1", "digest-2"),
            &[
                migration_item("a", Some("alice")),
                migration_item("b", None),
            ],
        )
        .await
        .unwrap_err();

    match &err {
        StoreError::MigrationConflict {
            id,
            planned,
            requested,
        } => {
            assert_eq!(
                (id.as_str(), planned.as_str(), requested.as_str()),
                ("m-1", "digest-1", "digest-2")
            );
        }
        other => panic!("{other:?}"),
    }
    let message = err.to_string();
    assert!(
        message.contains("the source changed since it was planned"),
        "{message}"
    );
    assert!(message.contains("\"m-1\""), "{message}");
    assert_eq!(store.get_migration("m-1").await.unwrap(), Some(begun));
    assert_eq!(
        item_states(&*store, "m-1").await,
        [("a".to_owned(), ItemState::Planned)]
    );
}

pub async fn a_migration_that_names_an_item_twice_is_refused_and_writes_nothing(
    backend: &dyn Backend,
) {
    let store = backend.open().await;
    let err = store
        .begin_migration(
            &migration("m-1", "digest-1"),
            &[migration_item("a", None), migration_item("a", None)],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::MigrationInvalid { id, .. } if id == "m-1"),
        "{err:?}"
    );
    assert!(err.to_string().contains("planned twice"), "{err}");
    assert_eq!(store.get_migration("m-1").await.unwrap(), None);
    assert!(store.migration_items("m-1").await.unwrap().is_empty());
    // Nothing half-written stands in the way of the corrected plan.
    store
        .begin_migration(&migration("m-1", "digest-1"), &[migration_item("a", None)])
        .await
        .unwrap();
}

pub async fn a_migration_item_advances_only_from_the_state_it_is_in(backend: &dyn Backend) {
    let store = backend.open().await;
    store
        .begin_migration(
            &migration("m-1", "digest-1"),
            &[migration_item("a", None), migration_item("b", None)],
        )
        .await
        .unwrap();
    let step = |key: &'static str, from: ItemState, to: ItemState| {
        let store = Arc::clone(&store);
        async move {
            store
                .advance_migration_item("m-1", key, from, to, ItemUpdate::default())
                .await
                .unwrap()
        }
    };

    assert!(step("a", ItemState::Planned, ItemState::Copied).await);
    assert!(
        !step("a", ItemState::Planned, ItemState::Copied).await,
        "a step already taken is not taken again"
    );
    assert!(
        !step("a", ItemState::Verified, ItemState::Switched).await,
        "a step from a state the item is not in"
    );
    assert!(step("a", ItemState::Copied, ItemState::Verified).await);
    assert!(!step("nope", ItemState::Planned, ItemState::Copied).await);
    assert!(!store
        .advance_migration_item(
            "m-unknown",
            "a",
            ItemState::Planned,
            ItemState::Copied,
            ItemUpdate::default()
        )
        .await
        .unwrap());

    assert_eq!(
        item_states(&*store, "m-1").await,
        [
            ("a".to_owned(), ItemState::Verified),
            ("b".to_owned(), ItemState::Planned)
        ]
    );
}

pub async fn the_workdir_given_with_a_step_is_recorded_with_it_and_a_refused_step_records_none(
    backend: &dyn Backend,
) {
    let store = backend.open().await;
    let alice = uid("alice");
    store
        .begin_migration(
            &migration("m-1", "digest-1"),
            &[
                migration_item("a", Some("alice")),
                migration_item("b", Some("alice")),
            ],
        )
        .await
        .unwrap();
    for (from, to) in [
        (ItemState::Planned, ItemState::Copied),
        (ItemState::Copied, ItemState::Verified),
    ] {
        for key in ["a", "b"] {
            assert!(store
                .advance_migration_item("m-1", key, from, to, ItemUpdate::default())
                .await
                .unwrap());
        }
    }

    // A step from the wrong state fails: neither it nor its workdir is written.
    let refused = workdir("projects/refused");
    assert!(!store
        .advance_migration_item(
            "m-1",
            "a",
            ItemState::Copied,
            ItemState::Switched,
            ItemUpdate {
                manifest: Some("f".repeat(64).as_str()),
                workdir: Some((&alice, &refused)),
                ..ItemUpdate::default()
            },
        )
        .await
        .unwrap());
    assert!(store.list_workdirs(&alice).await.unwrap().is_empty());
    assert_eq!(
        store.migration_items("m-1").await.unwrap()[0].manifest,
        None
    );

    // The switch records the workdir with it.
    let a = workdir("projects/a");
    assert!(store
        .advance_migration_item(
            "m-1",
            "a",
            ItemState::Verified,
            ItemState::Switched,
            ItemUpdate {
                workdir: Some((&alice, &a)),
                ..ItemUpdate::default()
            },
        )
        .await
        .unwrap());
    let listed = store.list_workdirs(&alice).await.unwrap();
    assert_eq!(listed.iter().map(|w| &w.workdir).collect::<Vec<_>>(), [&a]);

    // Idempotent, as record_workdir is: a workdir already recorded does not fail the step.
    let b = workdir("projects/b");
    assert!(store.record_workdir(&alice, &b).await.unwrap());
    assert!(store
        .advance_migration_item(
            "m-1",
            "b",
            ItemState::Verified,
            ItemState::Switched,
            ItemUpdate {
                workdir: Some((&alice, &b)),
                ..ItemUpdate::default()
            },
        )
        .await
        .unwrap());
    let listed: Vec<_> = store
        .list_workdirs(&alice)
        .await
        .unwrap()
        .into_iter()
        .map(|w| w.workdir)
        .collect();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(listed.contains(&a) && listed.contains(&b), "{listed:?}");
    assert_eq!(
        item_states(&*store, "m-1").await,
        [
            ("a".to_owned(), ItemState::Switched),
            ("b".to_owned(), ItemState::Switched)
        ]
    );
}

pub async fn migration_items_come_back_ordered_by_key_with_what_each_step_wrote(
    backend: &dyn Backend,
) {
    let store = backend.open().await;
    // Keys compare bytewise on every store: upper case sorts before lower case.
    let planned = [
        migration_item("threads/b", Some("bob")),
        migration_item("uploads/z", None),
        migration_item("Threads/A", Some("alice")),
        migration_item("threads/a", Some("alice")),
    ];
    store
        .begin_migration(&migration("m-1", "digest-1"), &planned)
        .await
        .unwrap();
    let manifest_a = "a".repeat(64);
    let manifest_b = "b".repeat(64);
    assert!(store
        .advance_migration_item(
            "m-1",
            "threads/a",
            ItemState::Planned,
            ItemState::Copied,
            ItemUpdate {
                manifest: Some(&manifest_a),
                files: Some(3),
                bytes: Some(4096),
                workdir: None,
            },
        )
        .await
        .unwrap());
    // A step that writes nothing else keeps what the item holds.
    assert!(store
        .advance_migration_item(
            "m-1",
            "threads/a",
            ItemState::Copied,
            ItemState::Verified,
            ItemUpdate::default(),
        )
        .await
        .unwrap());
    // Counts beyond 32 bits.
    assert!(store
        .advance_migration_item(
            "m-1",
            "threads/b",
            ItemState::Planned,
            ItemState::Copied,
            ItemUpdate {
                manifest: Some(&manifest_b),
                files: Some(70_000),
                bytes: Some(5_000_000_000),
                workdir: None,
            },
        )
        .await
        .unwrap());
    // One field at a time.
    assert!(store
        .advance_migration_item(
            "m-1",
            "threads/b",
            ItemState::Copied,
            ItemState::Verified,
            ItemUpdate {
                bytes: Some(5_000_000_001),
                ..ItemUpdate::default()
            },
        )
        .await
        .unwrap());

    let items = store.migration_items("m-1").await.unwrap();

    let keys: Vec<&str> = items.iter().map(|item| item.key.as_str()).collect();
    assert_eq!(keys, ["Threads/A", "threads/a", "threads/b", "uploads/z"]);
    let summary: Vec<_> = items
        .iter()
        .map(|item| (item.state, item.manifest.as_deref(), item.files, item.bytes))
        .collect();
    assert_eq!(
        summary,
        [
            (ItemState::Planned, None, 0, 0),
            (ItemState::Verified, Some(manifest_a.as_str()), 3, 4096),
            (
                ItemState::Verified,
                Some(manifest_b.as_str()),
                70_000,
                5_000_000_001
            ),
            (ItemState::Planned, None, 0, 0),
        ]
    );
    for item in &items {
        let new = planned
            .iter()
            .find(|new| new.key == item.key)
            .expect("a planned item");
        assert_eq!(item.migration_id, "m-1");
        assert_eq!(
            (&item.kind, &item.source, &item.uid, &item.target),
            (&new.kind, &new.source, &new.uid, &new.target)
        );
    }
    assert!(store.migration_items("m-unknown").await.unwrap().is_empty());
}

pub async fn the_state_of_a_migration_is_compare_and_set(backend: &dyn Backend) {
    let store = backend.open().await;
    let begun = store
        .begin_migration(&migration("m-1", "digest-1"), &[])
        .await
        .unwrap();
    next_millisecond().await;

    assert!(!store
        .set_migration_state("m-1", MigrationState::Committed, MigrationState::Cleaned)
        .await
        .unwrap());
    assert!(store
        .set_migration_state("m-1", MigrationState::Planned, MigrationState::Committed)
        .await
        .unwrap());
    assert!(
        !store
            .set_migration_state("m-1", MigrationState::Planned, MigrationState::Committed)
            .await
            .unwrap(),
        "a state already left"
    );
    assert!(!store
        .set_migration_state(
            "m-unknown",
            MigrationState::Planned,
            MigrationState::Committed
        )
        .await
        .unwrap());

    let committed = store.get_migration("m-1").await.unwrap().unwrap();
    assert_eq!(committed.state, MigrationState::Committed);
    assert_eq!(committed.created_at, begun.created_at);
    assert!(committed.updated_at > begun.updated_at);
    assert!(store
        .set_migration_state("m-1", MigrationState::Committed, MigrationState::Cleaned)
        .await
        .unwrap());
    assert_eq!(
        store.get_migration("m-1").await.unwrap().unwrap().state,
        MigrationState::Cleaned
    );
}

pub async fn migrations_are_listed_oldest_first(backend: &dyn Backend) {
    let store = backend.open().await;
    assert!(store.list_migrations().await.unwrap().is_empty());
    for id in ["m-b", "m-c", "m-a"] {
        store
            .begin_migration(&migration(id, "digest"), &[])
            .await
            .unwrap();
        next_millisecond().await;
    }
    let ids: Vec<String> = store
        .list_migrations()
        .await
        .unwrap()
        .into_iter()
        .map(|record| record.id)
        .collect();
    assert_eq!(ids, ["m-b", "m-c", "m-a"]);
}

pub async fn concurrent_steps_of_one_item_let_exactly_one_win_and_record_only_its_workdir(
    backend: &dyn Backend,
) {
    let setup = backend.open().await;
    setup
        .begin_migration(
            &migration("m-1", "digest-1"),
            &[migration_item("a", Some("alice"))],
        )
        .await
        .unwrap();
    let mut steps = Vec::new();
    for task in 0..20 {
        let store = if backend.is_shared() && task % 2 == 0 {
            backend.open().await
        } else {
            Arc::clone(&setup)
        };
        steps.push(tokio::spawn(async move {
            let alice = uid("alice");
            let workdir = workdir(&format!("projects/racer-{task}"));
            let won = store
                .advance_migration_item(
                    "m-1",
                    "a",
                    ItemState::Planned,
                    ItemState::Copied,
                    ItemUpdate {
                        workdir: Some((&alice, &workdir)),
                        ..ItemUpdate::default()
                    },
                )
                .await
                .unwrap();
            (won, workdir)
        }));
    }
    let mut winners = Vec::new();
    for step in steps {
        let (won, workdir) = step.await.unwrap();
        if won {
            winners.push(workdir);
        }
    }
    assert_eq!(winners.len(), 1, "{winners:?}");
    let recorded: Vec<_> = setup
        .list_workdirs(&uid("alice"))
        .await
        .unwrap()
        .into_iter()
        .map(|w| w.workdir)
        .collect();
    assert_eq!(recorded, winners, "only the winning step's workdir");
}
