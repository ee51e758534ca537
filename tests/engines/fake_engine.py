"""Stand-in for an engine's program: check the command line the adapter built, then become the emulator.

    python -m tests.engines.fake_engine ENGINE <the engine's own arguments>

Each ENGINE parses its arguments with a strict grammar of the real engine's flags (an unknown
flag or a missing value exits 2, as the engine would), takes host, port, key and model id
from them, and `exec`s the engine emulator in that engine's style, so the process the adapter's
ManagedProcess supervises is the emulator itself (same pid). Extra emulator flags (faults,
delays) come from the FAKE_ENGINE_ARGS environment variable, which the tests set through the
adapter's `options.env`. Every launch is appended to FAKE_ENGINE_LOG, when set, as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path

import yaml


def strict_parser(prog: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=prog, allow_abbrev=False, add_help=False)


def parse_vllm(argv: list[str]) -> dict[str, str | None]:
    p = strict_parser("vllm.entrypoints.openai.api_server")
    p.add_argument("--model", required=True)
    p.add_argument("--served-model-name", required=True)
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--api-key")
    for name in ("--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size", "--max-model-len"):
        p.add_argument(name, type=int)
    p.add_argument("--gpu-memory-utilization", type=float)
    p.add_argument("--quantization")
    p.add_argument("--kv-cache-dtype")
    p.add_argument("--distributed-executor-backend", choices=["ray", "mp"])
    for name in ("--nnodes", "--node-rank", "--master-port"):
        p.add_argument(name, type=int)
    p.add_argument("--master-addr")
    p.add_argument("--headless", action="store_true")
    p.add_argument("--disable-log-stats", action="store_true")
    p.add_argument("--enable-prompt-tokens-details", action="store_true")
    p.add_argument("--enable-lora", action="store_true")
    p.add_argument("--lora-modules", nargs="+", default=[])
    for name in ("--max-loras", "--max-lora-rank", "--max-cpu-loras"):
        p.add_argument(name, type=int)
    a = p.parse_args(argv)
    key = a.api_key or os.environ.get("VLLM_API_KEY")
    if a.lora_modules and not a.enable_lora:
        p.error("--lora-modules needs --enable-lora")
    if a.enable_lora and a.max_cpu_loras is not None and a.max_loras is not None and a.max_cpu_loras < a.max_loras:
        p.error("max_cpu_loras must be >= max_loras")  # vLLM's LoRAConfig check
    extra = shlex.join(["--lora-modules", *a.lora_modules]) if a.enable_lora else ""
    return {"style": "vllm", "host": a.host, "port": str(a.port), "key": key, "model": a.served_model_name,
            "extra": extra}


def parse_sglang(argv: list[str]) -> dict[str, str | None]:
    p = strict_parser("sglang.launch_server")
    p.add_argument("--model-path", required=True)
    p.add_argument("--served-model-name", required=True)
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--api-key")
    for name in ("--tp-size", "--pp-size", "--dp-size", "--nnodes", "--node-rank", "--context-length"):
        p.add_argument(name, type=int)
    p.add_argument("--dist-init-addr")
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--quantization")
    p.add_argument("--kv-cache-dtype")
    p.add_argument("--enable-metrics", action="store_true")
    a = p.parse_args(argv)
    return {"style": "sglang", "host": a.host, "port": str(a.port), "key": a.api_key, "model": a.served_model_name}


def parse_trtllm(argv: list[str]) -> dict[str, str | None]:
    p = strict_parser("trtllm-serve")
    p.add_argument("model")
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--backend", choices=["pytorch", "tensorrt", "_autodeploy"], required=True)
    for name in ("--tp_size", "--pp_size", "--max_seq_len"):
        p.add_argument(name, type=int)
    p.add_argument("--kv_cache_free_gpu_memory_fraction", type=float)
    p.add_argument("--extra_llm_api_options")
    a = p.parse_args(argv)
    if a.extra_llm_api_options:
        yaml.safe_load(Path(a.extra_llm_api_options).read_text())  # must exist and parse
    return {"style": "trtllm", "host": a.host, "port": str(a.port), "key": None, "model": Path(a.model).name}


def parse_tabby(argv: list[str]) -> dict[str, str | None]:
    p = strict_parser("tabbyAPI/main.py")
    p.add_argument("--config", required=True)
    a = p.parse_args(argv)
    config = yaml.safe_load(Path(a.config).read_text())
    network, model = config["network"], config["model"]
    assert model["cache_mode"] in ("FP16", "Q8", "Q6", "Q4"), model
    key = None
    if not network.get("disable_auth"):
        key = yaml.safe_load(Path("api_tokens.yml").read_text())["api_key"]  # TabbyAPI reads it from its cwd
    return {"style": "tabby", "host": network["host"], "port": str(network["port"]), "key": key,
            "model": model["model_name"]}


def planes(p: argparse.ArgumentParser) -> None:
    p.add_argument("--discovery-backend", choices=["etcd", "file", "mem", "kubernetes"])
    p.add_argument("--request-plane", choices=["tcp", "nats", "http"])
    p.add_argument("--event-plane", choices=["zmq", "nats"])


def parse_dynamo_frontend(argv: list[str]) -> dict[str, str | None]:
    p = strict_parser("dynamo.frontend")
    p.add_argument("--http-host", required=True)
    p.add_argument("--http-port", type=int, required=True)
    p.add_argument("--router-mode", choices=["round-robin", "random", "kv"])
    planes(p)
    a = p.parse_args(argv)
    registered = Path(os.environ["DYN_FILE_KV"]) / "fake-worker-model"
    while not registered.exists():  # the worker registers through the shared discovery directory
        time.sleep(0.05)
    return {"style": "dynamo", "host": a.http_host, "port": str(a.http_port), "key": None,
            "model": registered.read_text().split("\n")[0], "extra": f"--worker-registration {registered}"}


def run_dynamo_worker(argv: list[str]) -> None:
    p = strict_parser("dynamo.vllm")
    p.add_argument("--model", required=True)
    p.add_argument("--served-model-name", required=True)
    for name in ("--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size", "--max-model-len"):
        p.add_argument(name, type=int)
    p.add_argument("--gpu-memory-utilization", type=float)
    p.add_argument("--quantization")
    p.add_argument("--kv-cache-dtype")
    planes(p)
    a = p.parse_args(argv)
    target = Path(os.environ["DYN_FILE_KV"]) / "fake-worker-model"
    tmp = target.with_suffix(".tmp")
    tmp.write_text(f"{a.served_model_name}\n{os.getpid()}")
    tmp.rename(target)
    print(f"fake dynamo.vllm worker serving {a.served_model_name}", flush=True)
    signal.pause()


PARSERS = {
    "vllm": parse_vllm,
    "sglang": parse_sglang,
    "tensorrt_llm": parse_trtllm,
    "tabby": parse_tabby,
    "dynamo_frontend": parse_dynamo_frontend,
}


def main() -> None:
    engine, argv = sys.argv[1], sys.argv[2:]
    log = os.environ.get("FAKE_ENGINE_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps({"engine": engine, "argv": argv, "cwd": os.getcwd()}) + "\n")
    if engine == "dynamo_worker":
        run_dynamo_worker(argv)
        return
    spec = PARSERS[engine](argv)
    cmd = [sys.executable, "-m", "tests.emulators.engine_emulator", "--style", str(spec["style"]),
           "--host", str(spec["host"]), "--port", str(spec["port"]), "--model", str(spec["model"]), "--metrics"]
    if spec["key"]:
        cmd += ["--api-key", str(spec["key"])]
    cmd += shlex.split(str(spec.get("extra") or "")) + shlex.split(os.environ.get("FAKE_ENGINE_ARGS", ""))
    sys.stdout.flush()
    os.execv(sys.executable, cmd)


if __name__ == "__main__":
    main()
