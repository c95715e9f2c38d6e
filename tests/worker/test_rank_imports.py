"""What a rank imports: a plain or FSDP2 rank trains and exports without loading DeepSpeed (about 0.26 s of CPU
a rank 0 would pay for nothing; benchmarks/results/startup.md)."""

import json


def test_a_plain_or_fsdp2_rank_trains_and_exports_without_importing_deepspeed(single_rank_runs):
    # FSDP2's and the plain engine's one-rank runs came first in their interpreter (tests/shared_runs.py), DeepSpeed's
    # after them: what was loaded once each had run is what it loaded itself.
    for engine in ("fsdp", "plain"):
        done = single_rank_runs[engine]
        assert done["code"] == 0, (done["run"] / "ranks" / "rank-0.json").read_text()
        # It trained to the end and wrote its model: the export is where DeepSpeed crept in.
        assert json.loads((done["run"] / "model" / "export.json").read_text())["format"] == "full"
        assert done["deepspeed"] == [], engine
    assert single_rank_runs["deepspeed"]["deepspeed"]  # and the check sees a DeepSpeed run's
