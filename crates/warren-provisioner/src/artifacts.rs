//! Artifacts (I26): files an agent presents as results, from its workdir's `outputs/`.
//!
//! Presenting copies the bytes, read by file descriptor like every file operation (I2),
//! into the uid's content-addressed artifact store (`<data>/artifacts/<safe uid>/<sha256>`),
//! outside every runtime's view. An artifact therefore stays readable and unchanged after
//! its runtime is reclaimed, its scratch tree removed, or its file edited.

use sha2::{Digest, Sha256};
use warren_core::{DataLayout, SandboxId, VirtualPath, VirtualRoot};
use warren_fs::{ByteRange, FsError, ReadResult, WorkspaceRoot, WriteOptions};
use warren_store::Artifact;

use crate::{Provisioner, ProvisionerError};

/// Most files one `present_files` call registers.
pub const MAX_PRESENTED_FILES: usize = 100;

impl Provisioner {
    /// Registers files under the workdir's `outputs/` as artifacts. Every path is checked
    /// before any is copied, so a bad path registers nothing.
    pub async fn present_files(
        &self,
        id: &SandboxId,
        inputs: &[String],
    ) -> Result<Vec<Artifact>, ProvisionerError> {
        if inputs.is_empty() || inputs.len() > MAX_PRESENTED_FILES {
            return Err(ProvisionerError::BadRequest(
                "present between 1 and 100 files at once",
            ));
        }
        let record = self.sandbox(id).await?;
        let outputs = format!("{}/outputs/", record.binding.workdir);
        let layout = record.binding.layout.layout();
        let mut paths = Vec::with_capacity(inputs.len());
        for input in inputs {
            let path = VirtualPath::parse(
                input,
                layout,
                &record.binding.extra_mounts,
                &record.binding.workdir,
            )?;
            if path.root() != VirtualRoot::UserData
                || !path.is_writable()
                || !path.relative().starts_with(&outputs)
            {
                return Err(ProvisionerError::NotInOutputs {
                    path: path.to_string(),
                    outputs: format!("{}/outputs/", layout.workdir_path(&record.binding.workdir)),
                });
            }
            paths.push(path);
        }
        let mut artifacts = Vec::with_capacity(paths.len());
        for path in paths {
            let read = self
                .read(id, &path.to_string(), ByteRange::FULL)
                .await?
                .value;
            if read.total_size > read.bytes.len() as u64 {
                return Err(ProvisionerError::ArtifactTooLarge {
                    path: path.to_string(),
                    size: read.total_size,
                    max: self.config.read_cap,
                });
            }
            let sha256 = hex::encode(Sha256::digest(&read.bytes));
            self.store_blob(&record.uid.safe(), &sha256, read.bytes)
                .await?;
            let artifact = self
                .store
                .record_artifact(&Artifact {
                    id: format!("art-{}", uuid::Uuid::new_v4().simple()),
                    sandbox_id: id.clone(),
                    uid: record.uid.clone(),
                    path: path.to_string(),
                    size: read.total_size,
                    sha256,
                    media_type: media_type(path.relative()).to_owned(),
                    created_at: chrono::Utc::now(),
                })
                .await?;
            tracing::info!(sandbox = %id, artifact = %artifact.id, path = %artifact.path, size = artifact.size, "artifact presented");
            artifacts.push(artifact);
        }
        Ok(artifacts)
    }

    /// The artifacts of a sandbox, oldest first.
    pub async fn list_artifacts(&self, id: &SandboxId) -> Result<Vec<Artifact>, ProvisionerError> {
        self.sandbox(id).await?;
        Ok(self.store.list_artifacts(id).await?)
    }

    /// An artifact and its bytes (or a range of them).
    pub async fn read_artifact(
        &self,
        id: &SandboxId,
        artifact_id: &str,
        range: ByteRange,
    ) -> Result<(Artifact, ReadResult), ProvisionerError> {
        self.sandbox(id).await?;
        let artifact = self
            .store
            .get_artifact(id, artifact_id)
            .await?
            .ok_or_else(|| ProvisionerError::ArtifactNotFound {
                artifact: artifact_id.chars().take(100).collect(),
            })?;
        let read = self.read_blob(&artifact, range).await?;
        Ok((artifact, read))
    }

    /// The artifacts presented from `workdir` of `uid`, by any of its sandboxes (the
    /// Viewer's list), oldest first.
    pub async fn workdir_artifacts(
        &self,
        uid: &warren_core::Uid,
        workdir: &warren_core::Workdir,
    ) -> Result<Vec<Artifact>, ProvisionerError> {
        // An artifact's path is in the form its sandbox's layout shows: the workdir of
        // another layout (DeerFlow's `/mnt/user-data`) names no workdir by itself, so
        // those count when their sandbox is bound to this workdir.
        let prefix = format!("{}/", warren_core::Layout::ARS.workdir_path(workdir));
        let other_layouts: std::collections::HashMap<_, _> = self
            .store
            .list_sandboxes(Some(uid))
            .await?
            .into_iter()
            .filter(|sandbox| sandbox.binding.layout != warren_core::LayoutName::Ars)
            .filter(|sandbox| &sandbox.binding.workdir == workdir)
            .map(|sandbox| {
                let prefix = format!("{}/", sandbox.binding.layout.layout().workdir_path(workdir));
                (sandbox.id, prefix)
            })
            .collect();
        Ok(self
            .store
            .list_artifacts_of_uid(uid)
            .await?
            .into_iter()
            .filter(|artifact| match other_layouts.get(&artifact.sandbox_id) {
                Some(prefix) => artifact.path.starts_with(prefix.as_str()),
                None => artifact.path.starts_with(&prefix),
            })
            .collect())
    }

