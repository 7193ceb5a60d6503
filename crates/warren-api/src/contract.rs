//! What the OpenAPI document must say that the handlers' annotations cannot: the answers
//! every operation shares, and the rules the server enforces on each value.
//!
//! The document is a contract clients are generated from and that `scripts/openapi-check`
//! holds the live server to (schemathesis, every default check), so it must describe the
//! server exactly: a value the document calls valid is accepted, one it calls invalid is
//! refused. The rules are kept here as data, next to one another, so a review sees them
//! whole; `crate::openapi::tests` checks every rule still names a real schema property.
//!
//! Strings are limited in characters here and in bytes by the server (identifiers and path
//! components are file names, whose limits are bytes): the two agree for ASCII, and the
//! check runs with ASCII strings for that reason.

use serde_json::{json, Map, Value};

/// A sandbox id: `sbx-` and 24 lowercase hex digits (I5).
const SANDBOX_ID: &str = "^sbx-[0-9a-f]{24}$";
/// A uid a client names (`Uid::plain`): 1 to 256 bytes without control characters, not
/// one of the prefixes of owners that isolation scopes derive (I29).
const UID: &str = "^(?!session:|agent:|global:)[^\\u0000-\\u001f\\u007f-\\u009f]{1,256}$";
/// A runtime scope id, or a lease holder.
const IDENTIFIER: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f]{1,256}$";
/// The ids an isolation scope derives an owner from (`IsolationScope::derive`): empty means
/// absent, and the derived owner (`session:<id>`, `agent:<id>`, or the user id itself) is a
/// uid of at most 256 bytes.
const USER_ID: &str = "^(?!session:|agent:|global:)[^\\u0000-\\u001f\\u007f-\\u009f]{0,256}$";
const SESSION_ID: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f]{0,248}$";
const AGENT_ID: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f]{0,250}$";
/// A git URL (`check_git_source`): a remote scheme, no whitespace or control character, not
/// an option. (`file://` inside an allowed host directory is accepted too, and left out.)
const GIT_URL: &str = "^(https?|ssh|git)://[^\\u0000-\\u0020\\u007f-\\u00a0]*$";
/// A git revision: a branch, tag or commit name.
const GIT_REV: &str = "^(?!-)[A-Za-z0-9._/-]{1,256}$";
/// A file an initialisation writes: relative to the workdir, no `..`, no NUL, naming
/// something below the workdir rather than the workdir itself.
const INIT_FILE: &str = "^(?!/)(?!(.*/)?\\.\\.(/|$))(?=.*[^/.])[^\\u0000]{1,4096}$";
/// An image reference (`check_image_reference`).
const IMAGE: &str = "^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}$";
/// A workdir (I4): relative, no empty, `.` or `..` component, not under `agents/`, no NUL.
const WORKDIR: &str =
    "^(?!agents(/|$))(?!/)(?!.*//)(?!.*/$)(?!(.*/)?\\.\\.?(/|$))[^\\u0000]{1,4096}$";
/// A virtual path (I1): absolute under one of the two mounts, or relative to the workdir;
/// no `..` component, no NUL.
const VIRTUAL_PATH: &str =
    "^(?!/(?!home/gem/(user-data|skills)(/|$)))(?!(.*/)?\\.\\.(/|$))[^\\u0000]{1,4096}$";
/// An environment variable name (`check_env_name`).
const ENV_NAME: &str = "^(?!USER_UID$|USER_GID$)[A-Za-z_][A-Za-z0-9_]{0,255}$";
/// A catalog skill's name.
const SKILL: &str = "^[a-z0-9][a-z0-9._-]{0,63}$";
/// `If-Match` (RFC 9110 entity tags, a list allowed) naming at most one of warren's
/// ETags (`b3-` and 32 hex digits), which a bare value may name without quotes.
const IF_MATCH: &str = "^(?!(.*b3-[0-9a-f]{32}.*){2})[\\t ]*((W/)?\"[\\x21\\x23-\\x7e]*\"|b3-[0-9a-f]{32})([\\t ]*,[\\t ]*((W/)?\"[\\x21\\x23-\\x7e]*\"|b3-[0-9a-f]{32}))*[\\t ]*$";
/// One allowlist destination (`Destination::parse`): a host name or `*.suffix` (labels of
/// letters, digits and inner hyphens), an IPv4 address or range. The server also takes
/// IPv6 addresses and ranges, which this pattern leaves out rather than describe loosely.
const DESTINATION: &str = concat!(
    "^[\\t\\n\\v\\f\\r ]*(",
    "(\\*\\.)?(?=.{1,253}[\\t\\n\\v\\f\\r ]*$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*",
    "|(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(\\.(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}(/(3[0-2]|[12]?[0-9]))?",
    ")[\\t\\n\\v\\f\\r ]*$"
);

