//! The skill projection of a uid (I7, I32): the read-only tree mounted at
//! `/home/gem/skills`, built from the operator's built-in and shared skill directories
//! plus the catalog skills granted to that uid (later sources win on a name clash).
//!
//! A build is incremental: a file whose content hash equals the current projection's is
//! hard-linked, not copied; what no source has any more is gone from the new tree. The new
//! tree is built beside the current one and switched in with one `RENAME_EXCHANGE`, so no
//! runtime ever sees a half-built projection. A running runtime keeps the complete tree it
//! mounted (the replaced one is retired, not deleted, until no runtime of the uid runs);
//! runtimes started afterwards see the new one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use warren_core::Uid;
use warren_fs::{ByteRange, FsError, Kind, WorkspaceRoot};
use warren_store::SandboxState;

use crate::{Provisioner, ProvisionerError};

/// Largest skill file a projection takes.
const MAX_SKILL_FILE: u64 = 64 * 1024 * 1024;
/// Where replaced projections wait until no runtime uses them.
const RETIRED: &str = ".retired";

/// The operator's skill directories; each holds one directory per skill.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SkillSources {
    /// Skills every uid gets, shipped with the deployment.
    pub builtin: Option<PathBuf>,
    /// Skills every uid gets, maintained by the operator.
    pub shared: Option<PathBuf>,
    /// Skills a uid gets only when granted.
    pub catalog: Option<PathBuf>,
}

/// What a projection build did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SkillSyncReport {
    /// The skills now in the projection.
    pub skills: Vec<String>,
    /// Files copied because they are new or changed.
    pub files_copied: u64,
    /// Files reused unchanged (hard-linked from the current projection).
    pub files_reused: u64,
    /// Files of the current projection no source has any more.
    pub files_removed: u64,
    /// Granted skills the catalog does not have.
    pub missing: Vec<String>,
    /// Whether a new projection was switched in (false when nothing changed).
    pub switched: bool,
}

/// Checks a skill name: a plain directory name, lowercase, at most 64 bytes.
pub fn check_skill_name(name: &str) -> Result<(), ProvisionerError> {
    let plain = !name.is_empty()
        && name.len() <= 64
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
    if plain {
        Ok(())
    } else {
        Err(ProvisionerError::BadRequest(
            "a skill name is 1 to 64 of a-z, 0-9, '.', '_', '-', starting with a letter or digit",
        ))
    }
}

impl Provisioner {
    /// The skills granted to `uid`.
    pub async fn granted_skills(&self, uid: &Uid) -> Result<Vec<String>, ProvisionerError> {
        Ok(self.store.granted_skills(uid).await?)
    }

    /// Grants a catalog skill and rebuilds the projection.
    pub async fn grant_skill(
        &self,
        uid: &Uid,
        slug: &str,
    ) -> Result<SkillSyncReport, ProvisionerError> {
        check_skill_name(slug)?;
        self.store.grant_skill(uid, slug).await?;
        self.sync_skills(uid).await
    }

    /// Revokes a granted skill and rebuilds the projection.
    pub async fn revoke_skill(
        &self,
        uid: &Uid,
        slug: &str,
    ) -> Result<SkillSyncReport, ProvisionerError> {
        check_skill_name(slug)?;
        if !self.store.revoke_skill(uid, slug).await? {
            return Err(ProvisionerError::SkillNotGranted {
                skill: slug.to_owned(),
            });
        }
        self.sync_skills(uid).await
    }

