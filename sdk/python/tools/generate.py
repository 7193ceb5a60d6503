"""Writes `src/warren_sdk/_generated.py` from warren's OpenAPI document.

    python tools/generate.py openapi.json > src/warren_sdk/_generated.py

The document is the one `warren openapi` prints (or `GET /v1/openapi.json` serves). Every
schema becomes a `TypedDict`, every operation a method of its group, once for the sync
client and once for the async one, so the SDK and the server cannot drift: the test
suite regenerates this file from the live server's document and fails on any difference.
Only the generated text's shape is decided here; how a request travels (auth, retries,
errors) is `_transport.py`'s.
"""

from __future__ import annotations

import json
import keyword
import re
import sys
from typing import Any

# Where an operation lives in the SDK, when its tag and operationId would read badly or
# collide: (method, path) -> (group, method name).
PLACES: dict[tuple[str, str], tuple[str, str]] = {
    ("get", "/health"): ("server", "health"),
    ("get", "/metrics"): ("server", "metrics"),
    ("get", "/v1/cluster"): ("server", "cluster"),
    ("get", "/v1/users/{uid}/usage"): ("users", "usage"),
    ("get", "/v1/sandboxes/{id}/snapshots"): ("snapshots", "list"),
    ("post", "/v1/sandboxes/{id}/snapshots"): ("snapshots", "create"),
    ("post", "/v1/users/{uid}/snapshots/gc"): ("snapshots", "gc"),
    ("get", "/v1/sandboxes/{id}/runs"): ("runs", "of_sandbox"),
    ("get", "/v1/users/{uid}/runs"): ("runs", "of_user"),
    ("post", "/v1/viewer-links"): ("viewer", "create_link"),
}

# Operations the generated methods do not cover, and the hand-written method that does.
HAND_WRITTEN: dict[tuple[str, str], str] = {
    # A WebSocket: `Warren.processes.attach` is not generated; stdin, output and resize
    # over HTTP give the same terminal (see client.py).
    ("get", "/v1/sandboxes/{id}/processes/{pid}/attach"): "processes.stdin/output/resize",
    # A stream that never ends by itself: `client.watch(...)`, an iterator of events.
    ("get", "/v1/sandboxes/{id}/watch"): "watch",
}

# Path parameters' Python names.
PATH_NAMES = {"id": "sandbox_id"}

HEADER_NAMES = {
    "X-Warren-Fence": "fence",
    "If-Match": "if_match",
    "If-None-Match": "if_none_match",
    "X-Warren-Requested-By": "requested_by",
    "Range": "range",
}

PRIMITIVES = {"string": "str", "integer": "int", "boolean": "bool", "number": "float"}


def py_name(name: str) -> str:
    name = re.sub(r"[^0-9a-zA-Z_]", "_", name)
    return name + "_" if keyword.iskeyword(name) or name in {"from", "type"} else name


def type_of(schema: dict[str, Any] | bool | None) -> str:
    """The Python annotation of a JSON schema."""
    if not isinstance(schema, dict):
        return "Any"
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[1]
    for key in ("oneOf", "anyOf"):
        if key in schema:
            options = []
            for option in schema[key]:
                text = type_of(option)
                if text not in options:
                    options.append(text)
            if "Any" in options:
                return "Any"
            return " | ".join([o for o in options if o != "None"] + (["None"] if "None" in options else []))
    if "allOf" in schema and len(schema["allOf"]) == 1:
        return type_of(schema["allOf"][0])
    if "enum" in schema and all(isinstance(v, str) for v in schema["enum"]):
        return "Literal[" + ", ".join(json.dumps(v) for v in schema["enum"]) + "]"
    if "const" in schema and isinstance(schema["const"], str):
        return f"Literal[{json.dumps(schema['const'])}]"
    kind = schema.get("type")
    if isinstance(kind, list):
        parts = [type_of({**schema, "type": k}) for k in kind if k != "null"]
        text = " | ".join(dict.fromkeys(parts)) or "None"
        return f"{text} | None" if "null" in kind else text
    if kind in PRIMITIVES:
        return PRIMITIVES[kind]
    if kind == "null":
        return "None"
    if kind == "array":
        # `builtins.`: a group's method named `list` would shadow the type in its class.
        return f"builtins.list[{type_of(schema.get('items'))}]"
    if kind == "object":
        extra = schema.get("additionalProperties")
        if not schema.get("properties") and isinstance(extra, dict):
            return f"dict[str, {type_of(extra)}]"
        return "dict[str, Any]"
    return "Any"


