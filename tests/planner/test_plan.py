"""plan.json: the Plan round-trips through to_json / from_json, with a schema version like the other records."""

import json

import pytest

from launcher.errors import ConfigError
from launcher.planner.plan import PLAN_SCHEMA, Plan
from launcher.planner.search import make_plan


def test_a_plan_round_trips_and_carries_its_schema(request_for):
    plan = make_plan(request_for())
    d = json.loads(json.dumps(plan.to_json()))
    assert d["schema"] == PLAN_SCHEMA
    again = Plan.from_json(d)
    assert again.to_json() == d and again.strategy == plan.strategy


def test_an_older_plan_without_schema_reads_and_a_newer_one_is_refused(request_for):
    d = make_plan(request_for()).to_json()
    older = {k: v for k, v in d.items() if k != "schema"}
    assert Plan.from_json(older).strategy == Plan.from_json(d).strategy
    with pytest.raises(ConfigError, match=rf"plan.json has schema {PLAN_SCHEMA + 1}, newer than this launcher"):
        Plan.from_json({**d, "schema": PLAN_SCHEMA + 1})
