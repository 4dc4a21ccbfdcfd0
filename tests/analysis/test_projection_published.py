"""The projection on published nccl-tests tables (tests/fixtures/published/, each file citing its
source): fitted on a dataset's two smallest scales, the larger ones checked through the real
parse, fit and check (tools/published_projection.py; docs/projection.md holds the numbers)."""

from __future__ import annotations

import importlib.util

from helpers import REPO

_spec = importlib.util.spec_from_file_location("published_projection", REPO / "tools" / "published_projection.py")
published = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(published)


def test_every_fixture_cites_its_source_and_scale():
    for path in sorted(published.DATASETS.glob("*/*.txt")):
        head = path.read_text().splitlines()[:6]
        assert head[0].startswith("# source: https://"), path
        assert any(x.startswith("# nodes: ") for x in head) and any(x.startswith("# ranks: ") for x in head), path


def test_aws_p3dn_efa_64_ranks_from_16_and_32():
    e = published.evaluate(published.DATASETS / "aws-p3dn-efa", boot=200)
    assert e["scales"] == [16, 32, 64] and e["fitted_on"] == [16, 32] and e["op"] == ["all_reduce"]
    at = e["per_scale"][64]
    # what docs/projection.md reports: 13 of 13 published 8 B-32 KiB cells inside, median |error| 5.4%
    assert at["label"] == "extrapolated" and at["cells"] == 13
    assert at["inside"] == 13 and abs(at["median_abs_error"] - 0.054) < 0.002, at