def docstring(text: str | None, indent: str) -> list[str]:
    if not text:
        return []
    text = text.strip().replace("\\", "\\\\").replace('"""', "'''")
    lines = text.splitlines()
    if len(lines) == 1:
        return [f'{indent}"""{lines[0]}"""']
    return [f'{indent}"""{lines[0]}'] + [f"{indent}{line}".rstrip() for line in lines[1:]] + [f'{indent}"""']


def schema_types(schemas: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for name, schema in sorted(schemas.items()):
        properties = schema.get("properties")
        if schema.get("type") == "object" and properties:
            required = set(schema.get("required", []))
            fields = []
            for prop, sub in properties.items():
                annotation = type_of(sub)
                if prop in required:
                    annotation = f"Required[{annotation}]"
                description = sub.get("description") if isinstance(sub, dict) else None
                fields.append((prop, annotation, (description or "").strip().splitlines()[:1]))
            if all(prop.isidentifier() and not keyword.iskeyword(prop) for prop, _, _ in fields):
                out.append(f"class {name}(TypedDict, total=False):")
                out += docstring(schema.get("description"), "    ")
                for prop, annotation, description in fields:
                    out += [f"    # {line}" for line in description]
                    out.append(f"    {prop}: {annotation}")
            else:
                # A key that is no Python name (`from`): the functional form.
                out += [f"# {line}" for line in (schema.get("description") or "").strip().splitlines()[:1]]
                out.append(f"{name} = TypedDict(")
                out.append(f"    {json.dumps(name)},")
                out.append("    {")
                for prop, annotation, description in fields:
                    out += [f"        # {line}" for line in description]
                    out.append(f"        {json.dumps(prop)}: {annotation},")
                out.append("    },")
                out.append("    total=False,")
                out.append(")")
            out.append("")
            out.append("")
        else:
            out.append(f"{name}: TypeAlias = {json.dumps(type_of(schema))}")
            out += [f"# {line}" for line in (schema.get("description") or "").strip().splitlines()[:1]]
            out.append("")
            out.append("")
    return out


class Operation:
    def __init__(self, method: str, path: str, spec: dict[str, Any], schemas: dict[str, Any]):
        self.method = method
        self.path = path
        self.spec = spec
        tag = (spec.get("tags") or ["server"])[0]
        self.group, self.name = PLACES.get((method, path), (tag, spec["operationId"]))
        self.path_params: list[tuple[str, str, str]] = []  # (wire, python, type)
        self.query: list[tuple[str, str, str, bool]] = []  # (wire, python, type, required)
        self.headers: list[tuple[str, str]] = []  # (wire, python)
        for param in spec.get("parameters", []):
            where, wire = param["in"], param["name"]
            annotation = type_of(param.get("schema"))
            if where == "path":
                self.path_params.append((wire, PATH_NAMES.get(wire, py_name(wire)), annotation))
            elif where == "query":
                self.query.append((wire, py_name(wire), annotation, bool(param.get("required"))))
            elif where == "header":
                python = HEADER_NAMES.get(wire) or py_name(wire.lower().removeprefix("x-warren-"))
                self.headers.append((wire, python))
        body = spec.get("requestBody", {}).get("content", {})
        self.raw_body = "application/octet-stream" in body
        self.body_fields: list[tuple[str, str, str, bool]] = []
        if "application/json" in body:
            schema = body["application/json"].get("schema", {})
            if "$ref" in schema:
                schema = schemas[schema["$ref"].rsplit("/", 1)[1]]
            required = set(schema.get("required", []))
            taken = {p for _, p, _ in self.path_params} | {p for _, p, _, _ in self.query}
            for prop, sub in schema.get("properties", {}).items():
                python = py_name(prop)
                if python in taken:
                    python += "_body"
                self.body_fields.append((prop, python, type_of(sub), prop in required))
        self.returns, self.expect = self._returns()

    def _returns(self) -> tuple[str, str]:
        responses = {k: v for k, v in self.spec["responses"].items() if k.startswith("2")}
        if "206" in responses:
            # Ranges are of bytes: an operation that answers one returns bytes.
            return "Body", "bytes"
        types, expects = [], []
        for _, response in sorted(responses.items()):
            content = response.get("content", {})
            if "application/json" in content:
                types.append(type_of(content["application/json"].get("schema")))
                expects.append("json")
            elif "application/octet-stream" in content or "application/openmetrics-text" in content:
                types.append("Body")
                expects.append("bytes")
            elif not content and "204" in responses and len(responses) == 1:
                types.append("None")
                expects.append("none")
            else:
                types.append("Any")
                expects.append("any")
        types = list(dict.fromkeys(types))
        expect = expects[0] if len(set(expects)) == 1 else ("bytes" if "bytes" in expects else "any")
        return ("Any" if "Any" in types else " | ".join(types)), expect

    def signature(self) -> list[str]:
        args = ["self"] + [f"{python}: {annotation}" for _, python, annotation in self.path_params]
        if self.raw_body:
            args.append("content: bytes")
        keyword_only = []
        for _, python, annotation, required in self.query + self.body_fields:
            if required:
                keyword_only.append(f"{python}: {annotation}")
        for _, python, annotation, required in self.query + self.body_fields:
            if not required:
                optional = annotation if "None" in annotation.split(" | ") else f"{annotation} | None"
                keyword_only.append(f"{python}: {optional} = None")
        for _, python in self.headers:
            keyword_only.append(f"{python}: str | int | None = None")
        if keyword_only:
            args.append("*")
            args += keyword_only
        return args

    def call(self) -> list[str]:
        path = self.path
        for wire, python, _ in self.path_params:
            path = path.replace("{" + wire + "}", "{_seg(" + python + ")}")
        parts = [json.dumps(self.method.upper()), ("f" if "{" in path else "") + json.dumps(path)]
        if self.query:
            parts.append("params={" + ", ".join(f"{json.dumps(w)}: {p}" for w, p, _, _ in self.query) + "}")
        if self.body_fields:
            parts.append("json={" + ", ".join(f"{json.dumps(w)}: {p}" for w, p, _, _ in self.body_fields) + "}")
        elif "requestBody" in self.spec and not self.raw_body:
            parts.append("json={}")
        if self.raw_body:
            parts.append("content=content")
        if self.headers:
            parts.append("headers={" + ", ".join(f"{json.dumps(w)}: {p}" for w, p in self.headers) + "}")
        parts.append(f"expect={json.dumps(self.expect)}")
        return parts


def operations(document: dict[str, Any]) -> list[Operation]:
    schemas = document.get("components", {}).get("schemas", {})
    found = []
    for path, item in document["paths"].items():
        for method, spec in item.items():
            if method not in {"get", "post", "put", "patch", "delete"}:
                continue
            if (method, path) in HAND_WRITTEN:
                continue
            found.append(Operation(method, path, spec, schemas))
    names: dict[tuple[str, str], str] = {}
    for op in found:
        key = (op.group, op.name)
        if key in names:
            raise SystemExit(f"{op.method} {op.path} and {names[key]} are both {op.group}.{op.name}: add one to PLACES")
        names[key] = f"{op.method} {op.path}"
    return found


def render(document: dict[str, Any]) -> str:
    ops = operations(document)
    out = [
        '"""Generated by tools/generate.py from warren\'s OpenAPI document '
        f'(version {document["info"]["version"]}): do not edit."""',
        "",
        "from __future__ import annotations",
        "",
        "import builtins",
        "from typing import Any, Literal, Required, TypeAlias, TypedDict, cast",
        "",
        "from ._transport import AsyncTransport, Body, SyncTransport, _seg",
        "",
        "# The operations this file covers, as (METHOD, path template): the tests compare them",
        "# with the live server's document.",
        "OPERATIONS: frozenset[tuple[str, str]] = frozenset({",
    ]
    out += [f"    ({json.dumps(op.method.upper())}, {json.dumps(op.path)})," for op in sorted(ops, key=lambda o: (o.path, o.method))]
    out += ["})", "", "# Operations a hand-written method covers instead (see client.py).", "HAND_WRITTEN: dict[tuple[str, str], str] = {"]
    out += [f"    ({json.dumps(m.upper())}, {json.dumps(p)}): {json.dumps(how)}," for (m, p), how in sorted(HAND_WRITTEN.items())]
    out += ["}", "", ""]
    out += schema_types(document.get("components", {}).get("schemas", {}))
    groups: dict[str, list[Operation]] = {}
    for op in ops:
        groups.setdefault(op.group, []).append(op)
    for flavour in ("sync", "async"):
        for group, members in sorted(groups.items()):
            base = "SyncTransport" if flavour == "sync" else "AsyncTransport"
            cls = ("" if flavour == "sync" else "Async") + group.title().replace("_", "") + "Api"
            out.append(f"class {cls}:")
            out.append(f'    """`{group}`: {len(members)} operations ({flavour})."""')
            out.append("")
            out.append(f"    def __init__(self, transport: {base}) -> None:")
            out.append("        self._t = transport")
            for op in sorted(members, key=lambda o: o.name):
                out.append("")
                prefix = "def" if flavour == "sync" else "async def"
                line = f"    {prefix} {op.name}({', '.join(op.signature())}) -> {op.returns}:"
                if len(line) <= 100:
                    out.append(line)
                else:
                    out.append(f"    {prefix} {op.name}(")
                    out += [f"        {arg}," for arg in op.signature()]
                    out.append(f"    ) -> {op.returns}:")
                summary = op.spec.get("summary") or op.spec.get("description")
                doc = docstring(f"`{op.method.upper()} {op.path}`\n\n{summary or ''}".strip(), "        ")
                out += doc
                awaiting = "" if flavour == "sync" else "await "
                if op.returns == "None":
                    out.append(f"        {awaiting}self._t.request(")
                elif op.returns == "Any":
                    out.append(f"        return {awaiting}self._t.request(")
                else:
                    out.append(f"        return cast({json.dumps(op.returns)}, {awaiting}self._t.request(")
                for part in op.call():
                    name, brace, rest = part.partition("={")
                    if brace and len(part) > 80:
                        out.append(f"            {name}={{")
                        out += [f"                {item}," for item in rest[:-1].split(", ")]
                        out.append("            },")
                    else:
                        out.append(f"            {part},")
                out.append("        )" if op.returns in ("Any", "None") else "        ))")
            out.append("")
            out.append("")
    for flavour in ("sync", "async"):
        cls = "Groups" if flavour == "sync" else "AsyncGroups"
        base = "SyncTransport" if flavour == "sync" else "AsyncTransport"
        out.append(f"class {cls}:")
        out.append(f'    """Every group of operations ({flavour})."""')
        out.append("")
        out.append(f"    def __init__(self, transport: {base}) -> None:")
        for group in sorted(groups):
            name = ("" if flavour == "sync" else "Async") + group.title().replace("_", "") + "Api"
            out.append(f"        self.{group} = {name}(transport)")
        out.append("")
        out.append("")
    while out and out[-1] == "":
        out.pop()
    return "\n".join(out) + "\n"


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as file:
        document = json.load(file)
    sys.stdout.write(render(document))


if __name__ == "__main__":
    main()
