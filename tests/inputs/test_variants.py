import pytest

from launcher.errors import ConfigError
from launcher.inputs.variants import expand, variant_name


def test_grid_is_the_product_last_key_fastest():
    vs = expand({"grid": {"train.lr": [1e-4, 3e-4], "train.seed": [0, 1]}})
    assert [v.overrides for v in vs] == [
        {"train.lr": 1e-4, "train.seed": 0}, {"train.lr": 1e-4, "train.seed": 1},
        {"train.lr": 3e-4, "train.seed": 0}, {"train.lr": 3e-4, "train.seed": 1},
    ]
    assert [v.index for v in vs] == [0, 1, 2, 3]
    assert vs[1].name == "lr=0.0001,seed=1"


def test_list_entries_follow_the_grid():
    vs = expand({"grid": {"train.lr": [1e-4]}, "list": [{"train.lr": 1e-3, "strategy.engine": "fsdp"}]})
    assert [v.name for v in vs] == ["lr=0.0001", "lr=0.001,engine=fsdp"]


def test_names_keep_the_full_key_when_last_parts_clash():
    assert variant_name({"train.seed": 1, "data.seed": 2}) == "train.seed=1,data.seed=2"


def test_no_sweep_is_no_variants():
    assert expand(None) == [] and expand({}) == []


@pytest.mark.parametrize("sweep,needle", [
    ({"grid": {"train.lr": []}}, "sweep.grid.train.lr: [] must be a non-empty list"),
    ({"grid": {"train.lr": 1e-4}}, "sweep.grid.train.lr: 0.0001 must be a non-empty list"),
    ({"grid": {"slurm.timeout_min": [1, 2]}}, "'slurm.timeout_min' cannot vary between array tasks"),
    ({"grid": {"gpus": [1, 2]}}, "'gpus' cannot vary between array tasks"),
    ({"list": [{"nodes": 2}]}, "'nodes' cannot vary between array tasks"),
    ({"list": [{}]}, "sweep.list[0]: {} must be a non-empty mapping"),
    ({"list": [{"train.lr": 1}, {"train.lr": 1}]}, "variant 1 (lr=1) repeats variant 0"),
    ({"grid": {"a..b": [1]}}, "must be a dotted job key"),
    ({"grids": {}}, "sweep.grids: unknown key"),
    ({"grid": {}, "list": []}, "sweep: no variants"),
])
def test_problems_name_the_key_and_the_fix(sweep, needle):
    with pytest.raises(ConfigError) as e:
        expand(sweep)
    assert any(needle in p for p in e.value.problems), e.value.problems


def test_every_problem_at_once():
    with pytest.raises(ConfigError) as e:
        expand({"grid": {"train.lr": [], "gpus": [1]}, "list": [{}]})
    assert len(e.value.problems) == 3
