"""Layers import downward only, and no launcher module imports itself back (docs/architecture.md).

Every import is read from the source with ast, the ones inside functions included: a lazy import is still a
dependency, it only moves the failure to run time.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "launcher"

# layer -> what it must never import (prefixes of dotted module names); the layers of docs/architecture.md
UPPER = ("launcher.backends", "launcher.worker", "launcher.cli", "launcher.session")
PLAN_INPUTS = ("launcher.inputs", "launcher.calibrate")
CORE = ("launcher.config", "launcher.planner", "launcher.emit", "launcher.engines", "launcher.levers", "launcher.model",
        "launcher.records", "launcher.files", "launcher.processes", "launcher.units", "launcher.errors")
# What may sit at the package's top beside the rooms: the foundation every layer uses (docs/architecture.md).
FOUNDATION = {"launcher", "launcher.__main__", "launcher.units", "launcher.errors"}
FORBIDDEN = {
    **{low: UPPER + PLAN_INPUTS for low in CORE},
    **{mid: UPPER for mid in PLAN_INPUTS},
    # The planner returns numbers (its Problem, NoFit, Rejected); planner.plan_words and cli/render word them.
    "launcher.planner": UPPER + PLAN_INPUTS + ("launcher.planner.plan_words",),
    "launcher.backends": ("launcher.cli", "launcher.session"),
    "launcher.session": ("launcher.cli",),
    "launcher.runtime": ("launcher.backends", "launcher.cli", "launcher.session"),
    "launcher.worker": ("launcher.backends", "launcher.cli", "launcher.session"),
}


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, name: str, modules: set[str]) -> set[str]:
    """The launcher modules ``path`` imports; ``from pkg import sub`` counts as importing the submodule."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            subs = {f"{target}.{a.name}" for a in node.names} & modules
            out |= subs or {target}
    return {m for m in out if m == "launcher" or m.startswith("launcher.")}


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    names = set(files)
    return {name: {m for m in imports_of(p, name, names) if m in names and m != name} for name, p in files.items()}


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, deps in sorted(graph.items()):
        for layer, banned in FORBIDDEN.items():
            if mod == layer or mod.startswith(layer + "."):
                bad += [f"{mod} imports {d}" for d in sorted(deps)
                        if any(d == b or d.startswith(b + ".") for b in banned)]
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_lower_layers_never_import_upper_ones():
    assert layer_violations(import_graph()) == []


def test_no_import_cycles_among_launcher_modules():
    assert cycles(import_graph()) == []


def unplaced(graph: dict[str, set[str]]) -> list[str]:
    """The package's top-level names (a room or a loose module) that have no layer here and are not the foundation."""
    placed = set(UPPER + PLAN_INPUTS + CORE) | {"launcher.runtime"} | FOUNDATION
    return sorted({".".join(m.split(".")[:2]) for m in graph} - placed)


def test_every_room_has_its_layer_and_only_the_foundation_sits_at_the_top():
    """A module at launcher/'s top is a room's work left loose (issue 38 §7), and a new room gets its layer."""
    assert unplaced(import_graph()) == []


def test_a_loose_module_or_a_room_without_a_layer_is_caught(tmp_path):
    import shutil

    root = tmp_path / "launcher"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "helpers.py").write_text('"""Loose."""\n')
    (root / "annex").mkdir()
    (root / "annex" / "__init__.py").write_text('"""A room."""\n')
    assert unplaced(import_graph(root)) == ["launcher.annex", "launcher.helpers"]


def test_the_graph_sees_real_imports():
    """The reader finds what is there: a module-level, a function-level and a `from pkg import sub` import."""
    graph = import_graph()
    assert "launcher.planner.search" in graph["launcher.inputs.plan_inputs"]  # module level
    assert "launcher.session.sweep" in graph["launcher.session.run"]  # inside run_job
    assert "launcher.worker.checkpoint" in graph["launcher.worker.loop"]  # from launcher.worker import checkpoint


@pytest.mark.parametrize("where, line", [
    ("config/job.py", "from launcher.cli.main import main"),  # module level, into the CLI
    ("emit/sbatch.py", "def f():\n    from launcher.backends import slurm\n"),  # function level
    ("model/activations.py", "def f():\n    from ..worker import model\n"),  # relative
])
def test_an_upward_import_is_caught(tmp_path, where, line):
    """Copy the package, add one forbidden import, and the checks name it."""
    import shutil

    root = tmp_path / "launcher"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    target = root / where
    target.write_text(target.read_text() + "\n\n" + line + "\n")
    bad = layer_violations(import_graph(root))
    assert len(bad) == 1 and bad[0].startswith(module_name(target, root) + " imports launcher."), bad


def test_a_cycle_is_caught(tmp_path):
    import shutil

    root = tmp_path / "launcher"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    units = root / "units.py"
    units.write_text(units.read_text() + "\n\ndef f():\n    from launcher.config import load\n")
    assert any({"launcher.units", "launcher.config.load"} <= set(c) for c in cycles(import_graph(root)))


