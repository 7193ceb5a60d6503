"""langchain-tests' standard `SandboxIntegrationTests`, unchanged, against warren's E2B
drop-in through E2B's own deepagents backend (`langchain-e2b`), on the suite's default
root `/tmp/test_sandbox_ops/`: the runtime's own tree, served by its agent (issue 42).

The environment (E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL) names the warren under test.
"""

from collections.abc import Iterator

import pytest
from e2b import Sandbox
from langchain_e2b import E2BSandbox
from langchain_tests.integration_tests import SandboxIntegrationTests


class TestWarrenThroughE2B(SandboxIntegrationTests):
    @pytest.fixture(scope="class")
    def sandbox(self) -> Iterator[E2BSandbox]:
        sbx = Sandbox.create(timeout=600)
        try:
            yield E2BSandbox(sandbox=sbx)
        finally:
            sbx.kill()
