//! Wire types of warren's HTTP API (`/v1`), shared by the server and the client.
//!
//! These are the contract other issues and clients rely on: field names are stable, new
//! fields are added as optional. Paths in every type are virtual paths (I1); no host path
//! ever appears in a response.

#![deny(missing_docs)]

mod artifact;
mod branch;
mod checkpoint;
mod code;
pub mod codes;
mod egress;
mod env;
mod error;
mod exec;
mod files;
mod health;
mod lease;
mod process;
mod run;
mod sandbox;
pub mod strict;
mod workdir;

pub use artifact::{ArtifactInfo, ArtifactList, PresentFiles};
pub use branch::{
    BranchChange, BranchDiff, BranchInfo, BranchList, CreateBranch, EntryVersion, MergeBranches,
    MergeConflictInfo, MergeResult, MergeStepInfo,
};
pub use checkpoint::{
    CheckpointCreated, CheckpointDiff, CheckpointInfo, CheckpointList, CheckpointSummary,
};
pub use code::{
    CodeContext, CodeContextList, CodeError, CodeEvent, CodeExecution, CodeResult,
    CreateCodeContext, ExecutionStatus, RunCode,
};
pub use egress::{
    EgressConnection, EgressLog, EgressSecretInfo, EgressSecretList, NewEgressSecret,
    SecretPresentation, SecretScope, SecretTargetSpec, SetEgressSecret,
};
pub use env::{AgentEnv, AgentEnvEntry, AgentEnvValue, ReplaceAgentEnv, SetAgentEnvVar};
pub use error::{ErrorBody, ErrorDetail};
pub use exec::{ExecCommand, ExecEvent, ExecResult, KilledProcesses};
pub use files::{
    EditFile, EditResult, FileEntry, FileList, GlobFiles, GrepFiles, GrepMatch, GrepResult,
    MakeDirectory, MakeDirectoryResult, MoveFile, MoveResult, WatchEvent, WriteResult,
};
pub use health::{
    ClusterInfo, ClusterNode, ClusterNodeState, GvisorHealth, GvisorPlatform, Health,
};
pub use lease::{CreateGuard, CreateLease, GuardInfo, LeaseInfo, RenewGuard, RenewLease};
pub use process::{
    ProcessEvent, ProcessInfo, ProcessList, ProcessOutput, SignalName, SignalProcess, StartProcess,
    StdinWritten, TerminalSize, SIGNALS,
};
pub use run::{RunInfo, RunKind, RunList, RunStatus};
pub use sandbox::{
    CreateSandbox, ForkSandbox, ForkedSandboxes, NetworkSpec, OnDeadline, PausedSandbox,
    ResumeSandbox, SandboxInfo, SandboxIsolation, SandboxLayout, SandboxList, TerminateSandbox,
    UpdateSandbox,
};
pub use workdir::{
    CreateViewerLink, CreateWorkdir, GitSpec, InitSpec, InitSummary, UsageFigure, ViewerLink,
    WorkdirInfo, WorkdirList, WorkspaceUsage,
};
