//! Wire types of a uid's workdirs: their creation and first files, storage usage and
//! Viewer links.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::strict;

/// `GET /v1/users/{uid}/usage`: a uid's workspace storage against its quota (I23), from the
/// kernel's accounting of the uid's own filesystem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WorkspaceUsage {
    /// The uid.
    pub uid: String,
    /// `off`, `volumes` or `unenforced` (see [`Health::quotas`](crate::Health::quotas)).
    pub enforcement: String,
    /// Bytes (the filesystem's metadata included).
    pub bytes: UsageFigure,
    /// Inodes: files, directories and links.
    pub inodes: UsageFigure,
}

/// One quantity of [`WorkspaceUsage`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct UsageFigure {
    /// In use; `null` where the kernel does not account for the workspace on its own.
    pub used: Option<u64>,
    /// The limit; `null` without a quota.
    pub limit: Option<u64>,
}

/// `POST /v1/users/{uid}/workdirs`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateWorkdir {
    /// Relative workdir, e.g. `projects/x`; default `projects/<uuid>` (I8).
    #[serde(default)]
    pub path: Option<String>,
    /// Fill the (new or empty) workdir from these sources (I32); 409 `workdir_not_empty`
    /// otherwise, so no file is ever overwritten.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "strict::object"
    )]
    pub init: Option<InitSpec>,
}

/// Where a workdir's first files come from; any combination, applied in the order
/// host_dir, git, files.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InitSpec {
    /// The name of a host directory the operator allowed (`[init] host_dirs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_dir: Option<String>,
    /// A git repository cloned whole and checked out at `rev`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "strict::object"
    )]
    pub git: Option<GitSpec>,
    /// Files by workdir-relative path, with their text.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, String>,
}

/// A git repository and revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GitSpec {
    /// `https://`, `http://`, `ssh://` or `git://` (`file://` only inside an allowed host
    /// directory).
    pub url: String,
    /// A branch, tag or commit; default: the remote's default branch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rev: Option<String>,
}

/// A workdir of a user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WorkdirInfo {
    /// Relative workdir inside the UserWorkspace.
    pub workdir: String,
    /// The same directory as a virtual path.
    pub path: String,
    /// When warren recorded it (RFC 3339).
    pub created_at: String,
    /// What initialisation put in, when `init` was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialized: Option<InitSummary>,
}

/// `GET /v1/users/{uid}/workdirs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WorkdirList {
    /// The workdirs, oldest first.
    pub workdirs: Vec<WorkdirInfo>,
}

/// `POST /v1/viewer-links`: a link that opens the Viewer on one workdir of one uid.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateViewerLink {
    /// The workspace owner.
    pub uid: String,
    /// The workdir the link opens (it must exist); nothing outside it is reachable.
    pub workdir: String,
    /// Seconds the link (and the session it opens) lives: 1 to 604800, default 3600.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "strict::whole_number"
    )]
    pub ttl_s: Option<u64>,
}

/// A signed Viewer link.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ViewerLink {
    /// Path of the link on this server (`/viewer/open?t=…`); prefix the server's address.
    /// It carries a signed grant, never the provisioner token.
    pub url: String,
    /// RFC 3339.
    pub expires_at: String,
}

/// What a workdir initialisation put in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct InitSummary {
    /// Regular files written.
    pub files: u64,
    /// Bytes written.
    pub bytes: u64,
}
