//! Driving one item from wherever the journal left it to committed: staging copy, verify,
//! switch into place, ownership and read-back.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use warren_core::Workdir;
use warren_fs::{FsError, Owner, WorkspaceRoot};
use warren_store::{ItemState, MigrationItem};

use super::{journal_manifest, occupancy, remove_if_present, Migrator, Occupancy, Target};
use crate::copy::copy_tree;
use crate::manifest::manifest_of;
use crate::plan::{describe_target, ItemKind};
use crate::MigrateError;

impl Migrator {
    /// Opens the tree an item goes to.
    async fn target(&self, item: &MigrationItem) -> Result<Target, MigrateError> {
        let kind = ItemKind::parse(&item.kind).ok_or_else(|| {
            MigrateError::Journal(format!("item {} has kind {:?}", item.key, item.kind))
        })?;
        let (dir, owner, subtree) = match (&item.uid, kind) {
            (Some(uid), ItemKind::Thread | ItemKind::PersonalSkill) => {
                let workspace = self.host.prepare_user_workspace(uid).await?;
                let subtree = workspace.parent().map(Path::to_owned);
                (workspace, Owner::WORKSPACE, subtree)
            }
            (None, ItemKind::SharedSkill) => {
                let dir = self.host.shared_skills_dir().ok_or_else(|| {
                    MigrateError::Config(
                        "the journal has shared skills to migrate but warren.toml sets no \
                         [skills] shared_dir any more"
                            .to_owned(),
                    )
                })?;
                // The operator's directory: what lands there is the directory owner's.
                let meta = std::fs::metadata(&dir)
                    .map_err(MigrateError::io("the shared skill directory"))?;
                let owner = Owner {
                    uid: std::os::unix::fs::MetadataExt::uid(&meta),
                    gid: std::os::unix::fs::MetadataExt::gid(&meta),
                };
                (dir, owner, None)
            }
            _ => {
                return Err(MigrateError::Journal(format!(
                    "item {} of kind {} has no target owner",
                    item.key, item.kind
                )))
            }
        };
        let root = WorkspaceRoot::open(&dir)
            .map_err(MigrateError::fs(format!("open the target of {}", item.key)))?
            .with_owner(Some(owner));
        let (parent, leaf) = match item.target.rsplit_once('/') {
            Some((parent, leaf)) => (format!("{parent}/"), leaf),
            None => (String::new(), item.target.as_str()),
        };
        let tag = &item.migration_id[item.migration_id.len().saturating_sub(8)..];
        Ok(Target {
            root,
            owner,
            path: OsString::from(&item.target),
            staging: OsString::from(format!("{parent}.{leaf}.warren-migrate-{tag}")),
            subtree,
        })
    }

