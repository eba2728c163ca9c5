"""A worker's task pool (actorpy.runtime.tasks.TaskRunner) with a fake node."""
from __future__ import annotations

import logging
from types import SimpleNamespace

from actorpy.errors import NodeLost
from actorpy.runtime.tasks import TaskRunner, _TaskState
from actorpy.wire.kinds import CORE_SERVICE, Kind


class FakeNode:
    node_id = "w-fake"
    closed = False

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


def test_a_task_that_fails_as_its_worker_stops_is_no_error(caplog):
    # the driver of `actorpy sgd` SIGTERMed: its workers stopped, a running task failed on
    # its closed node, and answering that failure (through the same node) was an ERROR,
    # "could not report a failure", with a traceback on the terminal
    node = FakeNode()

    def closed(*args, **kwargs):
        raise NodeLost(node.node_id, f"node {node.node_id} is closed")
    node.reply = node.reply_error = closed
    node.closed = True
    runner = TaskRunner(node, store=None, services=None, threads=1)
    msg = SimpleNamespace(sender="d-driver", header=SimpleNamespace(request_id=7))
    with caplog.at_level(logging.DEBUG, logger="actorpy.runtime.tasks"):
        runner._answer(_TaskState(msg), NodeLost("w-fake", "node w-fake is closed"), failed=True)
    assert [r.levelname for r in caplog.records] == ["DEBUG"]
    runner.close()
