"""The workspace byte stream `persist_workspace()` returns in checkpoint mode.

The Agents SDK stores whatever `persist_workspace()` returns in its snapshot (a local
file, a remote store) and gives it back to `hydrate_workspace()`. With warren the files
already live in the uid's persistent workspace and a checkpoint records them cheaply
(only new chunks are stored), so the stream is a small reference to that checkpoint, not
the files: a magic line and a JSON body. A stream without the magic is a portable tar
archive (what `tar` mode and the SDK's other backends produce).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

MAGIC = b"WARREN_CHECKPOINT_REF_V1\n"


@dataclass(frozen=True)
class CheckpointRef:
    """A warren checkpoint of one workdir, and the sandbox that can restore it."""

    sandbox_id: str
    uid: str
    workdir: str
    checkpoint_id: str

    def encode(self) -> bytes:
        body = {
            "sandbox_id": self.sandbox_id,
            "uid": self.uid,
            "workdir": self.workdir,
            "checkpoint_id": self.checkpoint_id,
        }
        return MAGIC + json.dumps(body, sort_keys=True).encode("utf-8")

    @classmethod
    def decode(cls, raw: bytes) -> CheckpointRef | None:
        """The reference in `raw`, or None when `raw` is not one (a tar archive).

        Raises ValueError when `raw` has the magic but a damaged body."""
        if not raw.startswith(MAGIC):
            return None
        try:
            body = json.loads(raw[len(MAGIC):].decode("utf-8"))
            return cls(
                sandbox_id=str(body["sandbox_id"]),
                uid=str(body["uid"]),
                workdir=str(body["workdir"]),
                checkpoint_id=str(body["checkpoint_id"]),
            )
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as error:
            raise ValueError(f"damaged warren checkpoint reference: {error}") from error
