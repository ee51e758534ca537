"""A trivial OpenAI-style streaming endpoint that answers at once: the bench's own ceiling.

    python -m gateway.bench.trivial_server --port 0 --tokens 16   (prints "trivial server on PORT")
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import orjson
from aiohttp import web


def build_app(tokens: int) -> web.Application:
    events = [
        b"data: " + orjson.dumps({"object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {"content": f" t{i}"}, "finish_reason": None}]}) + b"\n\n"
        for i in range(tokens)
    ]
    tail = (
        b"data: " + orjson.dumps({"object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {}, "finish_reason": "length"}]}) + b"\n\n"
        + b"data: " + orjson.dumps({"object": "chat.completion.chunk", "choices": [], "usage": {
            "prompt_tokens": 1, "completion_tokens": tokens, "total_tokens": tokens + 1}}) + b"\n\n"
        + b"data: [DONE]\n\n"
    )
    body = b"".join(events) + tail

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write_eof(body)  # one write: the server must cost as little as it can

        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/completions", chat)
    return app


async def serve(port: int, tokens: int) -> None:
    runner = web.AppRunner(build_app(tokens), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    bound = int(runner.addresses[0][1])  # the bound port, also when --port 0
    print(f"trivial server on {bound}", flush=True)
    await asyncio.Event().wait()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()
    try:
        import uvloop  # noqa: PLC0415 - optional speed-up

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(args.port, args.tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
