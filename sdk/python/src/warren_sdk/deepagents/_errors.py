"""How warren's stable error codes (docs/errors.md) become the errors deepagents' backend
protocol speaks.

deepagents wants two kinds of failure: the few `FileOperationError` literals of
`upload_files`/`download_files` (`file_not_found`, `permission_denied`, `is_directory`,
`invalid_path`), and short strings in the `error` of every other result, which the model
reads and can act on (a missing file, an ambiguous edit). A failure the model cannot fix
(the sandbox is gone, the token is wrong, warren itself failed) is not dressed up as a
result: it raises, as deepagents' own sandboxes do.
"""

from __future__ import annotations

from warren_sdk import WarrenError

# Codes that describe the file or the request's arguments: the model can act on them.
FILE_CODES = frozenset({
    "already_exists", "directory_not_empty", "edit_ambiguous", "edit_no_match", "file_busy",
    "invalid_edit", "invalid_glob", "invalid_name", "invalid_path", "invalid_regex",
    "is_a_directory", "link_loop", "mount_crossing_refused", "not_a_directory", "not_a_file",
    "not_found", "not_in_outputs", "not_utf8", "permission_denied", "precondition_failed",
    "quota_exceeded", "read_only", "root_refused", "symlink_refused", "too_deep", "too_large",
    "too_many_entries",
})

# Codes of an exec the model can fix by running something else.
EXEC_CODES = frozenset({
    "invalid_cwd", "invalid_env", "invalid_request", "process_not_started", "token_in_command",
    "token_in_env", "too_many_processes",
})

_FILE_OPERATION_ERRORS = {
    "not_found": "file_not_found",
    "permission_denied": "permission_denied",
    "read_only": "permission_denied",
    "root_refused": "permission_denied",
    "mount_crossing_refused": "permission_denied",
    "is_a_directory": "is_directory",
    "invalid_path": "invalid_path",
    "invalid_name": "invalid_path",
    "not_a_directory": "invalid_path",
    "not_a_file": "invalid_path",
    "symlink_refused": "invalid_path",
    "link_loop": "invalid_path",
}

# The words deepagents' own sandbox uses in `File '<path>': <reason>` errors.
_REASONS = {
    "not_found": "file_not_found",
    "permission_denied": "permission_denied",
    "read_only": "permission_denied",
    "is_a_directory": "is_directory",
    "not_a_directory": "not_a_directory",
    "not_a_file": "not_a_file",
}


def file_operation_error(err: WarrenError) -> str:
    """The `FileOperationError` literal for an upload/download failure, or warren's own
    `code: message` when no literal fits (the protocol allows a backend-specific string)."""
    return _FILE_OPERATION_ERRORS.get(err.code, f"{err.code}: {err.message}")


def reason(err: WarrenError) -> str:
    """A short reason for an `error` string: deepagents' word for the common failures,
    warren's code and message for the rest (warren's messages name only virtual paths)."""
    return _REASONS.get(err.code) or f"{err.code}: {err.message}"


def raise_unless(err: WarrenError, codes: frozenset[str]) -> None:
    """Re-raise `err` unless it is one of `codes` (a failure the model can act on)."""
    if err.code not in codes:
        raise err