/// An egress secret's name (`SecretName`).
const SECRET_NAME: &str = "^[A-Z][A-Z0-9_]{0,63}$";
/// An egress secret's value: 6 bytes to 8 KiB, no control character.
const SECRET_VALUE: &str = "^[^\\u0000-\\u001f\\u007f]{6,8192}$";
/// An HTTP token: a header or parameter name a secret is presented in.
const HTTP_TOKEN: &str = "^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$";
/// A secret target's host (`SecretTarget`): a host name, `*.suffix` or one IPv4 address
/// (IPv6 addresses are taken too, and left out here).
const SECRET_HOST: &str = concat!(
    "^((\\*\\.)?(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*",
    "|(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(\\.(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3})$"
);

/// A header an egress secret may be presented in: an HTTP token, not one of the headers
/// that frame a request (matched without regard to case).
fn header_name() -> String {
    let owned = [
        "host",
        "connection",
        "content-length",
        "transfer-encoding",
        "proxy-authorization",
        "upgrade",
        "te",
    ];
    let either_case = |word: &str| -> String {
        word.chars()
            .map(|c| {
                if c.is_ascii_alphabetic() {
                    format!("[{}{}]", c.to_ascii_lowercase(), c.to_ascii_uppercase())
                } else {
                    c.to_string()
                }
            })
            .collect()
    };
    let refused: Vec<String> = owned
        .iter()
        .map(|w| format!("{}$", either_case(w)))
        .collect();
    format!("^(?!{}){}", refused.join("|"), &HTTP_TOKEN[1..])
}

/// A branch's name (`BranchName`).
const BRANCH: &str = "^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$";

/// A process's tag: 1 to 256 bytes with no control character.
const PROCESS_TAG: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f]{1,256}$";

/// A code context's id: letters, digits, `-`, `_`, `.`.
const CODE_CONTEXT: &str = "^[A-Za-z0-9._-]{1,64}$";

/// A fencing token (`X-Warren-Fence`, I33): a positive whole number without a leading
/// zero. The server reads up to 2^63-1; the pattern stops at 18 digits so that every value
/// it calls valid is one the server can read.
const FENCE_TOKEN: &str = "^[1-9][0-9]{0,17}$";

/// The header a fenced mutation carries its execution guard token in.
const FENCE_HEADER: &str = "X-Warren-Fence";

/// Every operation that changes a sandbox, its files or its records, and so takes
/// `X-Warren-Fence` (the handlers take the `Fence` extractor; the API suite sends each a
/// stale token and checks it is refused).
pub(crate) const FENCED_OPERATIONS: [(&str, &str); 32] = [
    ("post", "/v1/sandboxes/{id}/exec"),
    ("post", "/v1/sandboxes/{id}/code/contexts"),
    ("delete", "/v1/sandboxes/{id}/code/contexts/{context}"),
    ("post", "/v1/sandboxes/{id}/code/contexts/{context}/restart"),
    (
        "post",
        "/v1/sandboxes/{id}/code/contexts/{context}/interrupt",
    ),
    ("post", "/v1/sandboxes/{id}/code/execute"),
    ("post", "/v1/sandboxes/{id}/processes"),
    ("post", "/v1/sandboxes/{id}/processes/{pid}/stdin"),
    ("post", "/v1/sandboxes/{id}/processes/{pid}/stdin/close"),
    ("post", "/v1/sandboxes/{id}/processes/{pid}/signal"),
    ("post", "/v1/sandboxes/{id}/processes/{pid}/resize"),
    ("post", "/v1/sandboxes/{id}/processes/{pid}/kill"),
    ("get", "/v1/sandboxes/{id}/processes/{pid}/attach"),
    ("post", "/v1/sandboxes/{id}/kill"),
    ("delete", "/v1/sandboxes/{id}"),
    ("post", "/v1/sandboxes/{id}/terminate"),
    ("patch", "/v1/sandboxes/{id}"),
    ("post", "/v1/sandboxes/{id}/pause"),
    ("post", "/v1/sandboxes/{id}/resume"),
    ("put", "/v1/sandboxes/{id}/files"),
    ("delete", "/v1/sandboxes/{id}/files"),
    ("post", "/v1/sandboxes/{id}/files/edit"),
    ("post", "/v1/sandboxes/{id}/files/mkdir"),
    ("post", "/v1/sandboxes/{id}/files/move"),
    ("post", "/v1/sandboxes/{id}/checkpoints"),
    (
        "post",
        "/v1/sandboxes/{id}/checkpoints/{checkpoint_id}/restore",
    ),
    ("post", "/v1/sandboxes/{id}/snapshots"),
    ("post", "/v1/sandboxes/{id}/artifacts"),
    ("post", "/v1/sandboxes/{id}/merge"),
    ("post", "/v1/sandboxes/{id}/fork"),
    ("put", "/v1/sandboxes/{id}/secrets/{name}"),
    ("delete", "/v1/sandboxes/{id}/secrets/{name}"),
];

