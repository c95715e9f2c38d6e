"""launcher.backends: every backend by name, with its capabilities; the job's launcher: lists the same names."""

import typing

from launcher.backends import BACKENDS, backend_spec
from launcher.backends.base import Backend
from launcher.config.job import Job


def test_the_registry_and_the_jobs_launcher_field_name_the_same_backends():
    launcher = typing.get_type_hints(Job)["launcher"]
    assert set(typing.get_args(launcher)) == set(BACKENDS)


def test_each_backend_loads_its_class_under_its_own_name():
    for name, spec in BACKENDS.items():
        cls = spec.load()
        assert issubclass(cls, Backend) and cls.name == name


def test_the_capabilities_the_session_asks():
    local, slurm = backend_spec("local"), backend_spec("slurm")
    assert not local.queued and not local.arrays and not local.cancel and not local.requeue
    assert slurm.queued and slurm.arrays and slurm.cancel and slurm.requeue
