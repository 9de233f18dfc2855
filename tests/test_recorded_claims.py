"""What the docs say of each recorded set is true of its traces: every manifest's claims,
recomputed from the traces by the metrics code that reports use."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from cbsim.metrics import compute_metrics
from cbsim.trace import read_trace

SETS = sorted(
    [*REPO.glob("experiments/recordings/*/*/manifest.yaml")]
    + [*REPO.glob("cbsim/recorded/*/*/manifest.yaml")]
)


@cache
def metrics(path: Path) -> dict:
    return compute_metrics(read_trace(str(path)))


def claimed(claim: dict, folder: Path) -> float:
    run = folder / claim["run"]
    if claim["metric"] == "speedup":
        sync, asyn = (
            metrics(run / f"trace_{e}.json.gz")["total_time_s"] for e in ("sync", "async")
        )
        return sync / asyn
    return float(metrics(run / f"trace_{claim['engine']}.json.gz")[claim["metric"]])


def test_every_recorded_set_has_a_manifest_naming_its_gpu_and_claims():
    assert len(SETS) >= 7
    for path in SETS:
        m = yaml.safe_load(path.read_text())
        assert m.get("gpu"), path
        assert m.get("claims") or "six_workloads" in str(path), path


@pytest.mark.parametrize("manifest", SETS, ids=lambda p: "/".join(p.parts[-3:-1]))
def test_each_claim_of_a_recorded_set_holds_on_its_traces(manifest):
    claims = yaml.safe_load(manifest.read_text()).get("claims") or []
    wrong = []
    for c in claims:
        got = claimed(c, manifest.parent)
        if abs(got - c["value"]) > c["within"] * max(1.0, abs(c["value"])):
            wrong.append((c["run"], c.get("engine"), c["metric"], c["value"], round(got, 5)))
    assert not wrong, wrong
