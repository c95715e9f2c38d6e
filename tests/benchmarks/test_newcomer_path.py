"""The README's "Fine-tune and use the result" as benchmarks/newcomer/run.py --path reads it: real commands."""

from benchmarks.newcomer.run import readme_path
from launcher.cli.main import main


def test_the_readme_path_is_plan_run_status_export_and_a_snippet_that_plans(capsys):
    commands, snippet = readme_path()
    verbs = [c.split()[1] for c in commands]
    assert all(c.startswith(".venv/bin/launch ") for c in commands)
    assert verbs == ["plan", "examples/seq-cls.yaml", "status", "export"]
    assert "AutoModelForSequenceClassification.from_pretrained(path)" in snippet and "id2label" in snippet
    # The plan command works as written (from the repo root; conftest runs tests there or resolves REPO).
    from tests.conftest import REPO

    assert main(["plan", str(REPO / commands[0].split()[2])]) == 0
    assert "total time  " in capsys.readouterr().out