fn is_fenced(path: &str, method: &str) -> bool {
    FENCED_OPERATIONS.contains(&(method, path))
}

fn string(pattern: &str) -> Value {
    json!({"type": "string", "pattern": pattern})
}

/// The run listings (`runs.rs`): their own `limit` and filters.
fn lists_runs(path: &str) -> bool {
    path.ends_with("/runs")
}

/// Path and query parameters by name (on the run listings, by path too): the schema the
/// server holds them to.
fn parameter_schema(path: &str, location: &str, name: &str) -> Option<Value> {
    Some(match (location, name) {
        ("query", "limit") if lists_runs(path) => json!({"type": "integer", "minimum": 1,
                                                         "maximum": warren_store::RunQuery::MAX_LIMIT}),
        ("query", "status") if lists_runs(path) => {
            json!({"type": "string", "enum": ["running", "finished", "failed"]})
        }
        ("query", "since") if lists_runs(path) => json!({"type": "string", "format": "date-time"}),
        // Only a token the server issued is accepted (400 `invalid_page_token` otherwise),
        // which no pattern can say: scripts/openapi-check.toml lets schemathesis's made-up
        // tokens be refused.
        ("query", "page_token") if lists_runs(path) => string(&format!(
            "^[A-Za-z0-9_-]{{1,{}}}$",
            crate::runs::MAX_PAGE_TOKEN
        )),
        // The sandbox listing's filters: `key=value` labels, and the lifecycle's states.
        ("query", "label") if path == "/v1/sandboxes" => {
            json!({"type": "array", "items": string("^[^=]+=[\\s\\S]*$")})
        }
        ("query", "state") if path == "/v1/sandboxes" => json!({"type": "string",
            "enum": warren_store::SandboxState::ALL.map(warren_store::SandboxState::as_str)}),
        ("path", "id") => string(SANDBOX_ID),
        ("path", "pid") => json!({"type": "integer", "minimum": 1, "maximum": i32::MAX}),
        ("path", "context") => string(CODE_CONTEXT),
        ("query", "from") => json!({"type": "integer", "minimum": 0, "maximum": u64::MAX}),
        ("path" | "query", "uid") => string(UID),
        ("path", "name") if path.contains("/secrets/") => string(SECRET_NAME),
        ("path", "name") => string(ENV_NAME),
        ("path", "skill") => string(SKILL),
        ("path", "branch") => string(BRANCH),
        ("query", "workdir") => string(WORKDIR),
        ("query", "path") => string(VIRTUAL_PATH),
        ("query", "depth") => json!({"type": "integer", "minimum": 1, "maximum": 64}),
        ("query", "limit") if path.ends_with("/egress") => {
            json!({"type": "integer", "minimum": 1, "maximum": 1000})
        }
        ("query", "after") => json!({"type": "integer", "minimum": i64::MIN, "maximum": i64::MAX}),
        ("query", "limit") => json!({"type": "integer", "minimum": 1, "maximum": 10000}),
        ("query", "append" | "recursive") => json!({"type": "boolean"}),
        ("header", "If-Match") => string(IF_MATCH),
        ("header", "If-None-Match") => json!({"type": "string", "enum": ["*"]}),
        ("header", FENCE_HEADER) => string(FENCE_TOKEN),
        ("query", "token") => json!({"type": "integer", "minimum": 1, "maximum": i64::MAX}),
        _ => return None,
    })
}

