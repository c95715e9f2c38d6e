"""The processes a run starts and how each is told apart: ``rankenv`` (the launcher's contract with its ranks: the
environment, the control file, the rank command line and their readers), ``procs`` (a process as its pid and start
time; the switches that end a rank with its launcher), ``environ`` (this process's environment changed for a while
and put back) and ``ops`` (DeepSpeed's compiled ops, built once in a process of their own:
``python -m launcher.processes.ops``). The rank process itself starts in ``launcher.worker.rank_entry``."""
