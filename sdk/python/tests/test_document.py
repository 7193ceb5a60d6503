"""The SDK and warren's OpenAPI document cannot disagree: `_generated.py` is what the
generator makes of the document `warren openapi` prints, and the live server serves no
operation the SDK lacks (nor the reverse)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from warren_sdk import Warren, _generated

ROOT = Path(__file__).resolve().parents[1]


def _generator():
    spec = importlib.util.spec_from_file_location("generate", ROOT / "tools" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def _document() -> dict:
    binary = os.environ.get("WARREN_BIN")
    if not binary:
        raise RuntimeError("set WARREN_BIN to the warren binary under test")
    return json.loads(subprocess.run([binary, "openapi"], check=True, capture_output=True).stdout)


def test_the_generated_client_is_what_the_document_makes_of_it():
    rendered = _generator().render(_document())
    committed = (ROOT / "src" / "warren_sdk" / "_generated.py").read_text()
    assert rendered == committed, (
        "sdk/python/src/warren_sdk/_generated.py is not the OpenAPI document's: run "
        "`warren openapi > /tmp/openapi.json && python sdk/python/tools/generate.py "
        "/tmp/openapi.json > sdk/python/src/warren_sdk/_generated.py` and commit it"
    )


def test_every_operation_the_live_server_serves_is_in_the_sdk_and_the_reverse(warren: Warren):
    served = warren.transport.request("GET", "/v1/openapi.json", expect="json")
    live = {
        (method.upper(), path)
        for path, item in served["paths"].items()
        for method in item
        if method in {"get", "post", "put", "patch", "delete"}
    }
    covered = set(_generated.OPERATIONS) | set(_generated.HAND_WRITTEN)
    assert live - covered == set(), "the server serves operations the SDK lacks"
    assert covered - live == set(), "the SDK has operations the server does not serve"


def test_a_changed_document_changes_the_generated_client():
    # The check above can fail: an operation added to the document shows in the output.
    document = _document()
    document["paths"]["/v1/sandboxes/{id}/brand-new"] = {
        "post": {"operationId": "brand_new", "tags": ["sandboxes"],
                 "parameters": [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}],
                 "responses": {"204": {"description": "done"}}}
    }
    rendered = _generator().render(document)
    assert '("POST", "/v1/sandboxes/{id}/brand-new")' in rendered
    assert "def brand_new(self, sandbox_id: str) -> None:" in rendered


def test_two_operations_with_one_name_are_refused_by_the_generator():
    document = _document()
    document["paths"]["/v1/sandboxes/{id}/exec2"] = {
        "post": {"operationId": "exec", "tags": ["sandboxes"], "responses": {"200": {"description": ""}}}
    }
    with pytest.raises(SystemExit, match="both sandboxes.exec"):
        _generator().render(document)


def test_the_sdk_and_its_backends_type_check_under_mypy_strict(tmp_path: Path):
    # The TypedDicts and signatures are the document's: code using them wrongly, or a
    # generated annotation that means something else in its class, fails here.
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path), str(ROOT / "src" / "warren_sdk")],
        capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
