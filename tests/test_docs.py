"""The docs are part of the product: they must match the code."""

from __future__ import annotations

import re

import yaml

from allocstack.common.errors import DIAGNOSTICS
from conftest import ROOT


def test_readme_diagnostic_table_matches_the_code():
    readme = (ROOT / "README.md").read_text()
    rows = dict(re.findall(r"^\| `([a-z-]+)` \| (\d+) \|", readme, flags=re.MULTILINE))
    assert rows == {diag: str(code) for diag, (code, _) in DIAGNOSTICS.items()}


def test_every_config_key_is_documented():
    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    documented = (ROOT / "config/README.md").read_text()

    def keys(properties, prefix=""):
        for name, spec in properties.items():
            if spec.get("type") == "object" and "properties" in spec and "required" not in spec:
                yield from keys(spec["properties"], f"{prefix}{name}.")
            else:
                assert "description" in spec and "default" in spec, name
                yield f"{prefix}{name}"

    for key in keys(schema["properties"]):
        assert f"| `{key}` |" in documented, f"config/README.md does not explain {key}"


def test_the_conventions_of_the_ecosystem_are_kept():
    import subprocess
    import tomllib

    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n")
    catalog = yaml.safe_load((ROOT / ".snakemake-workflow-catalog.yml").read_text())
    deployment = catalog["usage"]["software-stack-deployment"]
    assert set(catalog["usage"]) == {"mandatory-flags", "software-stack-deployment"} and deployment["report"] is True
    ruff = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]
    assert {"F", "E", "I", "B", "S", "BLE", "EXE", "PLW1510"} <= set(ruff["lint"]["select"])
    assert re.search(r"^ruff==[0-9.]+$", (ROOT / "requirements.txt").read_text(), flags=re.MULTILINE)
    plan = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert ".venv/bin/ruff check ." in plan.splitlines()
    assert plan.index("ruff check") < plan.index("pytest")
