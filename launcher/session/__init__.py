"""The run lifecycle between the CLI and the backends: plan and check, write the run dir, start the ranks through a
backend (launcher.backends.base.Backend), wait for their files, report, and walk the OOM ladder.

The CLI parses flags into a Job and a RunOptions (launcher.session.options) and calls
launcher.session.run.run_job; nothing here imports the CLI, and what runs on a compute node never loads it.
"""
