"""A worker's task pool (actorpy.runtime.tasks.TaskRunner) with a fake node."""
from __future__ import annotations

from types import SimpleNamespace

from actorpy.runtime.tasks import TaskRunner
from actorpy.wire.kinds import CORE_SERVICE, Kind


class FakeNode:
    node_id = "w-fake"

    def __init__(self):
        self.handlers = {}

    def on(self, service, kind, handler):
        self.handlers[service, kind] = handler

    def subscribe(self, callback):
        return SimpleNamespace(cancel=lambda: None)


def test_a_task_that_arrives_after_close_is_dropped_without_an_error():
    # Ctrl-C of `actorpy wordcount`: a worker closed its pool while its node still read,
    # and the next TASK raised "cannot schedule new futures after shutdown" (an ERROR
    # with a traceback in the worker's log)
    node = FakeNode()
    runner = TaskRunner(node, store=None, services=None, threads=1)
    runner.close()
    msg = SimpleNamespace(sender="d-driver", header=SimpleNamespace(request_id=7))
    node.handlers[CORE_SERVICE, Kind.TASK](msg)
    assert runner.pending() == 0