    /// Rebuilds the uid's projection from the sources and the grants.
    pub async fn sync_skills(&self, uid: &Uid) -> Result<SkillSyncReport, ProvisionerError> {
        let granted = self.store.granted_skills(uid).await?;
        let sources = self.config.skill_sources.clone();
        let projections = self.layout().workspace_dir().join("skill-projections");
        let name = uid.safe().as_str().to_owned();
        let data_dir = self.layout().workspace_dir().to_owned();
        // One build at a time per uid: two would race for the switch.
        let lock = self.skills_lock(uid);
        let _guard = lock.lock().await;
        let report = self
            .blocking(move || {
                WorkspaceRoot::open(&data_dir)
                    .map(|root| root.with_owner(None))
                    .and_then(|root| root.mkdir_p("skill-projections"))
                    .map_err(|source| skills_error("the skill projections", source))?;
                build(&sources, &granted, &projections, &name)
            })
            .await?;
        if report.switched {
            tracing::info!(%uid, skills = report.skills.len(), copied = report.files_copied, reused = report.files_reused, removed = report.files_removed, "skill projection switched");
        }
        self.reclaim_retired_projections(uid).await?;
        Ok(report)
    }

    /// Deletes the uid's retired projections once no runtime of the uid runs (a running
    /// one may still have one mounted).
    pub(crate) async fn reclaim_retired_projections(
        &self,
        uid: &Uid,
    ) -> Result<(), ProvisionerError> {
        let running = self
            .store
            .list_sandboxes(Some(uid))
            .await?
            .iter()
            .any(|record| {
                matches!(
                    record.state,
                    SandboxState::Running | SandboxState::Terminating
                )
            });
        if running {
            return Ok(());
        }
        let retired = self
            .layout()
            .workspace_dir()
            .join("skill-projections")
            .join(RETIRED);
        let owner = uid.safe().as_str().to_owned();
        self.blocking(move || {
            let Ok(root) = WorkspaceRoot::open(&retired) else {
                return Ok(());
            };
            let root = root.with_owner(None);
            let listing = root
                .list("", 1, 100_000)
                .map_err(|source| skills_error("the retired projections", source))?;
            // `<safe uid>.<uuid>`, matched whole: "alice" must not take "alice.smith"'s.
            let of_owner = |path: &str| path.rsplit_once('.').is_some_and(|(o, _)| o == owner);
            for entry in listing.entries.iter().filter(|e| of_owner(&e.path)) {
                root.remove(&entry.path, true)
                    .map_err(|source| skills_error("a retired projection", source))?;
            }
            Ok(())
        })
        .await
    }

    /// At start-up: every retired projection whose uid runs no runtime goes.
    pub(crate) async fn reclaim_all_retired_projections(&self) -> Result<(), ProvisionerError> {
        let in_use: BTreeSet<String> = self
            .store
            .list_sandboxes(None)
            .await?
            .iter()
            .filter(|record| {
                matches!(
                    record.state,
                    SandboxState::Running | SandboxState::Terminating
                )
            })
            .map(|record| record.uid.safe().as_str().to_owned())
            .collect();
        let retired = self
            .layout()
            .workspace_dir()
            .join("skill-projections")
            .join(RETIRED);
        self.blocking(move || {
            let Ok(root) = WorkspaceRoot::open(&retired) else {
                return Ok(());
            };
            let root = root.with_owner(None);
            let listing = root
                .list("", 1, 100_000)
                .map_err(|source| skills_error("the retired projections", source))?;
            for entry in listing.entries {
                // `<safe uid>.<uuid>`: a safe uid may itself contain dots.
                let owner = entry.path.rsplit_once('.').map_or("", |(owner, _)| owner);
                if !in_use.contains(owner) {
                    root.remove(&entry.path, true)
                        .map_err(|source| skills_error("a retired projection", source))?;
                }
            }
            Ok(())
        })
        .await
    }

    fn skills_lock(&self, uid: &Uid) -> std::sync::Arc<tokio::sync::Mutex<()>> {
        // Keyed apart from sandbox ids: "skills:" cannot start a sandbox id.
        let key = warren_core::SandboxId::derive(
            uid,
            &warren_core::RuntimeScope::new("skills:projection").expect("a valid scope"),
        );
        self.lifecycle_lock(&key)
    }
}

/// One file of the projection to be: where its bytes come from.
struct Planned {
    source: PathBuf,
    relative: String,
    kind: Kind,
    mode: u32,
    target: Option<String>,
}