/// Properties of request schemas: what the server enforces beyond their type. Each entry
/// is merged into the generated property (a `null` the type allows stays allowed: these
/// keywords constrain strings and numbers only).
pub(crate) fn property_rules() -> Vec<(&'static str, &'static str, Value)> {
    vec![
        ("CreateWorkdir", "path", string(WORKDIR)),
        ("ForkSandbox", "count", json!({"minimum": 1, "maximum": 20})),
        ("CreateBranch", "workdir", string(WORKDIR)),
        ("CreateBranch", "name", string(BRANCH)),
        ("CreateBranch", "from_checkpoint", string(IDENTIFIER)),
        (
            "MergeBranches",
            "branches",
            json!({"items": string(BRANCH), "minItems": 1, "maxItems": 64}),
        ),
        (
            "InitSpec",
            "files",
            json!({"propertyNames": string(INIT_FILE)}),
        ),
        ("GitSpec", "url", string(GIT_URL)),
        ("GitSpec", "rev", string(GIT_REV)),
        ("CreateSandbox", "uid", string(UID)),
        ("CreateSandbox", "runtime_scope_id", string(IDENTIFIER)),
        (
            "CreateSandbox",
            "scope",
            json!({"enum": ["user", "session", "agent", "global", null]}),
        ),
        ("CreateSandbox", "user_id", string(USER_ID)),
        ("CreateSandbox", "session_id", string(SESSION_ID)),
        ("CreateSandbox", "agent_id", string(AGENT_ID)),
        ("CreateSandbox", "image", string(IMAGE)),
        ("CreateSandbox", "workdir", string(WORKDIR)),
        ("CreateSandbox", "from_snapshot", string(IDENTIFIER)),
        ("CreateSandbox", "branch", string(BRANCH)),
        ("ExecCommand", "cwd", string(VIRTUAL_PATH)),
        (
            "ExecCommand",
            "shell",
            json!({"enum": ["sh", "bash", null]}),
        ),
        ("ExecCommand", "timeout_s", json!({"minimum": 1})),
        ("ExecCommand", "argv", json!({"minItems": 1})),
        (
            "ExecCommand",
            "env",
            json!({"propertyNames": string(ENV_NAME),
                   "additionalProperties": string("^[^\\u0000]{0,32768}$")}),
        ),
        ("StartProcess", "cwd", string(VIRTUAL_PATH)),
        (
            "StartProcess",
            "shell",
            json!({"enum": ["sh", "bash", null]}),
        ),
        ("StartProcess", "timeout_s", json!({"minimum": 1})),
        ("StartProcess", "argv", json!({"minItems": 1})),
        (
            "StartProcess",
            "env",
            json!({"propertyNames": string(ENV_NAME),
                   "additionalProperties": string("^[^\\u0000]{0,32768}$")}),
        ),
        ("StartProcess", "tag", string(PROCESS_TAG)),
        ("CreateCodeContext", "id", string(CODE_CONTEXT)),
        (
            "CreateCodeContext",
            "language",
            json!({"enum": ["python", "python3", "bash", null]}),
        ),
        ("CreateCodeContext", "cwd", string(VIRTUAL_PATH)),
        (
            "CreateCodeContext",
            "env",
            json!({"propertyNames": string(ENV_NAME),
                   "additionalProperties": string("^[^\\u0000]{0,32768}$")}),
        ),
        (
            "RunCode",
            "code",
            json!({"maxLength": warren_provisioner::MAX_CODE_BYTES}),
        ),
        ("RunCode", "context", string(CODE_CONTEXT)),
        (
            "RunCode",
            "language",
            json!({"enum": ["python", "python3", "bash", null]}),
        ),
        ("RunCode", "cwd", string(VIRTUAL_PATH)),
        ("RunCode", "timeout_s", json!({"minimum": 1})),
        (
            "RunCode",
            "env",
            json!({"propertyNames": string(ENV_NAME),
                   "additionalProperties": string("^[^\\u0000]{0,32768}$")}),
        ),
        (
            "TerminalSize",
            "cols",
            json!({"minimum": 1, "maximum": 4096}),
        ),
        (
            "TerminalSize",
            "rows",
            json!({"minimum": 1, "maximum": 4096}),
        ),
        ("CreateGuard", "holder", string(IDENTIFIER)),
        (
            "CreateGuard",
            "ttl_s",
            json!({"minimum": 1, "maximum": 3600}),
        ),
        (
            "RenewGuard",
            "token",
            json!({"minimum": 1, "maximum": i64::MAX}),
        ),
        (
            "RenewGuard",
            "ttl_s",
            json!({"minimum": 1, "maximum": 3600}),
        ),
        ("CreateLease", "holder", string(IDENTIFIER)),
        (
            "CreateLease",
            "ttl_s",
            json!({"minimum": 1, "maximum": 3600}),
        ),
        (
            "RenewLease",
            "ttl_s",
            json!({"minimum": 1, "maximum": 3600}),
        ),
        (
            "TerminateSandbox",
            "grace_s",
            json!({"minimum": 0, "maximum": 300}),
        ),
        ("CreateViewerLink", "uid", string(UID)),
        ("CreateViewerLink", "workdir", string(WORKDIR)),
        (
            "CreateViewerLink",
            "ttl_s",
            json!({"minimum": 1, "maximum": 604800}),
        ),
        ("EditFile", "path", string(VIRTUAL_PATH)),
        ("EditFile", "old", json!({"minLength": 1})),
        ("EditFile", "if_match", string(IF_MATCH)),
        ("GlobFiles", "path", string(VIRTUAL_PATH)),
        ("GrepFiles", "path", string(VIRTUAL_PATH)),
        ("MakeDirectory", "path", string(VIRTUAL_PATH)),
        ("MoveFile", "from", string(VIRTUAL_PATH)),
        ("MoveFile", "to", string(VIRTUAL_PATH)),
        (
            "PresentFiles",
            "paths",
            json!({"items": string(VIRTUAL_PATH), "minItems": 1, "maxItems": 100}),
        ),
        (
            "NetworkSpec",
            "mode",
            json!({"enum": ["none", "open", "allowlist"]}),
        ),
        (
            "SetEgressSecret",
            "targets",
            json!({"minItems": 1, "maxItems": 16}),
        ),
        ("SetEgressSecret", "value", string(SECRET_VALUE)),
        ("NewEgressSecret", "name", string(SECRET_NAME)),
        (
            "NewEgressSecret",
            "targets",
            json!({"minItems": 1, "maxItems": 16}),
        ),
        ("NewEgressSecret", "value", string(SECRET_VALUE)),
        ("CreateSandbox", "secrets", json!({"maxItems": 64})),
        ("SecretTargetSpec", "host", string(SECRET_HOST)),
        (
            "SecretTargetSpec",
            "ports",
            json!({"maxItems": 16, "items": {"type": "integer", "minimum": 1, "maximum": 65535}}),
        ),
        (
            "SecretTargetSpec",
            "path_prefix",
            string("^/[!-~]{0,1023}$"),
        ),
        (
            "ReplaceAgentEnv",
            "env",
            json!({"propertyNames": string(ENV_NAME), "maxProperties": 256}),
        ),
        ("SetAgentEnvVar", "value", string("^[^\\u0000]{0,32768}$")),
        (
            "CreateSandbox",
            "labels",
            json!({"maxProperties": 64,
                   "propertyNames": string("^[^\\u0000-\\u001f\\u007f-\\u009f]{1,128}$"),
                   "additionalProperties": string("^[^\\u0000-\\u001f\\u007f-\\u009f]{0,1024}$")}),
        ),
        (
            "UpdateSandbox",
            "labels",
            json!({"maxProperties": 64,
                   "propertyNames": string("^[^\\u0000-\\u001f\\u007f-\\u009f]{1,128}$"),
                   "additionalProperties": string("^[^\\u0000-\\u001f\\u007f-\\u009f]{0,1024}$")}),
        ),
        (
            "CreateSandbox",
            "timeout_s",
            json!({"minimum": 0, "maximum": 31536000}),
        ),
        (
            "ForkSandbox",
            "labels",
            json!({"maxProperties": 64,
                   "propertyNames": string("^[^\\u0000-\\u001f\\u007f-\\u009f]{1,128}$"),
                   "additionalProperties": string("^[^\\u0000-\\u001f\\u007f-\\u009f]{0,1024}$")}),
        ),
        (
            "ForkSandbox",
            "timeout_s",
            json!({"minimum": 0, "maximum": 31536000}),
        ),
        (
            "UpdateSandbox",
            "timeout_s",
            json!({"minimum": 0, "maximum": 31536000}),
        ),
        (
            "ResumeSandbox",
            "timeout_s",
            json!({"minimum": 0, "maximum": 31536000}),
        ),
    ]
}

