#!/usr/bin/env python3
"""A smolagents `CodeAgent` with its E2B executor (`executor_type="e2b"`) against warren's E2B
API (issue 36).

Run by crates/warren/tests/suite/e2b_code.rs:

    python smolagents_agent.py

with the E2B SDK's own environment (`E2B_API_KEY`, `E2B_API_URL`, `E2B_SANDBOX_URL`), which
smolagents' `E2BExecutor` hands on untouched to `e2b_code_interpreter.Sandbox.create`. The
model is scripted, not a language model: its first reply is a code block that leaves state in
the sandbox's kernel, its second calls `final_answer` on that state, so the answer can only be
right if both steps ran in the same kernel. The agent's sandbox is killed at the end
(`agent.cleanup()`). Prints `SCENARIO PASSED` when the agent answered 90.
"""

import faulthandler
import os
import sys
import traceback
import uuid
from importlib.metadata import version

from e2b import SandboxQuery
from e2b_code_interpreter import Sandbox
from smolagents import ChatMessage, CodeAgent, Model
from smolagents.models import MessageRole
from smolagents.monitoring import TokenUsage

VERSIONS = f"smolagents {version('smolagents')}, e2b-code-interpreter {version('e2b-code-interpreter')}"
RUN = os.environ.get("WARREN_E2B_RUN") or f"smolagents-{uuid.uuid4().hex[:12]}"

# CodeAgent's default code block tags are `<code>` and `</code>`.
REPLIES = [
    "Thought: I sum the first ten integers and keep the sum.\n"
    "<code>\nx = sum(range(10))\nprint(x)\n</code>",
    "Thought: x holds the sum; the answer is twice that.\n"
    "<code>\nfinal_answer(x * 2)\n</code>",
]


class ScriptedModel(Model):
    """Answers each call with the next scripted reply; a call past the script fails."""

    def __init__(self, replies):
        super().__init__(model_id="scripted")
        self.replies = list(replies)
        self.calls = 0

    def generate(self, messages, stop_sequences=None, response_format=None,
                 tools_to_call_from=None, **kwargs):
        if self.calls >= len(self.replies):
            raise AssertionError(
                f"the model was called {self.calls + 1} times; the script has {len(self.replies)} "
                "replies (an earlier step failed?)"
            )
        reply = self.replies[self.calls]
        self.calls += 1
        return ChatMessage(
            role=MessageRole.ASSISTANT,
            content=reply,
            token_usage=TokenUsage(input_tokens=0, output_tokens=0),
        )


def check(condition, what, *context):
    if not condition:
        detail = "".join(f"\n    {c!r}" for c in context)
        raise AssertionError(f"[{VERSIONS}] {what}{detail}")


def main():
    faulthandler.dump_traceback_later(int(os.environ.get("WARREN_E2B_HANG_S", "150")), exit=True)
    print(f"a smolagents CodeAgent (e2b executor) with {VERSIONS} against "
          f"{os.environ['E2B_API_URL']}", flush=True)
    model = ScriptedModel(REPLIES)
    agent = None
    try:
        agent = CodeAgent(
            tools=[],
            model=model,
            executor_type="e2b",
            executor_kwargs={"metadata": {"run": RUN, "scenario": "smolagents"}, "timeout": 300},
            max_steps=4,
        )
        sandbox = agent.python_executor.sandbox
        check(isinstance(sandbox, Sandbox), "the executor's sandbox is e2b_code_interpreter's",
              type(sandbox))
        sandbox_id = sandbox.sandbox_id
        print(f"the executor's sandbox: {sandbox_id}", flush=True)

        answer = agent.run("What is twice the sum of the integers below ten?")
        steps = agent.memory.steps
        failures = [(type(s).__name__, str(s.error)) for s in steps
                    if getattr(s, "error", None) is not None]
        check(failures == [], "no step failed", failures)
        check(answer == 90 and type(answer) is int, f"the agent's answer: got {answer!r}, want 90")
        check(model.calls == 2, f"the model was called {model.calls} times, want 2")
        observations = [getattr(s, "observations", None) for s in steps]
        check(any(o and "45" in o for o in observations),
              "the first step's execution logs show 45", observations)
        print(f"ok: the agent answered {answer} in {model.calls} steps", flush=True)

        agent.cleanup()
        agent = None
        query = SandboxQuery(metadata={"run": RUN})
        listed = [s.sandbox_id for s in Sandbox.list(query=query).next_items()]
        check(sandbox_id not in listed, "agent.cleanup() killed the executor's sandbox",
              sandbox_id, listed)
        print("ok: agent.cleanup() killed the executor's sandbox", flush=True)
    except BaseException:
        traceback.print_exc()
        print("SCENARIO FAILED: smolagents", flush=True)
        sys.exit(1)
    finally:
        if agent is not None:
            try:
                agent.cleanup()
            except Exception:  # noqa: BLE001 - best effort
                traceback.print_exc()
    print("SCENARIO PASSED: smolagents", flush=True)


if __name__ == "__main__":
    main()