/// Builds the projection `name` under `projections` and switches it in if it differs.
fn build(
    sources: &SkillSources,
    granted: &[String],
    projections: &std::path::Path,
    name: &str,
) -> Result<SkillSyncReport, ProvisionerError> {
    let mut report = SkillSyncReport::default();
    // Skill name → its directory, later sources winning.
    let mut chosen: BTreeMap<String, PathBuf> = BTreeMap::new();
    for dir in [&sources.builtin, &sources.shared].into_iter().flatten() {
        for slug in skill_dirs(dir)? {
            chosen.insert(slug.clone(), dir.join(&slug));
        }
    }
    for slug in granted {
        let found = sources
            .catalog
            .as_ref()
            .map(|catalog| catalog.join(slug))
            .filter(|dir| std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()));
        match found {
            Some(dir) => {
                chosen.insert(slug.clone(), dir);
            }
            None => report.missing.push(slug.clone()),
        }
    }
    // Everything the new projection holds, read through each skill's own root.
    let mut planned = Vec::new();
    for (slug, dir) in &chosen {
        let root = WorkspaceRoot::open(dir)
            .map_err(|source| skills_error(&format!("skill {slug}"), source))?
            .read_only();
        planned.push(Planned {
            source: dir.clone(),
            relative: slug.clone(),
            kind: Kind::Dir,
            mode: 0o755,
            target: None,
        });
        let listing = root
            .list("", warren_fs::MAX_WALK_DEPTH, 100_000)
            .map_err(|source| skills_error(&format!("skill {slug}"), source))?;
        if listing.truncated {
            // Half a skill is worse than none: refuse the build.
            return Err(skills_error(
                &format!("skill {slug}"),
                FsError::TooManyEntries {
                    path: slug.clone(),
                    limit: 100_000,
                },
            ));
        }
        for entry in listing.entries {
            planned.push(Planned {
                source: dir.join(&entry.path),
                relative: format!("{slug}/{}", entry.path),
                kind: entry.kind,
                mode: entry.mode & 0o555,
                target: entry.symlink_target,
            });
        }
    }
    report.skills = chosen.keys().cloned().collect();

    let parent = WorkspaceRoot::open(projections)
        .map_err(|source| skills_error("the skill projections", source))?
        .with_owner(None);
    let current_exists = parent.stat(name).is_ok();
    let current_files: BTreeSet<String> = if current_exists {
        parent
            .list(name, warren_fs::MAX_WALK_DEPTH, 1_000_000)
            .map_err(|source| skills_error("the current projection", source))?
            .entries
            .into_iter()
            .filter(|e| e.kind == Kind::File)
            .map(|e| e.path.trim_start_matches(&format!("{name}/")).to_owned())
            .collect()
    } else {
        BTreeSet::new()
    };
    let next = format!(".{name}.next-{}", uuid::Uuid::new_v4().simple());
    parent
        .mkdir_p(&next)
        .map_err(|source| skills_error("the new projection", source))?;
    let built = fill(&parent, name, &next, &planned, &current_files, &mut report);
    let changed = built.is_err()
        || report.files_copied > 0
        || report.files_removed > 0
        || !current_exists
        || tree_shape_changed(&parent, name, &next)?;
    if built.is_err() || !changed {
        let _ = parent.remove(&next, true);
        return built.map(|()| report);
    }
    if current_exists {
        parent
            .exchange(name, &next)
            .map_err(|source| skills_error("the projection switch", source))?;
        parent
            .mkdir_p(RETIRED)
            .map_err(|source| skills_error("the retired projections", source))?;
        let retired = format!("{RETIRED}/{name}.{}", uuid::Uuid::new_v4().simple());
        parent
            .rename(&next, &retired, false)
            .map_err(|source| skills_error("the retired projections", source))?;
    } else {
        parent
            .rename(&next, name, false)
            .map_err(|source| skills_error("the new projection", source))?;
    }
    report.switched = true;
    Ok(report)
}