/// Whole schemas the generator cannot express: alternatives between fields.
fn schema_rules(schemas: &mut Map<String, Value>) {
    // A present, non-null field.
    let given = |field: &str| json!({"required": [field], "properties": {field: {"not": {"type": "null"}}}});
    if let Some(exec) = schemas.get_mut("ExecCommand") {
        // Exactly one of `command` (a shell line) and `argv`.
        exec["oneOf"] = json!([given("command"), given("argv")]);
    }
    if let Some(start) = schemas.get_mut("StartProcess") {
        // Exactly one of `command` (a shell line) and `argv`.
        start["oneOf"] = json!([given("command"), given("argv")]);
    }
    if let Some(signal) = schemas
        .get_mut("SignalProcess")
        .and_then(|s| s.pointer_mut("/properties/signal"))
    {
        // A number Linux knows, or a name (with or without `SIG`).
        let names: Vec<Value> = warren_protocol::SIGNALS
            .iter()
            .flat_map(|(name, _)| [json!(name), json!(format!("SIG{name}"))])
            .collect();
        *signal = json!({"oneOf": [
            {"type": "integer", "minimum": 1, "maximum": 64},
            {"type": "string", "enum": names},
        ], "description": "A signal by number (1 to 64) or by name."});
    }
    if let Some(create) = schemas.get_mut("CreateSandbox") {
        // The explicit identity, or an isolation scope with its ids: never both.
        let scope_fields = ["scope", "user_id", "session_id", "agent_id"].map(given);
        // A scope needs the ids it derives the owner from; an empty id is an absent one.
        let id = |field: &str| json!({"required": [field], "properties": {field: {"type": "string", "minLength": 1}}});
        let when = |scope: &str, then: Value| json!({"if": {"properties": {"scope": {"const": scope}}}, "then": then});
        create["oneOf"] = json!([
            {"allOf": [given("uid"), given("runtime_scope_id")],
             "not": {"anyOf": scope_fields}},
            {"allOf": [given("scope"),
                       when("user", json!({"anyOf": [id("user_id"), id("session_id")]})),
                       when("session", id("session_id")),
                       when("agent", id("agent_id"))],
             "not": {"anyOf": [given("uid"), given("runtime_scope_id")]}},
        ]);
    }
    for secret in ["SetEgressSecret", "NewEgressSecret"] {
        if let Some(secret) = schemas.get_mut(secret) {
            // Exactly one of a `value` and a `source`.
            secret["oneOf"] = json!([given("value"), given("source")]);
        }
    }
    if let Some(network) = schemas.get_mut("NetworkSpec") {
        // `allow` lists 1 to 256 destinations with `allowlist`, and nothing otherwise;
        // `deny` lists up to 256 with `open` and `allowlist`, and nothing with `none`.
        let deny = json!({"maxItems": 256, "items": string(DESTINATION)});
        network["oneOf"] = json!([
            {"properties": {"mode": {"const": "none"}, "allow": {"maxItems": 0},
                            "deny": {"maxItems": 0}}},
            {"properties": {"mode": {"const": "open"}, "allow": {"maxItems": 0}, "deny": deny}},
            {"properties": {"mode": {"const": "allowlist"},
                            "allow": {"minItems": 1, "maxItems": 256,
                                      "items": string(DESTINATION)},
                            "deny": deny},
             "required": ["allow"]},
        ]);
    }
    if let Some(Value::Array(variants)) = schemas
        .get_mut("SecretPresentation")
        .and_then(|p| p.get_mut("oneOf"))
    {
        // The names a presentation may set: HTTP tokens, not a header warren owns, no
        // character that would end a query parameter.
        for variant in variants {
            // Each takes its own fields only (the wire type denies the others).
            variant["additionalProperties"] = json!(false);
            let kind = variant
                .pointer("/properties/type/enum/0")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            let rules: &[(&str, Value)] = match kind.as_str() {
                "header" => &[
                    ("name", string(&header_name())),
                    ("prefix", string("^[^\\u0000-\\u001f\\u007f]{0,64}$")),
                ],
                "query" => &[("name", string("^[A-Za-z0-9!$'*.^_`|~-]{1,128}$"))],
                "basic" => &[("username", string("^[^:\\u0000-\\u001f\\u007f]*$"))],
                _ => &[],
            };
            for (property, rule) in rules {
                if let (Some(target), Value::Object(rule)) = (
                    variant.pointer_mut(&format!("/properties/{property}")),
                    rule,
                ) {
                    for (key, value) in rule {
                        target[key] = value.clone();
                    }
                }
            }
        }
    }
    if let Some(secret) = schemas.get_mut("AgentEnvValue") {
        // A bare string is a secret, and a secret is at least 6 bytes.
        secret["oneOf"][0] = json!({"type": "string", "pattern": "^[^\\u0000]{6,32768}$",
                                     "description": "A secret value: masked in command output."});
    }
    if let Some(set) = schemas.get_mut("SetAgentEnvVar") {
        set["if"] =
            json!({"not": {"properties": {"secret": {"const": false}}, "required": ["secret"]}});
        set["then"] = json!({"properties": {"value": {"minLength": 6}}});
    }
}

