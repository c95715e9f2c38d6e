"""The run's records: the typed files a run dir holds (rank-K.json, report.json, state.json, data.json) and the
report built from them. Each is a dataclass with ``to_json``/``from_json``; ``shared`` holds what they share."""