def test_the_cli_and_the_shared_names_import_no_heavy_library():
    """`launch plan` stays fast: the CLI, the session's preparation and the names shared with the ranks (exit
    codes, environment) load without torch, transformers, deepspeed, matplotlib or submitit."""
    import subprocess
    import sys

    code = ("import sys; import launcher.cli.main as m; m.build_parser(); "
            "import launcher.processes.rankenv, launcher.errors, launcher.session.prepare, launcher.session.run; "
            "print(sorted(k for k in ('torch', 'transformers', 'deepspeed', 'matplotlib', 'submitit') "
            "if k in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


# Where an engine's name may be compared: its plan-side spec and its rank-side Engine (issue 18 §1).
ENGINE_HOMES = ("launcher/engines/", "launcher/worker/engines/")


def engine_name_comparisons(root: Path = PACKAGE) -> list[str]:
    """Every `x == "deepspeed"`, `x != "fsdp"`, `x in ("deepspeed", ...)`, `case "fsdp":` and dict keyed by an engine's
    name (`{"deepspeed": a, "fsdp": b}[x]`) outside ENGINE_HOMES, as path:line."""
    from launcher.engines import ENGINES

    return name_comparisons(root, set(ENGINES), ENGINE_HOMES, dict_keys=True)


def name_comparisons(root: Path, names: set[str], homes: tuple[str, ...], *, dict_keys: bool) -> list[str]:
    """Comparisons with one of ``names`` (and, with ``dict_keys``, dicts keyed by one) outside ``homes``."""

    def named(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(named(e) for e in node.elts)
        return False

    return [f"{rel}:{node.lineno}" for rel, node in nodes_outside(root, homes)
            if ((isinstance(node, ast.Compare) and any(named(n) for n in (node.left, *node.comparators)))
                or (isinstance(node, ast.MatchValue) and named(node.value))  # case "deepspeed":
                or (dict_keys and isinstance(node, ast.Dict) and any(k is not None and named(k) for k in node.keys)))]


# Where a backend's name may be compared: its own modules; the session asks launcher.backends' capabilities (issue
# 38 §2). Dict keys are not checked: "slurm" is also the job's slurm: section.
BACKEND_HOMES = ("launcher/backends/",)


def backend_name_comparisons(root: Path = PACKAGE) -> list[str]:
    """Every `job.launcher == "slurm"`, `x != "local"`, `x in ("slurm", ...)` or `case "local":` outside
    BACKEND_HOMES."""
    from launcher.backends import BACKENDS

    return name_comparisons(root, set(BACKENDS), BACKEND_HOMES, dict_keys=False)


def test_backend_names_are_compared_only_inside_the_backends():
    """The session and the CLI ask a backend's capabilities (launcher.backends.BackendSpec), never its name."""
    assert backend_name_comparisons() == []


@pytest.mark.parametrize("line", ['x = job.launcher == "slurm"', 'y = "local" != job.launcher',
                                  'z = job.launcher in ("slurm",)',
                                  'match job.launcher:\n    case "local":\n        pass'])
def test_a_backend_name_comparison_is_caught(tmp_path, line):
    assert caught_where_added(tmp_path, "session/checks.py", line, backend_name_comparisons)


def caught_where_added(tmp_path: Path, where: str, line: str, finder) -> bool:
    """``line`` appended to a copy of the package's ``where``: whether ``finder(root)`` names a line it added."""
    import shutil

    root = tmp_path / "launcher"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    target = root / where
    first = len(target.read_text().splitlines()) + 3
    target.write_text(target.read_text() + "\n\n" + line + "\n")
    prefix = f"launcher/{where}:"
    hits = {int(f.rsplit(":", 1)[1]) for f in finder(root) if f.startswith(prefix)}
    return bool(hits & set(range(first, len(target.read_text().splitlines()) + 1)))


def nodes_outside(root: Path, homes: tuple[str, ...]):
    """(path relative to the package's parent, node) for every syntax node of the modules outside ``homes``."""
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        if not rel.startswith(homes):
            yield from ((rel, node) for node in ast.walk(ast.parse(path.read_text(), str(path))))


def test_engine_names_are_compared_only_inside_the_engines():
    """Nothing outside an engine's own modules branches on its name: everything else asks launcher.engines."""
    assert engine_name_comparisons() == []


@pytest.mark.parametrize("line", ['x = plan.strategy.engine == "fsdp"', 'y = "deepspeed" != s.engine',
                                  'z = s.engine in ("deepspeed",)', 'w = {"fsdp": 1, "deepspeed": 2}[s.engine]',
                                  'match s.engine:\n    case "fsdp":\n        pass'])
def test_an_engine_name_comparison_is_caught(tmp_path, line):
    assert caught_where_added(tmp_path, "session/prepare.py", line, engine_name_comparisons)


def engine_module_imports(root: Path = PACKAGE) -> list[str]:
    """Modules outside ENGINE_HOMES that import one engine's module (launcher.engines.<name>.* or
    launcher.worker.engines.<name>): type checks such as isinstance(engine, FsdpEngine) or calls to one engine's
    helpers branch on the engine as surely as comparing its name does."""
    from launcher.engines import ENGINES

    homes = tuple(h.rstrip("/").replace("/", ".") for h in ENGINE_HOMES)
    own = tuple(f"{home}.{name}" for home in homes for name in ENGINES)  # a package (plan side) or a module

    def owned(dep: str) -> bool:
        return any(dep == o or dep.startswith(o + ".") for o in own)

    return sorted(f"{mod} imports {dep}" for mod, deps in import_graph(root).items()
                  if not mod.startswith(homes) for dep in deps if owned(dep))


def test_only_the_engines_import_an_engine_module():
    assert engine_module_imports() == []


def test_an_engine_module_import_is_caught(tmp_path):
    import shutil

    root = tmp_path / "launcher"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    target = root / "worker" / "export.py"
    target.write_text(target.read_text()
                      + "\n\ndef f(engine):\n    from launcher.worker.engines.fsdp import FsdpEngine\n"
                      "    return isinstance(engine, FsdpEngine)\n")
    assert engine_module_imports(root) == ["launcher.worker.export imports launcher.worker.engines.fsdp"]


# Where a lever's field may be named (issue 37 §1): its own module in launcher/levers/, and the rank side, which
# runs the model the lever changes (the worker, the script runtime, and the model code the ranks and the probe share).
LEVER_RANK_SIDE = ("launcher/worker/", "launcher/runtime/", "launcher/model/")


def lever_field_names(root: Path = PACKAGE) -> list[str]:
    """Every place outside a lever's own module and the rank side that names its field: an attribute (``s.qlora``),
    a keyword (``qlora=``), a string (``"qlora"``, a dict key) or an annotated name, as path:line field. Everything
    else asks the lever's spec (LeverSpec.of / on / field) or the tables launcher.levers derives from the registry."""
    from launcher.levers import LEVERS

    home = {field: type(spec).__module__.replace(".", "/") + ".py" for field, spec in LEVERS.items()}
    found = []
    for rel, node in nodes_outside(root, LEVER_RANK_SIDE):
        name = (node.attr if isinstance(node, ast.Attribute)
                else node.arg if isinstance(node, ast.keyword)
                else node.value if isinstance(node, ast.Constant) and isinstance(node.value, str)
                else node.target.id if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                else None)
        if name in home and rel != home[name]:
            found.append(f"{rel}:{node.lineno} {name}")
    return found


def test_a_levers_field_is_named_only_in_its_module_and_the_rank_side():
    """A lever has one home: adding one is its module plus its rank side (docs/architecture.md)."""
    assert lever_field_names() == []


@pytest.mark.parametrize("where, line", [
    ("planner/memory.py", "x = s.loss_chunks"),  # an attribute
    ("engines/fsdp/spec.py", "d = {'pure_bf16': 1}"),  # a key
    ("cli/render.py", "def f(s):\n    return dataclasses.replace(s, qlora=True)\n"),  # a keyword
    ("levers/pure_bf16.py", "y = s.qlora"),  # another lever's module
])
def test_a_levers_field_named_elsewhere_is_caught(tmp_path, where, line):
    import shutil

    root = tmp_path / "launcher"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    target = root / where
    first = len(target.read_text().splitlines()) + 3
    target.write_text(target.read_text() + "\n\n" + line + "\n")
    hits = [f for f in lever_field_names(root) if f.startswith(f"launcher/{where}:")]
    assert hits and all(int(f.split(":")[1].split()[0]) >= first for f in hits), hits


def layout_field_names(root: Path = PACKAGE) -> list[str]:
    """Every place outside an engine's package and the rank side that names one of its layout's own fields (an
    attribute, a keyword, a string): the shared types carry a layout (Strategy.layout), and what reads one asks it
    or the registry's flat LAYOUT_KEYS."""
    from launcher.engines import LAYOUTS

    home = {f.name: f"launcher/engines/{name}/" for name, layout in LAYOUTS.items() for f in layout.own_fields()}
    found = []
    for rel, node in nodes_outside(root, ("launcher/worker/", "launcher/runtime/")):
        name = (node.attr if isinstance(node, ast.Attribute) else node.arg if isinstance(node, ast.keyword)
                else node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None)
        if name in home and not rel.startswith(home[name]):
            found.append(f"{rel}:{node.lineno} {name}")
    return found


def test_an_engines_layout_fields_are_named_only_in_its_package_and_the_rank_side():
    assert layout_field_names() == []


def test_the_shared_strategy_carries_a_layout_not_every_engines_fields():
    import dataclasses

    from launcher.levers import LEVER_FIELDS
    from launcher.planner.plan import Strategy

    assert [f.name for f in dataclasses.fields(Strategy)] == [
        "layout", "micro_batch_size", "grad_accum_steps", "activation_checkpointing", *LEVER_FIELDS]


def test_a_layout_field_named_elsewhere_is_caught(tmp_path):
    import shutil

    root = tmp_path / "launcher"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    target = root / "cli" / "render.py"
    target.write_text(target.read_text() + "\n\ndef f(s):\n    return s.layout.zero_stage == 3\n")
    found = [f.split(" ")[1] for f in layout_field_names(root) if f.startswith("launcher/cli/render.py")]
    assert found == ["zero_stage"]
