//! Reading a pod back into its identity: its labels and annotations, its containers and
//! their mounts, each checked against what warren would have made.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, VolumeMount};
use warren_core::{LayoutName, NetworkPolicy, RuntimeScope, SandboxId, Uid, Workdir};

use super::mounts::{check_layout_mounts, read_sandbox_mounts, read_volumes};
use super::privileges::{check_container_privileges, check_pod_privileges, check_sandbox_env};
use super::PodIdentity;
use crate::manifests::PersistentMount;
use crate::names::*;
use crate::Error;

/// Reads a pod back, refusing anything warren would not have made (see the module).
pub fn read_pod(pod: &Pod, instance: &str) -> Result<PodIdentity, Error> {
    let meta = &pod.metadata;
    let empty = BTreeMap::new();
    let labels = meta.labels.as_ref().unwrap_or(&empty);
    let annotations = meta.annotations.as_ref().unwrap_or(&empty);
    let label = |key: &'static str| {
        labels
            .get(key)
            .map(String::as_str)
            .ok_or(Error::MissingMetadata(key))
    };
    let annotation = |key: &'static str| {
        annotations
            .get(key)
            .map(String::as_str)
            .ok_or(Error::MissingMetadata(key))
    };
    fn bad<E>(key: &'static str) -> impl Fn(E) -> Error {
        move |_| Error::BadMetadata(key)
    }

    let found = label(LABEL_INSTANCE)?;
    if found != instance {
        return Err(Error::ForeignInstance {
            found: found.to_owned(),
        });
    }
    if label(LABEL_MANAGED_BY)? != MANAGED_BY {
        return Err(Error::BadMetadata(LABEL_MANAGED_BY));
    }
    if label(LABEL_COMPONENT)? != COMPONENT_SANDBOX {
        return Err(Error::BadMetadata(LABEL_COMPONENT));
    }
    let sandbox = SandboxId::parse(label(LABEL_SANDBOX)?).map_err(bad(LABEL_SANDBOX))?;
    if meta.name.as_deref() != Some(object_name(instance, &sandbox).as_str()) {
        return Err(Error::BadMetadata("metadata.name"));
    }
    let uid = Uid::new(annotation(ANNOTATION_UID)?).map_err(bad(ANNOTATION_UID))?;
    let runtime_scope =
        RuntimeScope::new(annotation(ANNOTATION_SCOPE)?).map_err(bad(ANNOTATION_SCOPE))?;
    if SandboxId::derive(&uid, &runtime_scope) != sandbox {
        return Err(Error::BadMetadata(LABEL_SANDBOX));
    }
    let safe_uid = uid.safe();
    if annotation(ANNOTATION_SAFE_UID)? != safe_uid.as_str() {
        return Err(Error::BadMetadata(ANNOTATION_SAFE_UID));
    }
    let workdir = Workdir::new(annotation(ANNOTATION_WORKDIR)?).map_err(bad(ANNOTATION_WORKDIR))?;
    let generation: i64 = annotation(ANNOTATION_GENERATION)?
        .parse()
        .map_err(bad(ANNOTATION_GENERATION))?;
    let layout =
        LayoutName::parse(annotation(ANNOTATION_LAYOUT)?).map_err(bad(ANNOTATION_LAYOUT))?;
    let network: NetworkPolicy =
        serde_json::from_str::<NetworkPolicy>(annotation(ANNOTATION_NETWORK)?)
            .ok()
            .and_then(|network| network.validate().ok())
            .ok_or(Error::BadMetadata(ANNOTATION_NETWORK))?;
    let image = annotation(ANNOTATION_IMAGE)?.to_owned();
    let inherit_env = match annotations.get(ANNOTATION_INHERIT_ENV) {
        Some(value) => value.parse::<bool>().map_err(bad(ANNOTATION_INHERIT_ENV))?,
        None => true,
    };
    let mut recorded: Vec<PersistentMount> =
        serde_json::from_str(annotation(ANNOTATION_MOUNTS)?).map_err(bad(ANNOTATION_MOUNTS))?;

    let spec = pod.spec.as_ref().ok_or(Error::BadMetadata("spec"))?;
    check_pod_privileges(spec)?;
    let (user_data_claim, skills_claim) = read_volumes(spec, layout)?;

    let names = |containers: &[Container]| -> Vec<String> {
        containers.iter().map(|c| c.name.clone()).collect()
    };
    let inits = spec.init_containers.as_deref().unwrap_or_default();
    check_names(&names(inits), &[CONTAINER_PREPARE, CONTAINER_BUNDLE])?;
    check_names(&names(&spec.containers), &[CONTAINER_SANDBOX])?;
    if spec
        .ephemeral_containers
        .as_ref()
        .is_some_and(|e| !e.is_empty())
    {
        return Err(Error::UnexpectedContainer(
            "an ephemeral container".to_owned(),
        ));
    }
    let (prepare, bundle, sandbox_container) = (&inits[0], &inits[1], &spec.containers[0]);
    for container in [prepare, bundle, sandbox_container] {
        check_container_privileges(spec, container)?;
    }

    // The prepare container sees exactly this uid's subtree (and, where the layout needs
    // warren's accounts, the emptyDir it writes them into), the bundle container exactly
    // the bundle's emptyDir.
    let only = |container: &Container, want: &[VolumeMount]| -> Result<(), Error> {
        let mounts = container.volume_mounts.as_deref().unwrap_or_default();
        if mounts == want {
            return Ok(());
        }
        if let Some(one) = mounts.iter().find(|one| {
            want.iter()
                .any(|w| one.name == w.name && one.mount_path == w.mount_path && one != &w)
        }) {
            return Err(Error::ForeignSubPath {
                target: one.mount_path.clone(),
                sub_path: one.sub_path.clone().unwrap_or_default(),
            });
        }
        Err(Error::UnexpectedMount(format!(
            "{} in container {}",
            mounts
                .iter()
                .find(|m| !want.contains(m))
                .or_else(|| want.iter().find(|w| !mounts.contains(w)))
                .map_or("(order)", |m| m.mount_path.as_str()),
            container.name
        )))
    };
    let mut prepare_mounts = vec![VolumeMount {
        name: VOLUME_USER_DATA.to_owned(),
        mount_path: PREPARE_ROOT.to_owned(),
        sub_path: Some(user_data_subtree(&safe_uid)),
        ..VolumeMount::default()
    }];
    if crate::accounts::needed(layout.layout()) {
        prepare_mounts.push(VolumeMount {
            name: VOLUME_ACCOUNTS.to_owned(),
            mount_path: PREPARE_ACCOUNTS.to_owned(),
            ..VolumeMount::default()
        });
    }
    only(prepare, &prepare_mounts)?;
    only(
        bundle,
        &[VolumeMount {
            name: VOLUME_AGENT.to_owned(),
            mount_path: AGENT_MOUNT.to_owned(),
            ..VolumeMount::default()
        }],
    )?;

    if sandbox_container.image.as_deref() != Some(image.as_str()) {
        return Err(Error::BadMetadata(ANNOTATION_IMAGE));
    }
    check_sandbox_env(sandbox_container)?;
    let mut mounts = read_sandbox_mounts(sandbox_container, layout)?;
    let expected = PersistentMount::for_layout(layout, &safe_uid, &workdir);
    check_layout_mounts(&mounts, &expected)?;
    let by_target = |a: &PersistentMount, b: &PersistentMount| a.target.cmp(&b.target);
    mounts.sort_by(by_target);
    recorded.sort_by(by_target);
    if recorded != mounts {
        return Err(Error::BadMetadata(ANNOTATION_MOUNTS));
    }

    Ok(PodIdentity {
        instance: instance.to_owned(),
        sandbox,
        uid,
        runtime_scope,
        workdir,
        generation,
        layout,
        network,
        image,
        inherit_env,
        mounts: expected,
        user_data_claim,
        skills_claim,
    })
}

fn check_names(found: &[String], expected: &[&str]) -> Result<(), Error> {
    if let Some(extra) = found.iter().find(|name| !expected.contains(&name.as_str())) {
        return Err(Error::UnexpectedContainer(extra.clone()));
    }
    if found != expected {
        let missing = expected
            .iter()
            .find(|name| !found.iter().any(|f| f == *name))
            .copied()
            .unwrap_or("(order)");
        return Err(Error::UnexpectedContainer(missing.to_owned()));
    }
    Ok(())
}