/// What the served document says about this server's own configuration: the backends a
/// sandbox may name, and the host directories a workdir may be filled from.
pub(crate) struct ServerFacts {
    /// The enabled backends, the default first.
    pub(crate) backends: Vec<String>,
    pub(crate) host_dirs: Vec<String>,
    /// The operator's secret sources (`network.secret_sources`).
    pub(crate) secret_sources: Vec<String>,
    pub(crate) docker: bool,
    /// The enabled backends that can run the gVisor tier on this host now (issue 19).
    pub(crate) gvisor: Vec<String>,
}

/// Narrows the document to one server's configuration ([`ServerFacts`]).
pub(crate) fn describe_server(doc: &mut Value, facts: &ServerFacts) {
    let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    let with_null = |names: &[String]| {
        let mut values: Vec<Value> = names.iter().map(|n| json!(n)).collect();
        values.push(Value::Null);
        Value::Array(values)
    };
    if let Some(backend) = schemas
        .get_mut("CreateSandbox")
        .and_then(|s| s.pointer_mut("/properties/backend"))
    {
        backend["enum"] = with_null(&facts.backends);
    }
    if !facts.docker {
        // Only the Docker backend takes an image.
        if let Some(image) = schemas
            .get_mut("CreateSandbox")
            .and_then(|s| s.pointer_mut("/properties/image"))
        {
            *image = json!({"type": "null", "description": "Only for the Docker backend, which this server does not enable."});
        }
    }
    if let Some(host_dir) = schemas
        .get_mut("InitSpec")
        .and_then(|s| s.pointer_mut("/properties/host_dir"))
    {
        host_dir["enum"] = with_null(&facts.host_dirs);
    }
    for secret in ["SetEgressSecret", "NewEgressSecret"] {
        if let Some(source) = schemas
            .get_mut(secret)
            .and_then(|s| s.pointer_mut("/properties/source"))
        {
            source["enum"] = with_null(&facts.secret_sources);
        }
    }
    if let Some(create) = schemas.get_mut("CreateSandbox") {
        describe_isolation(create, facts);
    }
}

