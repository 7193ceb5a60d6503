//! Every stable error code of warren's own API (`/v1`, and MCP's and E2B's statuses, which
//! come from the same classification): the statuses it is answered with and what it means.
//!
//! This table is the reference ([`reference`] renders `docs/errors.md` from it) and the
//! check: a code is written in the code base through [`code!`], which refuses at compile
//! time a code that is not here, or a status this table does not list for it. So a new
//! code cannot be answered before it is documented.
//!
//! ```compile_fail
//! // A code that is not in the table does not compile.
//! let _ = warren_protocol::code!(400, "no_such_code");
//! ```
//!
//! ```compile_fail
//! // Nor does a code answered with a status the table does not list for it.
//! let _ = warren_protocol::code!(500, "sandbox_not_found");
//! ```
//!
//! ```
//! assert_eq!(warren_protocol::code!(404, "sandbox_not_found"), "sandbox_not_found");
//! ```
//!
//! (DeerFlow's drop-in answers in DeerFlow's own vocabulary, and E2B's envd in the Connect
//! protocol's codes; neither is listed here.)

/// One stable error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Code {
    /// The code, `snake_case`.
    pub code: &'static str,
    /// The `/v1` statuses it is answered with.
    pub statuses: &'static [u16],
    /// What it means, and what the caller can do.
    pub meaning: &'static str,
}

/// The stable code `code`, answered with `status`: written through [`code!`] so the check
/// happens at compile time. Panics (a compile error in a constant) when the table does
/// not list the code with that status.
pub const fn registered(code: &'static str, status: u16) -> &'static str {
    let mut i = 0;
    while i < CODES.len() {
        if same(CODES[i].code.as_bytes(), code.as_bytes()) {
            let statuses = CODES[i].statuses;
            let mut j = 0;
            while j < statuses.len() {
                if statuses[j] == status {
                    return code;
                }
                j += 1;
            }
            panic!("this error code is not answered with this status: add the status to warren_protocol::codes::CODES");
        }
        i += 1;
    }
    panic!("an error code missing from warren_protocol::codes::CODES: add it, with its statuses and meaning");
}

const fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// A stable error code answered with a status, checked against [`CODES`] at compile time:
/// `code!(404, "sandbox_not_found")`.
#[macro_export]
macro_rules! code {
    ($status:expr, $code:expr) => {{
        const CODE: &str = $crate::codes::registered($code, $status);
        CODE
    }};
}

/// The entry of `code`, if it is one.
pub fn find(code: &str) -> Option<&'static Code> {
    CODES.iter().find(|entry| entry.code == code)
}

/// Whether `code` is answered with `status`: the check for codes only known at run time.
pub fn allows(code: &str, status: u16) -> bool {
    find(code).is_some_and(|entry| entry.statuses.contains(&status))
}

/// `docs/errors.md`, rendered from [`CODES`].
pub fn reference() -> String {
    let mut out = String::from(
        "# Error codes\n\n\
         <!-- Rendered from crates/warren-protocol/src/codes.rs by \
         `WARREN_BLESS=1 cargo test -p warren-protocol`; edit the table there. -->\n\n\
         Every error warren's API answers is JSON, \
         `{\"error\":{\"code\":\"...\",\"message\":\"...\"}}`. The code is stable and is what\n\
         a client matches on; the message is for people and may change. MCP tools and E2B's\n\
         API answer the same failures with the same status class (E2B's and DeerFlow's wires\n\
         answer 400 where `/v1` answers 422).\n\n\
         | code | status | meaning |\n|---|---|---|\n",
    );
    for entry in CODES {
        let statuses: Vec<String> = entry.statuses.iter().map(u16::to_string).collect();
        out.push_str(&format!(
            "| `{}` | {} | {} |\n",
            entry.code,
            statuses.join(", "),
            entry.meaning.replace('|', "\\|")
        ));
    }
    out
}