    /// Takes one item from wherever the journal left it to committed.
    pub(super) async fn drive(
        &self,
        source: &WorkspaceRoot,
        mut item: MigrationItem,
        warnings: &mut Vec<String>,
        owned_subtrees: &mut HashSet<PathBuf>,
    ) -> Result<(), MigrateError> {
        if item.state >= ItemState::Committed {
            return Ok(());
        }
        let target = self.target(&item).await?;
        let shown = describe_target(item.uid.as_ref(), &item.target);
        let mut recopied = false;
        loop {
            match item.state {
                ItemState::Planned => {
                    let outcome = tokio::task::block_in_place(|| {
                        self.copy_item(source, &item, &target, &shown, warnings)
                    })?;
                    let (state, manifest, files, bytes) = outcome;
                    self.advance(&item, state, &manifest, files, bytes, None)
                        .await?;
                    self.step(if state == ItemState::Copied {
                        "copied"
                    } else {
                        "verified"
                    });
                    item = self.reload(&item).await?;
                }
                ItemState::Copied => {
                    let verified =
                        tokio::task::block_in_place(|| self.verify_staging(&item, &target))?;
                    if verified {
                        self.advance_to(&item, ItemState::Verified, None).await?;
                        self.step("verified");
                    } else if recopied {
                        let detail = tokio::task::block_in_place(|| {
                            first_difference(source, &item.source, &target.root, &target.staging)
                        });
                        return Err(MigrateError::VerifyFailed {
                            what: format!("the staged copy of {}", item.source),
                            detail,
                        });
                    } else {
                        // Torn by a crash, or changed: copy again from the untouched source.
                        recopied = true;
                        self.advance_to(&item, ItemState::Planned, None).await?;
                    }
                    item = self.reload(&item).await?;
                }
                ItemState::Verified => {
                    tokio::task::block_in_place(|| self.switch(&item, &target, &shown))?;
                    let workdir = match ItemKind::parse(&item.kind) {
                        Some(ItemKind::Thread) => {
                            Some(Workdir::new(item.target.clone()).map_err(|error| {
                                MigrateError::Journal(format!("target {}: {error}", item.target))
                            })?)
                        }
                        _ => None,
                    };
                    let uid = item.uid.clone();
                    let record = uid.as_ref().zip(workdir.as_ref());
                    self.advance_to(&item, ItemState::Switched, record).await?;
                    self.step("switched");
                    item = self.reload(&item).await?;
                }
                ItemState::Switched => {
                    if let Some(subtree) = &target.subtree {
                        if owned_subtrees.insert(subtree.clone()) {
                            tokio::task::block_in_place(|| migrate_ownership(subtree))?;
                        }
                    }
                    self.read_back(&item, &target).await?;
                    self.advance_to(&item, ItemState::Committed, None).await?;
                    self.step("committed");
                    return Ok(());
                }
                ItemState::Committed | ItemState::Cleaned => return Ok(()),
            }
        }
    }

    /// The planned step: a staging copy, or the recognition of a target that already
    /// holds exactly the source. Answers the state reached, the manifest digest, files and
    /// bytes.
    fn copy_item(
        &self,
        source: &WorkspaceRoot,
        item: &MigrationItem,
        target: &Target,
        shown: &str,
        warnings: &mut Vec<String>,
    ) -> Result<(ItemState, String, u64, u64), MigrateError> {
        if let Some((parent, _)) = item.target.rsplit_once('/') {
            target
                .root
                .mkdir_p(parent)
                .map_err(MigrateError::fs(format!("make {parent} for {shown}")))?;
        }
        remove_if_present(&target.root, &target.staging)?;
        match occupancy(&target.root, &target.path)? {
            Occupancy::Absent | Occupancy::EmptyDir => {}
            Occupancy::Occupied => {
                // Filled by an earlier migration of the same files, or by someone else.
                let theirs = manifest_of(&target.root, &target.path, None)?;
                let ours = manifest_of(source, OsStr::new(&item.source), None)?;
                if theirs.digest() != ours.digest() {
                    return Err(MigrateError::TargetConflict {
                        target: shown.to_owned(),
                        source_item: item.source.clone(),
                        detail: ours.first_difference(&theirs).map_or_else(
                            || "the trees differ".to_owned(),
                            |d| d.replace("the copy", "the target"),
                        ),
                    });
                }
                warnings.push(format!(
                    "{shown} already held exactly {}; recorded without copying",
                    item.source
                ));
                return Ok((ItemState::Verified, ours.digest(), ours.files, ours.bytes));
            }
        }
        let report = copy_tree(
            source,
            OsStr::new(&item.source),
            &target.root,
            &target.staging,
        )?;
        warnings.extend(
            report
                .warnings
                .iter()
                .map(|warning| format!("{}: {warning}", item.source)),
        );
        Ok((
            ItemState::Copied,
            report.manifest.digest(),
            report.manifest.files,
            report.manifest.bytes,
        ))
    }

    /// Whether the staging tree is exactly what the journal recorded of the source.
    fn verify_staging(&self, item: &MigrationItem, target: &Target) -> Result<bool, MigrateError> {
        let expected = journal_manifest(item)?;
        if let Occupancy::Absent = occupancy(&target.root, &target.staging)? {
            return Ok(false);
        }
        let staged = manifest_of(
            &target.root,
            &target.staging,
            Some((target.owner.uid, target.owner.gid)),
        );
        match staged {
            // `copy_tree` synced it: durable before the switch makes it the copy kept.
            Ok(staged) if staged.digest() == expected => Ok(true),
            Ok(_) | Err(MigrateError::VerifyFailed { .. }) => {
                remove_if_present(&target.root, &target.staging)?;
                Ok(false)
            }
            Err(error) => Err(error),
        }
    }

