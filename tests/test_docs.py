"""The docs are part of the product: they must match the code."""

from __future__ import annotations

import re

import yaml

from allocstack.errors import DIAGNOSTICS
from conftest import ROOT


def test_readme_diagnostic_table_matches_the_code():
    readme = (ROOT / "README.md").read_text()
    rows = dict(re.findall(r"^\| `([a-z-]+)` \| (\d+) \|", readme, flags=re.M))
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