/// The tiers a new sandbox may ask for here (issue 19): `gvisor` only on a backend that
/// can run it now, which the server otherwise refuses with 422 `isolation_unavailable`, an
/// answer schema-valid input must not get.
fn describe_isolation(create: &mut Value, facts: &ServerFacts) {
    if facts.gvisor.is_empty() {
        if let Some(isolation) = create.pointer_mut("/properties/isolation") {
            *isolation = json!({"enum": ["kernel", null], "description": "The isolation tier: only `kernel` here, since no backend of this server can run gVisor on its host."});
        }
        return;
    }
    if facts.backends.iter().all(|b| facts.gvisor.contains(b)) {
        return;
    }
    // gVisor on a named backend that runs it, or on the default one (no backend named)
    // when that one runs it.
    let default_runs_it = facts
        .backends
        .first()
        .is_some_and(|default| facts.gvisor.contains(default));
    let mut backends: Vec<Value> = facts.gvisor.iter().map(|b| json!(b)).collect();
    let mut then = json!({"properties": {"backend": {}}});
    if default_runs_it {
        backends.push(Value::Null);
    } else {
        then["required"] = json!(["backend"]);
    }
    then["properties"]["backend"]["enum"] = Value::Array(backends);
    let rule = json!({
        "if": {"properties": {"isolation": {"const": "gvisor"}}, "required": ["isolation"]},
        "then": then,
    });
    match create.get_mut("allOf").and_then(Value::as_array_mut) {
        Some(all) => all.push(rule),
        None => create["allOf"] = json!([rule]),
    }
}

/// Completes the generated document; see the module documentation.
pub(crate) fn complete(doc: &mut Value) {
    if let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    {
        for (schema, property, rule) in property_rules() {
            if let Some(target) = schemas
                .get_mut(schema)
                .and_then(|s| s.pointer_mut(&format!("/properties/{property}")))
            {
                merge(target, rule);
            }
        }
        schema_rules(schemas);
    }
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    for (path, item) in paths.iter_mut() {
        let Some(item) = item.as_object_mut() else {
            continue;
        };
        for (method, operation) in item.iter_mut() {
            if ["get", "put", "post", "delete", "patch"].contains(&method.as_str()) {
                complete_operation(path, method, operation);
            }
        }
    }
}