    /// Moves the staging tree into place in one rename. The kernel refuses to replace
    /// anything but an empty directory, so existing content is never overwritten.
    fn switch(
        &self,
        item: &MigrationItem,
        target: &Target,
        shown: &str,
    ) -> Result<(), MigrateError> {
        let expected = journal_manifest(item)?;
        match occupancy(&target.root, &target.staging)? {
            Occupancy::Absent => {
                // Renamed before a crash, or recognised in place: the target must be it.
                let found = manifest_of(&target.root, &target.path, None)?;
                if found.digest() != expected {
                    return Err(MigrateError::Journal(format!(
                        "{} is verified but its staging copy is gone and {shown} does not \
                         hold it",
                        item.source
                    )));
                }
                Ok(())
            }
            _ => match target.root.rename(&target.staging, &target.path, true) {
                // Durable before the journal says switched: a rerun after a power cut must
                // find the tree where the journal puts it.
                Ok(()) => target
                    .root
                    .sync_filesystem()
                    .map_err(MigrateError::fs(format!("sync {shown}"))),
                Err(FsError::DirectoryNotEmpty { .. } | FsError::NotADirectory { .. }) => {
                    Err(MigrateError::TargetConflict {
                        target: shown.to_owned(),
                        source_item: item.source.clone(),
                        detail: "it was filled while the copy was made".to_owned(),
                    })
                }
                Err(error) => Err(MigrateError::fs(format!("switch {shown}"))(error)),
            },
        }
    }

    /// Reads the journal and the workdir record back, and hashes the final tree.
    async fn read_back(&self, item: &MigrationItem, target: &Target) -> Result<(), MigrateError> {
        let stored = self.reload(item).await?;
        if stored.state != ItemState::Switched || stored.manifest != item.manifest {
            return Err(MigrateError::Journal(format!(
                "{} reads back as {:?} with manifest {:?}",
                item.key, stored.state, stored.manifest
            )));
        }
        if ItemKind::parse(&item.kind) == Some(ItemKind::Thread) {
            let uid = item.uid.as_ref().expect("a thread has a uid");
            let workdir = Workdir::new(item.target.clone())
                .map_err(|error| MigrateError::Journal(error.to_string()))?;
            if self.store.workdir(uid, &workdir).await?.is_none() {
                return Err(MigrateError::Journal(format!(
                    "the workdir {} of uid {uid} is not recorded after its switch",
                    item.target
                )));
            }
        }
        let expected = journal_manifest(item)?;
        let owner = (target.owner.uid, target.owner.gid);
        let found =
            tokio::task::block_in_place(|| manifest_of(&target.root, &target.path, Some(owner)))?;
        if found.digest() != expected {
            return Err(MigrateError::VerifyFailed {
                what: describe_target(item.uid.as_ref(), &item.target),
                detail: "its tree changed after the switch".to_owned(),
            });
        }
        Ok(())
    }
}

fn first_difference(
    source: &WorkspaceRoot,
    from: &str,
    root: &WorkspaceRoot,
    at: &OsStr,
) -> String {
    match (
        manifest_of(source, OsStr::new(from), None),
        manifest_of(root, at, None),
    ) {
        (Ok(ours), Ok(theirs)) => ours
            .first_difference(&theirs)
            .unwrap_or_else(|| "the trees differ in ownership".to_owned()),
        (Err(error), _) | (_, Err(error)) => error.to_string(),
    }
}

/// The one ownership routine warren has (warren-fs; the Kubernetes init container runs it
/// too): the uid's subtree becomes 1000:1000 once, its marker written (I11).
fn migrate_ownership(subtree: &Path) -> Result<(), MigrateError> {
    use rustix::fs::{openat, Mode, OFlags, CWD};
    let dir = openat(
        CWD,
        subtree,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| MigrateError::io("open the uid's subtree")(errno.into()))?;
    warren_fs::migrate_subtree_once(dir.as_fd()).map_err(MigrateError::fs(
        "migrate the ownership of the uid's subtree",
    ))?;
    Ok(())
}
