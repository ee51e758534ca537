"""Dependencies point one way: `adapters/` stands alone and imports nothing from `gateway/`."""

from __future__ import annotations

import ast
from pathlib import Path

ADAPTERS = Path(__file__).resolve().parents[2] / "adapters"


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_adapters_import_nothing_from_the_gateway() -> None:
    offenders = {
        f"{path.name}: {module}"
        for path in sorted(ADAPTERS.glob("*.py"))
        for module in imported_modules(path)
        if module == "gateway" or module.startswith("gateway.")
    }
    assert not offenders, offenders
    assert len(list(ADAPTERS.glob("*.py"))) > 10  # the scan found the package


def test_the_package_exports_what_a_plugin_needs() -> None:
    import adapters

    assert {"EngineSpec", "ServerSpec", "EngineConfig", "Layout", "Adapter", "Capabilities"} <= set(adapters.__all__)
    assert all(hasattr(adapters, name) for name in adapters.__all__)
