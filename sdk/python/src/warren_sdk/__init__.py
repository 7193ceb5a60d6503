"""warren's Python SDK: typed sync and async clients of warren's `/v1` API.

    from warren_sdk import Warren
    w = Warren()                      # WARREN_URL, WARREN_TOKEN
    sbx = w.sandboxes.create(uid="alice", runtime_scope_id="thread-1")
    print(w.sandboxes.exec(sbx["sandbox_id"], command="echo hi")["stdout"])
"""

from ._generated import OPERATIONS
from ._transport import Body, WarrenError
from .client import AsyncWarren, Warren

__all__ = ["AsyncWarren", "Body", "OPERATIONS", "Warren", "WarrenError"]
__version__ = "0.1.0"