/// The skill directories in `dir` (entries that are not plain directories, or whose name
/// is not a skill name, are ignored).
fn skill_dirs(dir: &std::path::Path) -> Result<Vec<String>, ProvisionerError> {
    let root =
        WorkspaceRoot::open(dir).map_err(|source| skills_error("a skill directory", source))?;
    Ok(root
        .list("", 1, 10_000)
        .map_err(|source| skills_error("a skill directory", source))?
        .entries
        .into_iter()
        .filter(|entry| entry.kind == Kind::Dir && check_skill_name(&entry.path).is_ok())
        .map(|entry| entry.path)
        .collect())
}

/// Writes the planned tree into `next`, reusing files of the current projection whose
/// content is the same.
fn fill(
    parent: &WorkspaceRoot,
    current: &str,
    next: &str,
    planned: &[Planned],
    current_files: &BTreeSet<String>,
    report: &mut SkillSyncReport,
) -> Result<(), ProvisionerError> {
    let mut kept = BTreeSet::new();
    for item in planned {
        let path = format!("{next}/{}", item.relative);
        match item.kind {
            Kind::Dir => {
                parent
                    .mkdir_p(&path)
                    .map_err(|source| skills_error(&item.relative, source))?;
            }
            Kind::Symlink => {
                parent
                    .create_symlink(&path, item.target.as_deref().unwrap_or_default())
                    .map_err(|source| skills_error(&item.relative, source))?;
            }
            Kind::File => {
                let dir = item.source.parent().unwrap_or(&item.source);
                let file_name = item
                    .source
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let source_root = WorkspaceRoot::open(dir)
                    .map_err(|source| skills_error(&item.relative, source))?
                    .read_only();
                let read = source_root
                    .read(&file_name, ByteRange::FULL, MAX_SKILL_FILE)
                    .map_err(|source| skills_error(&item.relative, source))?;
                if read.total_size > read.bytes.len() as u64 {
                    return Err(ProvisionerError::BadRequest(
                        "a skill file is larger than 64 MiB",
                    ));
                }
                let current_path = format!("{current}/{}", item.relative);
                let same = current_files.contains(&item.relative)
                    && parent
                        .etag(&current_path)
                        .is_ok_and(|etag| etag == read.etag);
                if same {
                    parent
                        .create_hardlink(&current_path, &path)
                        .map_err(|source| skills_error(&item.relative, source))?;
                    report.files_reused += 1;
                } else {
                    use std::io::Write;
                    let mut file = parent
                        .create_file(&path, 0o444)
                        .map_err(|source| skills_error(&item.relative, source))?;
                    file.write_all(&read.bytes)
                        .map_err(|e| ProvisionerError::File {
                            path: item.relative.clone(),
                            source: FsError::Write {
                                path: item.relative.clone(),
                                errno: e,
                            },
                        })?;
                    report.files_copied += 1;
                }
                kept.insert(item.relative.clone());
                parent
                    .set_attributes(&path, Some(item.mode | 0o444), 0)
                    .map_err(|source| skills_error(&item.relative, source))?;
            }
            Kind::Other => {}
        }
    }
    report.files_removed = current_files.difference(&kept).count() as u64;
    Ok(())
}

/// Whether the directories or links differ between two trees (files were compared while
/// building).
fn tree_shape_changed(
    parent: &WorkspaceRoot,
    current: &str,
    next: &str,
) -> Result<bool, ProvisionerError> {
    let shape = |base: &str| -> Result<BTreeSet<(String, Option<String>)>, ProvisionerError> {
        Ok(parent
            .list(base, warren_fs::MAX_WALK_DEPTH, 1_000_000)
            .map_err(|source| skills_error("a projection", source))?
            .entries
            .into_iter()
            .filter(|e| e.kind != Kind::File)
            .map(|e| {
                (
                    e.path.trim_start_matches(&format!("{base}/")).to_owned(),
                    e.symlink_target,
                )
            })
            .collect())
    };
    Ok(shape(current)? != shape(next)?)
}

fn skills_error(what: &str, source: FsError) -> ProvisionerError {
    ProvisionerError::File {
        path: what.to_owned(),
        source,
    }
}