    /// One artifact of `workdir` of `uid` and its bytes; any other is not found.
    pub async fn read_workdir_artifact(
        &self,
        uid: &warren_core::Uid,
        workdir: &warren_core::Workdir,
        artifact_id: &str,
    ) -> Result<(Artifact, ReadResult), ProvisionerError> {
        let artifact = self
            .workdir_artifacts(uid, workdir)
            .await?
            .into_iter()
            .find(|artifact| artifact.id == artifact_id)
            .ok_or_else(|| ProvisionerError::ArtifactNotFound {
                artifact: artifact_id.chars().take(100).collect(),
            })?;
        let read = self.read_blob(&artifact, ByteRange::FULL).await?;
        Ok((artifact, read))
    }

    async fn read_blob(
        &self,
        artifact: &Artifact,
        range: ByteRange,
    ) -> Result<ReadResult, ProvisionerError> {
        let blobs = self
            .layout()
            .workspace_dir()
            .join(DataLayout::artifacts_relative(&artifact.uid.safe()));
        let sha256 = artifact.sha256.clone();
        let cap = self.config.read_cap;
        self.blocking(move || {
            WorkspaceRoot::open(&blobs)
                .map(WorkspaceRoot::read_only)
                .and_then(|root| root.read(&sha256, range, cap))
                .map_err(|source| ProvisionerError::File {
                    path: "the artifact store".to_owned(),
                    source,
                })
        })
        .await
    }

    /// Writes `bytes` as `<sha256>` into the uid's artifact store unless it is there.
    async fn store_blob(
        &self,
        uid: &warren_core::SafeUid,
        sha256: &str,
        bytes: Vec<u8>,
    ) -> Result<(), ProvisionerError> {
        let data_dir = self.layout().workspace_dir().to_owned();
        let relative = DataLayout::artifacts_relative(uid);
        let name = sha256.to_owned();
        let store_error = |source| ProvisionerError::File {
            path: "the artifact store".to_owned(),
            source,
        };
        self.blocking(move || {
            // The store is the provisioner's own, owned by it, never mounted anywhere.
            WorkspaceRoot::open(&data_dir)
                .map(|root| root.with_owner(None))
                .and_then(|root| root.mkdir_p(&relative))
                .map_err(store_error)?;
            let blobs = WorkspaceRoot::open(&data_dir.join(&relative))
                .map_err(store_error)?
                .with_owner(None);
            let options = WriteOptions {
                if_none_match_any: true,
                ..WriteOptions::default()
            };
            match blobs.write(&name, &bytes, options) {
                // Same name, same content: the blob is there already.
                Ok(_) | Err(FsError::PreconditionFailed { .. }) => Ok(()),
                Err(source) => Err(store_error(source)),
            }
        })
        .await
    }
}

/// The media type of a file, from its name. Unknown kinds are served as bytes.
pub fn media_type(name: &str) -> &'static str {
    let extension = name
        .rsplit_once('.')
        .map(|(_, extension)| extension.to_ascii_lowercase())
        .unwrap_or_default();
    match extension.as_str() {
        "html" | "htm" => "text/html",
        "xhtml" | "xht" => "application/xhtml+xml",
        "svg" | "svgz" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "pdf" => "application/pdf",
        "md" | "markdown" => "text/markdown",
        "txt" | "log" => "text/plain",
        "csv" => "text/csv",
        "json" => "application/json",
        "xml" => "application/xml",
        "zip" => "application/zip",
        "gz" | "tgz" => "application/gzip",
        "tar" => "application/x-tar",
        "py" | "rs" | "js" | "ts" | "sh" | "toml" | "yaml" | "yml" => "text/plain",
        _ => "application/octet-stream",
    }
}

/// Whether a browser would run code from this media type if it rendered it inline: such
/// artifacts are only ever served as attachments (I26).
pub fn is_active_content(media_type: &str) -> bool {
    matches!(
        media_type,
        "text/html" | "application/xhtml+xml" | "image/svg+xml" | "application/xml"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_types_come_from_the_extension_whatever_its_case() {
        assert_eq!(media_type("outputs/page.HTML"), "text/html");
        assert_eq!(media_type("outputs/logo.svg"), "image/svg+xml");
        assert_eq!(media_type("outputs/archive"), "application/octet-stream");
        assert_eq!(media_type("outputs/.hidden"), "application/octet-stream");
    }

    #[test]
    fn markup_a_browser_would_run_is_active_content() {
        for kind in ["text/html", "application/xhtml+xml", "image/svg+xml"] {
            assert!(is_active_content(kind), "{kind}");
        }
        assert!(!is_active_content("image/png"));
        assert!(!is_active_content("text/plain"));
    }
}
