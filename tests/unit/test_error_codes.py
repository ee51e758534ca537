"""adapters/error_codes.py is the one table of the gateway's error codes: every code literal the
source sends is in it, and every entry is sent somewhere."""

from __future__ import annotations

import ast
from pathlib import Path

from adapters.error_codes import CODES, ERROR_CODES

ROOT = Path(__file__).resolve().parents[2]
# Calls that take a code positionally: name -> index of the code argument.
POSITIONAL = {"EngineError": 2, "ClientRequestError": 3, "ModelUnavailable": 2, "error_event": 1, "send_error": 3,
              "error_response": 3, "error_payload": 3, "APIError": 4}


def _strings(node: ast.AST, constants: dict[str, str]) -> list[str]:
    """String constants an expression can evaluate to (literals, `x or "fallback"`, module constants)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.BoolOp):
        return [s for v in node.values for s in _strings(v, constants)]
    if isinstance(node, ast.Name) and node.id in constants:
        return [constants[node.id]]
    return []


def _callee(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def sent_codes() -> dict[str, list[str]]:
    """code -> where it is written, for every .py under gateway/ and adapters/."""
    found: dict[str, list[str]] = {}
    for path in sorted([*(ROOT / "gateway").rglob("*.py"), *(ROOT / "adapters").rglob("*.py")]):
        if path.name == "error_codes.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        constants = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                     and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                     for t in n.targets if isinstance(t, ast.Name) and t.id.isupper()}
        for node in ast.walk(tree):
            values: list[ast.AST] = []
            if isinstance(node, ast.Call):
                values += [k.value for k in node.keywords if k.arg == "code"]
                index = POSITIONAL.get(_callee(node))
                if index is not None and len(node.args) > index:
                    values.append(node.args[index])
            elif isinstance(node, ast.Dict):
                values += [v for k, v in zip(node.keys, node.values)
                           if isinstance(k, ast.Constant) and k.value == "code" and v is not None]
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                for arg, default in zip(args.args[len(args.args) - len(args.defaults):], args.defaults):
                    if arg.arg == "code":
                        values.append(default)
            for value in values:
                for code in _strings(value, constants):
                    found.setdefault(code, []).append(f"{path.relative_to(ROOT)}:{getattr(value, 'lineno', '?')}")
    return found


def test_every_code_sent_is_in_the_table() -> None:
    missing = {code: where for code, where in sent_codes().items() if code not in CODES}
    assert not missing, f"add these codes to adapters/error_codes.py (then python -m gateway.docgen): {missing}"


def test_every_code_in_the_table_is_sent() -> None:
    unused = sorted(CODES - set(sent_codes()))
    assert not unused, f"adapters/error_codes.py lists codes nothing sends: {unused}"


def test_the_table_has_each_code_once() -> None:
    assert len(CODES) == len(ERROR_CODES)
