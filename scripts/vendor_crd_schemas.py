"""Copy the openAPIV3Schema of upstream CRDs into tests/fixtures/crd-schemas/, so the manifests test
can validate custom resources offline (kubernetes-validate knows only Kubernetes' own kinds).

    python scripts/vendor_crd_schemas.py --source "GAIE v1.5.0 config/crd/bases/..." [--only-version v1] CRD.yaml

Descriptions are dropped (they are most of the bytes and validate nothing); every other keyword,
CEL rules (`x-kubernetes-validations`) included, is kept as upstream wrote it. One JSON file per
served version: <group>_<kind>_<version>.json with the source recorded in it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "crd-schemas"


def strip(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: strip(v) for k, v in node.items() if k != "description" or not isinstance(v, str)}
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("crds", nargs="+", type=Path)
    p.add_argument("--source", required=True, help="where the CRD came from (project, tag, path)")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--only-version", action="append", help="keep only these versions (default: every served one)")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for path in args.crds:
        crd = yaml.safe_load(path.read_text())
        spec = crd["spec"]
        for version in spec["versions"]:
            if not version.get("served", True) or (args.only_version and version["name"] not in args.only_version):
                continue
            name = f"{spec['group']}_{spec['names']['kind']}_{version['name']}.json"
            record = {"source": args.source, "group": spec["group"], "kind": spec["names"]["kind"],
                      "version": version["name"], "schema": strip(version["schema"]["openAPIV3Schema"])}
            (args.out / name).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
            print(args.out / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
