"""Pin the OpenAI component schemas the conformance suite validates against.

    python tests/conformance/pin_schemas.py OPENAPI_JSON --commit SHA > tests/conformance/openai_schemas.json

OPENAPI_JSON is `openapi.json` of github.com/openai/openai-openapi (the same document as its
openapi.yaml). Only the schemas reachable from ROOTS are kept, unchanged, with the spec's version,
the source repository and commit in a `source` header.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

SOURCE_REPO = "https://github.com/openai/openai-openapi"
ROOTS = (
    "CreateChatCompletionResponse",
    "CreateChatCompletionStreamResponse",
    "CreateCompletionResponse",
    "CreateEmbeddingResponse",
    "ListModelsResponse",
    "Model",
    "ErrorResponse",
    "Response",
    "ResponseStreamEvent",
)


def _refs(node: Any, found: set[str]) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str) and value.startswith("#/components/schemas/"):
                found.add(value.rsplit("/", 1)[1])
            else:
                _refs(value, found)
    elif isinstance(node, list):
        for value in node:
            _refs(value, found)


def reachable(schemas: dict[str, Any], roots: tuple[str, ...]) -> dict[str, Any]:
    kept: dict[str, Any] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in kept:
            continue
        kept[name] = schemas[name]
        found: set[str] = set()
        _refs(schemas[name], found)
        todo.extend(found - kept.keys())
    return dict(sorted(kept.items()))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("openapi_json")
    parser.add_argument("--commit", required=True, help="the openai-openapi commit the file was taken from")
    args = parser.parse_args()
    with open(args.openapi_json, encoding="utf-8") as f:
        spec = json.load(f)
    pinned = {
        "source": {"repository": SOURCE_REPO, "commit": args.commit, "file": "openapi.json (= openapi.yaml)",
                   "openapi": spec["openapi"], "info.version": spec["info"]["version"], "roots": list(ROOTS)},
        "components": {"schemas": reachable(spec["components"]["schemas"], ROOTS)},
    }
    json.dump(pinned, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
