"""Schema fuzzing: schemathesis generates requests from the gateway's own /openapi.json (valid
ones and invalid ones) and sends them to a real gateway serving the real in-process llama.cpp.
No answer may be a 5xx, use a status the schema does not list, or break its documented shape.

Bounded: a fixed number of examples per operation and mode (FUZZ_EXAMPLES, default 50), derandomised,
max_tokens at most 4. It prints the counts it ran (FUZZ_SHOW=1: every 4xx/5xx answer to a valid request)."""

from __future__ import annotations

import collections
import copy
import os
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tests.gateway_process import RunningGateway

pytestmark = pytest.mark.integration
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "50"))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def bounded(spec: dict[str, Any], models: list[str]) -> dict[str, Any]:
    """The published schema, narrowed for a short run: the served model ids, at most 4 new
    tokens, few messages. Everything else is fuzzed as published."""
    spec = copy.deepcopy(spec)
    schemas = spec["components"]["schemas"]
    for name in ("ChatCompletionRequest", "CompletionRequest", "EmbeddingRequest", "ResponsesRequest",
                 "MessagesRequest", "CountTokensRequest"):
        props = schemas[name]["properties"]
        props["model"] = {"type": "string", "enum": models}
        required = schemas[name].setdefault("required", [])
        for limit in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
            if limit in props:
                props[limit] = {"type": "integer", "minimum": 1, "maximum": 4}
        for field in ("model", "max_tokens", "max_output_tokens"):
            if field in props and field not in required:
                required.append(field)
    schemas["ChatCompletionRequest"]["properties"]["messages"]["maxItems"] = 3
    for name in ("ChatCompletionRequest", "CompletionRequest"):  # n > 1 fans out: n generations
        schemas[name]["properties"]["n"] = {"type": "integer", "minimum": 1, "maximum": 2}
    prompt = schemas["CompletionRequest"]["properties"]["prompt"]  # one generation per listed prompt
    for form in prompt.get("anyOf", []):
        if form.get("type") == "array":
            form["maxItems"] = 3
    return spec


def test_fuzz_the_published_schema(gw: RunningGateway) -> None:
    published = httpx.get(gw.url + "/openapi.json", timeout=30).json()
    models = [m["id"] for m in httpx.get(gw.base_url + "/models", timeout=30).json()["data"]]
    schema = schemathesis.openapi.from_dict(bounded(published, models))
    statuses: collections.Counter[str] = collections.Counter()
    failures: list[str] = []

    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            def run(case: schemathesis.Case) -> None:
                response = case.call(base_url=gw.url, timeout=300)
                statuses[f"{operation.label} {mode.value} {response.status_code}"] += 1
                if os.environ.get("FUZZ_SHOW") and mode is GenerationMode.POSITIVE and response.status_code >= 400:
                    print("   ", response.status_code, response.text[:300])
                try:
                    case.validate_response(response, checks=CHECKS)
                except (AssertionError, BaseExceptionGroup) as exc:  # schemathesis's FailureGroup
                    failures.append(f"{operation.label} {mode.value}: {str(exc)[:1500]}\n"
                                    f"request: {str(case.body)[:1500]}\nresponse: {response.text[:500]}")

            try:
                run()
            except Unsatisfiable:  # no invalid request exists for an operation without inputs
                assert mode is GenerationMode.NEGATIVE, operation.label

    total = sum(statuses.values())
    by_status = collections.Counter(key.rsplit(" ", 1)[1] for key in statuses.elements())
    print(f"\nschemathesis: {total} requests over {len({k.rsplit(' ', 2)[0] for k in statuses})} operations; "
          f"by status {dict(sorted(by_status.items()))}")
    for key, count in sorted(statuses.items()):
        print(f"  {key}: {count}")
    assert not failures, "\n\n".join(failures[:10])
    assert not any(status.startswith("5") for status in by_status)
    assert "Traceback" not in gw.log()