fn complete_operation(path: &str, method: &str, operation: &mut Value) {
    let mut shared = Vec::new();
    let secured = operation
        .get("security")
        .and_then(Value::as_array)
        .is_some_and(|s| !s.is_empty());
    if secured {
        shared.push(("401", "unauthorized: no Bearer token, or not this server's"));
    }
    let fenced = is_fenced(path, method);
    if fenced {
        fence_operation(operation);
    }
    if let Some(parameters) = operation
        .get_mut("parameters")
        .and_then(Value::as_array_mut)
    {
        let mut checked = false;
        for parameter in parameters.iter_mut() {
            let location = parameter["in"].as_str().unwrap_or("").to_owned();
            let name = parameter["name"].as_str().unwrap_or("").to_owned();
            if let Some(schema) = parameter_schema(path, &location, &name) {
                parameter["schema"] = schema;
                checked = true;
            }
        }
        if checked {
            shared.push((
                "400",
                "a path or query parameter is malformed (invalid_sandbox_id, invalid_uid, \
                 invalid_path, invalid_query, invalid_path_parameter, invalid_page_token, ...)",
            ));
        }
    }
    if path.contains("{id}") {
        shared.push(("404", "sandbox_not_found"));
    }
    if writes_to_a_workspace(path, method) {
        shared.push((
            "507",
            "quota_exceeded: the uid's storage quota is full (I23), or insufficient_storage: \
             the server's data disk is",
        ));
    }
    if path.starts_with("/v1/") {
        // Every /v1 operation reads or writes the state store.
        shared.push((
            "503",
            "state_store_unavailable: the state store cannot be reached (a PostgreSQL server \
             restarting, a broken network); nothing was half-done, try again shortly. Among \
             replicas (cluster mode), operations on a sandbox's runtime may also answer \
             node_unreachable (its owner is out of reach; a takeover follows once its lease \
             lapses), node_fenced (this replica lost the store and fenced itself), \
             runtime_elsewhere or runtime_moved: each is retryable",
        ));
    }
    if let Some(body) = operation.get_mut("requestBody") {
        complete_body(body);
        shared.push(("413", "body_too_large"));
        if body.pointer("/content/application~1json").is_some() {
            shared.push((
                "400",
                "invalid_json: the body is not the documented JSON object",
            ));
        }
    }
    let responses = operation
        .as_object_mut()
        .map(|o| o.entry("responses").or_insert_with(|| json!({})));
    let Some(responses) = responses.and_then(Value::as_object_mut) else {
        return;
    };
    if fenced {
        // Added to what the operation documents already under these statuses.
        for (status, what) in [
            (
                "409",
                "fence_stale: X-Warren-Fence is older than the newest execution guard token; nothing was changed",
            ),
            (
                "400",
                "fence_invalid: X-Warren-Fence is malformed or was never issued for this sandbox",
            ),
        ] {
            let response = responses
                .entry(status)
                .or_insert_with(|| json!({"description": ""}));
            let before = response["description"].as_str().unwrap_or("").to_owned();
            response["description"] = json!(if before.is_empty() {
                what.to_owned()
            } else {
                format!("{before}; {what}")
            });
        }
    }
    for (status, description) in shared {
        let response = responses
            .entry(status)
            .or_insert_with(|| json!({"description": description}));
        // Every error answer is warren's error JSON.
        response["content"] = json!({"application/json": {"schema":
            {"$ref": "#/components/schemas/ErrorBody"}}});
    }
    for (status, response) in responses.iter_mut() {
        if status.starts_with('4') || status.starts_with('5') {
            response["content"] = json!({"application/json": {"schema":
                {"$ref": "#/components/schemas/ErrorBody"}}});
        }
    }
}

/// Declares `X-Warren-Fence` on a fenced operation.
fn fence_operation(operation: &mut Value) {
    let Some(object) = operation.as_object_mut() else {
        return;
    };
    let parameters = object.entry("parameters").or_insert_with(|| json!([]));
    if let Some(parameters) = parameters.as_array_mut() {
        parameters.push(json!({
            "name": FENCE_HEADER,
            "in": "header",
            "required": false,
            "description": "The token of the execution guard the caller holds (POST /v1/sandboxes/{id}/guard). Refused with 409 fence_stale once a newer token was issued; without it the request is not fenced.",
            "schema": string(FENCE_TOKEN),
        }));
    }
}

/// Operations that write into a uid's UserWorkspace, so a full quota or disk fails them:
/// file writes, creating a workdir (also through a sandbox's creation) and its
/// initialisation, and restoring a checkpoint.
pub(crate) fn writes_to_a_workspace(path: &str, method: &str) -> bool {
    let file_write = path.contains("/files") && method != "get";
    let workdir_create = method == "post"
        && (path.ends_with("/workdirs") || path == "/v1/sandboxes" || path.ends_with("/restore"));
    file_write || workdir_create
}

/// An optional body is absent or the object, never `null` (the server refuses `null`); raw
/// bytes are a binary string, not an array of numbers.
fn complete_body(body: &mut Value) {
    let mut optional = false;
    let Some(content) = body.get_mut("content").and_then(Value::as_object_mut) else {
        return;
    };
    for (media_type, entry) in content.iter_mut() {
        if media_type == "application/octet-stream" {
            entry["schema"] = json!({"type": "string", "format": "binary"});
            continue;
        }
        let object: Option<Value> = entry
            .pointer("/schema/oneOf")
            .and_then(Value::as_array)
            .and_then(|alternatives| {
                let mut objects = alternatives
                    .iter()
                    .filter(|a| a.get("type") != Some(&json!("null")));
                match (objects.next(), objects.next()) {
                    (Some(object), None) if alternatives.len() == 2 => Some(object.clone()),
                    _ => None,
                }
            });
        if let Some(object) = object {
            entry["schema"] = object;
            optional = true;
        }
    }
    if optional {
        body["required"] = json!(false);
    }
}

fn merge(target: &mut Value, rule: Value) {
    let (Some(target), Value::Object(rule)) = (target.as_object_mut(), rule) else {
        return;
    };
    for (key, value) in rule {
        if key == "type" {
            continue;
        }
        target.insert(key, value);
    }
}