/// Every stable code, sorted by name.
pub const CODES: &[Code] = &[
    Code {
        code: "agent_env_full",
        statuses: &[409],
        meaning: "The uid's agent environment holds as many variables as it may; remove one first.",
    },
    Code {
        code: "already_exists",
        statuses: &[409],
        meaning: "The destination already exists.",
    },
    Code {
        code: "artifact_not_found",
        statuses: &[404],
        meaning: "The sandbox has no artifact with this id.",
    },
    Code {
        code: "backend_conflict",
        statuses: &[409],
        meaning: "The live sandbox of this identity runs on another backend or image (I16).",
    },
    Code {
        code: "backend_unavailable",
        statuses: &[400],
        meaning: "The request named a backend this server does not run.",
    },
    Code {
        code: "body_too_large",
        statuses: &[413],
        meaning: "The request body is larger than this server accepts (the read cap plus 64 KiB).",
    },
    Code {
        code: "branch_exists",
        statuses: &[409],
        meaning: "The workdir already has a branch of that name: choose another name, or delete the branch first.",
    },
    Code {
        code: "branch_in_use",
        statuses: &[409],
        meaning: "A sandbox that is not terminated is bound to the branch: terminate it before deleting the branch.",
    },
    Code {
        code: "branch_merged",
        statuses: &[409],
        meaning: "The branch was merged into its workdir already; a merged branch is never merged again (its baseline changed under it). Delete it.",
    },
    Code {
        code: "branch_not_found",
        statuses: &[404],
        meaning: "The workdir has no branch of that name (another uid's branches are never found).",
    },
    Code {
        code: "branches_unsupported",
        statuses: &[422],
        meaning: "Branches are overlay mounts on warren's host: they need overlayfs, warren running as root, and a backend that mounts host directories (local or Docker).",
    },
    Code {
        code: "checkpoint_not_found",
        statuses: &[404],
        meaning: "No checkpoint with this id in this sandbox.",
    },
    Code {
        code: "checkpoint_unusable",
        statuses: &[422],
        meaning: "A checkpoint or snapshot's manifest or chunks are missing or corrupt: it cannot be read back.",
    },
    Code {
        code: "cluster_forbidden",
        statuses: &[502],
        meaning: "The Kubernetes cluster refused warren's service account (403): the operator's RBAC to fix.",
    },
    Code {
        code: "cluster_refused",
        statuses: &[502],
        meaning: "The Kubernetes cluster rejected warren's request.",
    },
    Code {
        code: "cluster_unavailable",
        statuses: &[503],
        meaning: "The Kubernetes cluster is overloaded or out of reach after the retries it allows; retry.",
    },
    Code {
        code: "code_context_exists",
        statuses: &[409],
        meaning: "An execution context with that id exists already.",
    },
    Code {
        code: "code_context_not_found",
        statuses: &[404],
        meaning: "No execution context of the sandbox has that id (a context ends with its runtime).",
    },
    Code {
        code: "code_interpreter_unavailable",
        statuses: &[422],
        meaning: "The sandbox's runtime cannot run a code interpreter: its image lacks `python3`, `ipykernel` or `jupyter_client` (see docs/code.md).",
    },
    Code {
        code: "directory_not_empty",
        statuses: &[409],
        meaning: "The directory is not empty (and the removal was not recursive).",
    },
    Code {
        code: "edit_ambiguous",
        statuses: &[422],
        meaning: "An edit's `old` text occurs more than once in the file; give more context or replace all.",
    },
    Code {
        code: "edit_no_match",
        statuses: &[422],
        meaning: "An edit's `old` text does not occur in the file.",
    },
    Code {
        code: "egress_secret_not_found",
        statuses: &[404],
        meaning: "No egress secret of that name is set for that uid or sandbox.",
    },
    Code {
        code: "egress_secrets_full",
        statuses: &[409],
        meaning: "As many egress secrets are set there as may be (64); remove one first.",
    },
    Code {
        code: "env_policy_conflict",
        statuses: &[409],
        meaning: "The live sandbox of this identity has another environment policy (I14, I16).",
    },
    Code {
        code: "env_var_not_found",
        statuses: &[404],
        meaning: "The uid's agent environment has no such variable.",
    },
    Code {
        code: "exec_not_supported",
        statuses: &[501],
        meaning: "The sandbox's backend runs no commands (the `memory` backend).",
    },
    Code {
        code: "extra_mount_unusable",
        statuses: &[400],
        meaning: "An extra mount's source cannot be made or opened beneath the operator's directory.",
    },
    Code {
        code: "extra_mounts_conflict",
        statuses: &[409],
        meaning: "The live sandbox of this identity shows other extra mounts (I16).",
    },
    Code {
        code: "fence_invalid",
        statuses: &[400],
        meaning: "A fencing token that is malformed or was never issued for the sandbox.",
    },
    Code {
        code: "fence_stale",
        statuses: &[409],
        meaning: "A mutation carried a fencing token older than the newest issued: its guard passed to another holder, and nothing was changed (I33).",
    },
    Code {
        code: "file_busy",
        statuses: &[503],
        meaning: "Another process holds the directory's lock (for longer than writers wait).",
    },
    Code {
        code: "forbidden",
        statuses: &[403],
        meaning: "The MCP transport refused the request.",
    },
    Code {
        code: "git_failed",
        statuses: &[422],
        meaning: "git could not clone or check out.",
    },
    Code {
        code: "git_source_refused",
        statuses: &[400],
        meaning: "A git URL or revision that is not allowed.",
    },
    Code {
        code: "guard_held",
        statuses: &[409],
        meaning: "Another holder's execution guard is live (I33).",
    },
    Code {
        code: "guard_not_found",
        statuses: &[404],
        meaning: "The token is not the sandbox's live guard (released, lapsed, superseded or never issued): renewing or releasing it is refused.",
    },
    Code {
        code: "host_mounts_unsupported",
        statuses: &[422],
        meaning: "The sandbox's backend cannot mount a directory of warren's host (an ephemeral sandbox's scratch tree, an extra mount): refused before anything is recorded.",
    },
    Code {
        code: "image_not_found",
        statuses: &[422],
        meaning: "The image is not on the Docker host (warren never pulls) or not imported.",
    },
    Code {
        code: "insufficient_storage",
        statuses: &[507],
        meaning: "The server's disk is full (not the uid's quota): no delete by this uid can fix it.",
    },
    Code {
        code: "internal",
        statuses: &[500],
        meaning: "warren's own failure; the message says what failed and the server log has the details.",
    },
    Code {
        code: "invalid_body",
        statuses: &[400],
        meaning: "The request body could not be read.",
    },
    Code {
        code: "invalid_branch",
        statuses: &[400],
        meaning: "A branch name breaks the rules: 1 to 64 ASCII letters, digits, `.`, `_` or `-`, not starting with `.` or `-`.",
    },
    Code {
        code: "invalid_cwd",
        statuses: &[400],
        meaning: "The working directory does not exist or is not a directory.",
    },
    Code {
        code: "invalid_edit",
        statuses: &[400],
        meaning: "An edit's `old` text is empty, which would match everywhere.",
    },
    Code {
        code: "invalid_env",
        statuses: &[400],
        meaning: "An environment variable name or value that cannot be given to a command (I14).",
    },
    Code {
        code: "invalid_etag",
        statuses: &[400],
        meaning: "A string is not an ETag this crate produced.",
    },
    Code {
        code: "invalid_extra_mount",
        statuses: &[400],
        meaning: "An extra mount that cannot be shown in this layout.",
    },
    Code {
        code: "invalid_glob",
        statuses: &[400],
        meaning: "A glob pattern does not compile.",
    },
    Code {
        code: "invalid_image",
        statuses: &[400],
        meaning: "The image name is missing or unusable.",
    },
    Code {
        code: "invalid_json",
        statuses: &[400],
        meaning: "The body or a control message is not the JSON the route takes.",
    },
    Code {
        code: "invalid_layout",
        statuses: &[400],
        meaning: "The request names a layout this server does not know.",
    },
    Code {
        code: "invalid_mcp_request",
        statuses: &[400],
        meaning: "The MCP transport refused the request as malformed.",
    },
    Code {
        code: "invalid_mode",
        statuses: &[400],
        meaning: "A requested file mode has bits other than the permission bits `0o777`.",
    },
    Code {
        code: "invalid_name",
        statuses: &[400],
        meaning: "An uploaded file's name is not a plain file name.",
    },
    Code {
        code: "invalid_network",
        statuses: &[400],
        meaning: "A network policy entry is malformed.",
    },
    Code {
        code: "invalid_node",
        statuses: &[400],
        meaning: "A cluster setting (node id, advertise URL, lease TTL) that cannot be used.",
    },
    Code {
        code: "invalid_page_token",
        statuses: &[400],
        meaning: "A page token that this server did not issue, or for another listing.",
    },
    Code {
        code: "invalid_path",
        statuses: &[400],
        meaning: "The path is refused by the textual rules: empty, a `..` component, a NUL, or outside the roots a sandbox may name (I1, I2).",
    },
    Code {
        code: "invalid_path_parameter",
        statuses: &[400],
        meaning: "A path parameter (a sandbox id, a uid) is malformed.",
    },
    Code {
        code: "invalid_precondition",
        statuses: &[400],
        meaning: "`If-Match` or `If-None-Match` is malformed or combined in a way the route does not take.",
    },
    Code {
        code: "invalid_query",
        statuses: &[400],
        meaning: "A query parameter is missing, unknown or malformed.",
    },
    Code {
        code: "invalid_range",
        statuses: &[416],
        meaning: "The `Range` header is malformed or names no bytes of the file.",
    },
    Code {
        code: "invalid_regex",
        statuses: &[400],
        meaning: "A regular expression does not compile.",
    },
    Code {
        code: "invalid_request",
        statuses: &[400],
        meaning: "The request itself is malformed (both or neither of `command` and `argv`, ...).",
    },
    Code {
        code: "invalid_runtime_scope",
        statuses: &[400],
        meaning: "The runtime scope id is empty, too long or contains control characters.",
    },
    Code {
        code: "invalid_sandbox_id",
        statuses: &[400],
        meaning: "A sandbox id that warren could not have issued.",
    },
    Code {
        code: "invalid_scope",
        statuses: &[400],
        meaning: "An isolation-scope request that names an unknown scope or lacks the id it needs (I29).",
    },
    Code {
        code: "invalid_secret",
        statuses: &[400],
        meaning: "An egress secret's name, targets, presentation or value is malformed; the message says which part.",
    },
    Code {
        code: "invalid_signal",
        statuses: &[400],
        meaning: "A signal name the process API does not send.",
    },
    Code {
        code: "invalid_uid",
        statuses: &[400],
        meaning: "The uid is empty or too long to be a user id.",
    },
    Code {
        code: "invalid_workdir",
        statuses: &[400],
        meaning: "The workdir breaks one of the workdir rules (I4).",
    },
    Code {
        code: "is_a_directory",
        statuses: &[400],
        meaning: "The path names a directory where a file was expected.",
    },
    Code {
        code: "isolation_conflict",
        statuses: &[409],
        meaning: "The live sandbox of this identity runs on another isolation tier (issue 19, I16).",
    },
    Code {
        code: "isolation_unavailable",
        statuses: &[422],
        meaning: "The sandbox's backend cannot run the gVisor tier on this host (issue 19): refused before anything is recorded, rather than a sandbox that fails at its first exec.",
    },
    Code {
        code: "layout_conflict",
        statuses: &[409],
        meaning: "The live sandbox of this identity has another layout (I7, I16).",
    },
    Code {
        code: "lease_not_found",
        statuses: &[404],
        meaning: "No live lease with this id (never taken, released, or expired).",
    },
    Code {
        code: "link_loop",
        statuses: &[422],
        meaning: "Inside a runtime, where links are followed only within it: more links than 40 on the way (a loop).",
    },
    Code {
        code: "mcp_session_not_found",
        statuses: &[404],
        meaning: "No such MCP session (closed, or the server restarted): initialize a new one.",
    },
    Code {
        code: "merge_conflict",
        statuses: &[409],
        meaning: "The merge found changes it cannot combine: nothing was applied; `conflicts` lists each path with the baseline, ours and theirs. Resolve them in a branch (or the target) and merge again.",
    },
    Code {
        code: "merge_incomplete",
        statuses: &[409],
        meaning: "Other branches made of the workdir exist: a merge into the workdir takes every unmerged one at once, since it changes their common baseline. Name them all, or delete the ones to leave out first.",
    },
    Code {
        code: "merge_refused",
        statuses: &[422],
        meaning: "The merge met what it never merges: a fifo, socket or device, a name or link target that is not UTF-8, or a name reserved for merges (`.warren-merge-…`). Nothing was applied.",
    },
    Code {
        code: "merge_stale",
        statuses: &[409],
        meaning: "A tree changed while the merge ran (a branch or the target): nothing was applied; merge again.",
    },
    Code {
        code: "method_not_allowed",
        statuses: &[405],
        meaning: "The endpoint does not take that method; `GET /v1/openapi.json` lists them.",
    },
    Code {
        code: "mount_crossing_refused",
        statuses: &[403],
        meaning: "Resolving the path would cross into another mount (I2).",
    },
    Code {
        code: "network_conflict",
        statuses: &[409],
        meaning: "The live sandbox of this identity runs under another network policy (I16).",
    },
    Code {
        code: "node_fenced",
        statuses: &[503],
        meaning: "This node fenced itself (its lease could not be renewed in time) and has not joined the cluster again yet: it runs no runtime work meanwhile (issue 14).",
    },
    Code {
        code: "node_unreachable",
        statuses: &[503],
        meaning: "The owner could not be reached to forward a runtime operation to.",
    },
    Code {
        code: "not_a_directory",
        statuses: &[400],
        meaning: "A component used as a directory is not one.",
    },
    Code {
        code: "not_a_file",
        statuses: &[400],
        meaning: "The path names something that is neither a regular file nor a directory (a fifo, a socket, a device), which is never read or written.",
    },
    Code {
        code: "not_a_terminal",
        statuses: &[409],
        meaning: "The process runs without a terminal, so it has no size to set.",
    },
    Code {
        code: "not_acceptable",
        statuses: &[406],
        meaning: "The MCP transport cannot answer in a type the `Accept` header allows.",
    },
    Code {
        code: "not_found",
        statuses: &[404],
        meaning: "Nothing exists at the path (or one of its parents is missing).",
    },
    Code {
        code: "not_in_outputs",
        statuses: &[400],
        meaning: "A path given to `present_files` is not under the workdir's `outputs/` (I26).",
    },
    Code {
        code: "not_owner",
        statuses: &[409],
        meaning: "A forwarded operation reached a node that no longer owns the runtime (between replicas only).",
    },
    Code {
        code: "not_utf8",
        statuses: &[422],
        meaning: "The file is not UTF-8 text where text was asked for; read it as bytes.",
    },
    Code {
        code: "permission_denied",
        statuses: &[403],
        meaning: "The kernel refused access.",
    },
    Code {
        code: "precondition_failed",
        statuses: &[412],
        meaning: "A conditional write found a different version than the one it was based on (I27).",
    },
    Code {
        code: "process_ended",
        statuses: &[409],
        meaning: "The process has ended: it takes no input, signal or resize.",
    },
    Code {
        code: "process_not_found",
        statuses: &[404],
        meaning: "No process of the sandbox has that pid or tag.",
    },
    Code {
        code: "process_not_started",
        statuses: &[422],
        meaning: "The runtime could not start the process (no such program, a working directory it cannot enter); the reason names no host path (I1).",
    },
    Code {
        code: "processes_not_supported",
        statuses: &[501],
        meaning: "The sandbox's backend runs no long-running processes.",
    },
    Code {
        code: "quota_exceeded",
        statuses: &[507],
        meaning: "The uid's workspace is at its storage quota (bytes or inodes, I23).",
    },
    Code {
        code: "range_not_satisfiable",
        statuses: &[416],
        meaning: "The byte range lies outside the file.",
    },
    Code {
        code: "read_only",
        statuses: &[403],
        meaning: "A write aimed at the read-only skills mount, a read-only file system, or a tree opened read-only (I7).",
    },
    Code {
        code: "reserved_uid",
        statuses: &[400],
        meaning: "A uid a client names may not start with the prefixes of derived owners (`session:`, `agent:`, `global:`, I29).",
    },
    Code {
        code: "root_refused",
        statuses: &[403],
        meaning: "The operation is not allowed on the workspace root itself.",
    },
    Code {
        code: "route_not_found",
        statuses: &[404],
        meaning: "No such endpoint; `GET /v1/openapi.json` lists them.",
    },
    Code {
        code: "runtime_elsewhere",
        statuses: &[503],
        meaning: "The runtime is owned by another node and this one has no link to forward to it.",
    },
    Code {
        code: "runtime_moved",
        statuses: &[503],
        meaning: "The runtime's ownership moved to another node while the operation ran; retry (issue 14).",
    },
    Code {
        code: "runtime_not_found",
        statuses: &[503],
        meaning: "The sandbox's runtime is gone (killed outside warren, or its node lost it); retry starts a new one.",
    },
    Code {
        code: "runtime_not_ready",
        statuses: &[503],
        meaning: "The runtime (a pod) did not become ready in time.",
    },
    Code {
        code: "runtime_not_running",
        statuses: &[409],
        meaning: "A snapshot needs a running runtime.",
    },
    Code {
        code: "runtime_stopped",
        statuses: &[409],
        meaning: "A watch of the runtime's own tree found the runtime stopped (reaped, paused, lost): it is over. Watching again starts the runtime.",
    },
    Code {
        code: "sandbox_already_live",
        statuses: &[409],
        meaning: "`from_snapshot` was given for a sandbox that is already live.",
    },
    Code {
        code: "sandbox_busy",
        statuses: &[409],
        meaning: "Commands are running in the sandbox; wait for them to finish, then restore.",
    },
    Code {
        code: "sandbox_not_found",
        statuses: &[404],
        meaning: "No sandbox has this id.",
    },
    Code {
        code: "sandbox_paused",
        statuses: &[409],
        meaning: "The sandbox is paused or being paused: nothing runs in it until it is resumed.",
    },
    Code {
        code: "sandbox_state_conflict",
        statuses: &[409],
        meaning: "The lifecycle's transition table does not allow this in the sandbox's state.",
    },
    Code {
        code: "sandbox_terminated",
        statuses: &[409],
        meaning: "The sandbox is behind its cleanup fence or gone (I15); a command still running when its runtime went answers this.",
    },
    Code {
        code: "sandbox_terminating",
        statuses: &[409],
        meaning: "The sandbox is behind its cleanup fence: it is being terminated (I15).",
    },
    Code {
        code: "shell_session_busy",
        statuses: &[409],
        meaning: "A shell session still runs a command; one runs at a time.",
    },
    Code {
        code: "shell_session_not_found",
        statuses: &[404],
        meaning: "No open shell session has that id in the sandbox (or its shell ended).",
    },
    Code {
        code: "shell_start_failed",
        statuses: &[502],
        meaning: "A session's shell could not be started or reached.",
    },
    Code {
        code: "skill_not_granted",
        statuses: &[404],
        meaning: "The skill is not granted to this uid.",
    },
    Code {
        code: "snapshot_cancelled",
        statuses: &[503],
        meaning: "The server is shutting down; the snapshot or restore stopped at its next chunk. Retry.",
    },
    Code {
        code: "snapshot_not_found",
        statuses: &[404],
        meaning: "No runtime snapshot with this id among the uid's sandboxes.",
    },
    Code {
        code: "snapshot_not_supported",
        statuses: &[501],
        meaning: "The backend cannot expose a runtime's ephemeral state.",
    },
    Code {
        code: "snapshot_too_large",
        statuses: &[422],
        meaning: "The tree holds more file data than `[snapshots] max_bytes` (holes of sparse files not counted); nothing was recorded.",
    },
    Code {
        code: "state_store_unavailable",
        statuses: &[503],
        meaning: "The state store is out of reach (restarting, network); nothing was half-done, and the same request may succeed shortly.",
    },
    Code {
        code: "stdin_closed",
        statuses: &[409],
        meaning: "The process's stdin was closed (or never kept open: start it with `stdin: true`).",
    },
    Code {
        code: "stdin_interrupted",
        statuses: &[400],
        meaning: "The client's stream of stdin broke off; what came before it was written.",
    },
    Code {
        code: "symlink_refused",
        statuses: &[403],
        meaning: "A component of the path (possibly the last one) is a symlink or a magic link; no link is ever followed (I2).",
    },
    Code {
        code: "token_in_command",
        statuses: &[400],
        meaning: "A command line carries the provisioner's token; it never enters a sandbox (I13).",
    },
    Code {
        code: "token_in_env",
        statuses: &[400],
        meaning: "An environment value carries the provisioner's token; it never enters a sandbox (I13).",
    },
    Code {
        code: "too_deep",
        statuses: &[422],
        meaning: "A recursive operation met a tree deeper than the deepest walk (`MAX_WALK_DEPTH`).",
    },
    Code {
        code: "too_large",
        statuses: &[413, 422],
        meaning: "A file too large to read whole (read it in byte ranges), present, or upload.",
    },
    Code {
        code: "too_many_code_contexts",
        statuses: &[429],
        meaning: "The sandbox has as many execution contexts as it may (16); remove one first.",
    },
    Code {
        code: "too_many_entries",
        statuses: &[422],
        meaning: "A tree with more entries than a whole-tree operation takes.",
    },
    Code {
        code: "too_many_processes",
        statuses: &[409],
        meaning: "The sandbox runs the most processes it may.",
    },
    Code {
        code: "too_many_shell_sessions",
        statuses: &[409],
        meaning: "The sandbox holds as many persistent shell sessions as it may; close one first.",
    },
    Code {
        code: "too_many_watches",
        statuses: &[429],
        meaning: "The sandbox holds as many directory watches as it may.",
    },
    Code {
        code: "unauthorized",
        statuses: &[401],
        meaning: "The Bearer token is missing or wrong.",
    },
    Code {
        code: "unknown_host_dir",
        statuses: &[400],
        meaning: "A workdir initialisation names a host directory the operator did not allow (`[init] host_dirs`).",
    },
    Code {
        code: "unsupported_language",
        statuses: &[400],
        meaning: "No code interpreter for that language; warren runs `python` and `bash` (where the image has bash_kernel).",
    },
    Code {
        code: "unsupported_media_type",
        statuses: &[415],
        meaning: "The MCP transport does not take the body's content type.",
    },
    Code {
        code: "viewer_header_missing",
        statuses: &[403],
        meaning: "A Viewer upload without its `X-Warren-Viewer: 1` header (a cross-site request).",
    },
    Code {
        code: "viewer_session_expired",
        statuses: &[401],
        meaning: "The Viewer session has expired; ask for a new link.",
    },
    Code {
        code: "viewer_session_invalid",
        statuses: &[401],
        meaning: "The Viewer session is not valid; ask for a new link.",
    },
    Code {
        code: "viewer_session_required",
        statuses: &[401],
        meaning: "No Viewer session; open the Viewer through a link.",
    },
    Code {
        code: "watch_failed",
        statuses: &[500],
        meaning: "A directory watch failed on the server's side (its inotify queue).",
    },
    Code {
        code: "watch_too_large",
        statuses: &[413],
        meaning: "A directory too large to watch.",
    },
    Code {
        code: "watched_dir_gone",
        statuses: &[404],
        meaning: "The directory a watch watched was removed or moved: the watch is over.",
    },
    Code {
        code: "watcher_not_found",
        statuses: &[404],
        meaning: "No watcher with that id in the sandbox (removed, idle too long, or made on another node).",
    },
    Code {
        code: "websocket_required",
        statuses: &[400],
        meaning: "The route is a WebSocket: send an upgrade request.",
    },
    Code {
        code: "workdir_branched",
        statuses: &[409],
        meaning: "The path lies in a workdir that has branches: the baseline is read-only while they exist (I27). Write in a branch, merge it, or delete the branches.",
    },
    Code {
        code: "workdir_conflict",
        statuses: &[409],
        meaning: "The live sandbox of this identity is bound to another workdir (I5).",
    },
    Code {
        code: "workdir_in_use",
        statuses: &[409],
        meaning: "A running sandbox can write the workdir: a branch is made only of a workdir that no running runtime writes. Stop those sandboxes (or bind them to branches) first.",
    },
    Code {
        code: "workdir_not_a_directory",
        statuses: &[400],
        meaning: "The workdir exists but is not a plain directory.",
    },
    Code {
        code: "workdir_not_empty",
        statuses: &[409],
        meaning: "Only an empty workdir is initialised (I32).",
    },
    Code {
        code: "workdir_not_found",
        statuses: &[404],
        meaning: "The workdir does not exist in the uid's workspace (I4).",
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_sorted_unique_snake_case_and_documented() {
        for pair in CODES.windows(2) {
            assert!(
                pair[0].code < pair[1].code,
                "{} then {}",
                pair[0].code,
                pair[1].code
            );
        }
        for entry in CODES {
            assert!(
                !entry.code.is_empty()
                    && entry
                        .code
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{}",
                entry.code
            );
            assert!(!entry.statuses.is_empty(), "{}", entry.code);
            assert!(
                entry.meaning.ends_with('.'),
                "{}: {}",
                entry.code,
                entry.meaning
            );
        }
    }

    #[test]
    fn a_registered_code_passes_and_is_found() {
        assert_eq!(code!(404, "sandbox_not_found"), "sandbox_not_found");
        assert!(allows("too_large", 413) && allows("too_large", 422));
        assert!(!allows("too_large", 500) && !allows("no_such_code", 400));
    }

    #[test]
    #[should_panic(expected = "missing from warren_protocol::codes::CODES")]
    fn a_code_missing_from_the_table_is_refused() {
        registered("no_such_code", 400);
    }

    #[test]
    #[should_panic(expected = "not answered with this status")]
    fn a_code_with_a_status_the_table_does_not_list_is_refused() {
        registered("sandbox_not_found", 500);
    }

    /// `docs/errors.md` is the table, rendered: a code added here without rendering it
    /// fails this test. `WARREN_BLESS=1` writes it.
    #[test]
    fn the_error_reference_is_the_table_rendered() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/errors.md");
        let rendered = reference();
        if std::env::var_os("WARREN_BLESS").is_some() {
            std::fs::write(&path, &rendered).unwrap();
        }
        let written = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            written == rendered,
            "docs/errors.md is not the table in crates/warren-protocol/src/codes.rs; \
             run `WARREN_BLESS=1 cargo test -p warren-protocol` and commit it"
        );
    }
}
