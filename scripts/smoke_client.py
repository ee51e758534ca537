"""Drive a running gateway the way a user does: one chat completion with the official `openai`
client, then a look at /metrics. Exits non-zero (with the reason) when either is wrong.

    python scripts/smoke_client.py http://127.0.0.1:8000 [--metrics-key KEY]
"""

from __future__ import annotations

import argparse
import sys

import httpx
import openai


def check(url: str, metrics_key: str | None) -> str:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hello in five words."}], max_tokens=16, temperature=0)
    text = reply.choices[0].message.content
    if not text or reply.usage is None or reply.usage.completion_tokens < 1:
        raise AssertionError(f"empty completion: {reply.model_dump_json()}")
    headers = {"authorization": f"Bearer {metrics_key}"} if metrics_key else {}
    metrics = httpx.get(url + "/metrics", headers=headers, timeout=30)
    metrics.raise_for_status()
    served = [line for line in metrics.text.splitlines()
              if line.startswith("enginegate_requests_total{") and 'route="/v1/chat/completions"' in line
              and 'status="200"' in line]
    if not served:
        raise AssertionError("/metrics does not count the chat completion:\n" + metrics.text[:2000])
    return f"{model}: {text!r} ({reply.usage.completion_tokens} tokens); metrics: {served[0]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the gateway's address, without /v1")
    parser.add_argument("--metrics-key", help="bearer key for /metrics, if the gateway requires one")
    args = parser.parse_args()
    try:
        print("smoke:", check(args.url.rstrip("/"), args.metrics_key))
    except (AssertionError, openai.OpenAIError, httpx.HTTPError) as exc:
        print(f"smoke FAILED against {args.url}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
