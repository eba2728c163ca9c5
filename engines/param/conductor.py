"""The job's conductor: a named service on the driver (``"<job>/conductor"``) that hands a
worker task to every worker (joiners included), follows membership, restarts a lost shard
from its checkpoint, tells workers where a restarted shard lives, and collects the model
when the job stops.

Everything reaches it on its own thread, in order: worker tasks ending (``when_done``),
membership events (``subscribe``: a worker that joins gets a task at once, a shard host
that dies is replaced), the job's deadline and end-of-job grace (``schedule``), and the
workers' SHARDS requests, which it defers until a newer shard directory exists.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from actorpy.errors import ActorpyError, ActorpyTimeout, NodeLost, SerializationError
from actorpy.ids import NodeId
from actorpy.runtime.membership import MANAGER_ID
from actorpy.runtime.node import NodeEvent, NodeEventKind
from actorpy.runtime.service import Envelope, Reply, Service, ServiceContext, handles
from engines.param.driver import FAILED_GRACE_S, GRACE_S, Run, RunStats, left_running
from engines.param.errors import JobFailed
from engines.param.kinds import ParamKind, Status
from engines.param.worker import WorkerResult, WorkerTask

log = logging.getLogger(__name__)


class Conductor(Service):
    """The driver side of one run (started by ``Run.start``; see the module docstring).

    Args:
        ctx: the service's context (on the driver).
        run: the run it conducts; it fills in ``model``, ``stats``, ``failure`` and sets
            ``finished``.
        pool: the workers the job starts with (the shards wait for all of them).
    """

    def __init__(self, ctx: ServiceContext, run: Run, pool: list[NodeId]) -> None:
        super().__init__(ctx)
        self.run = run
        self.name = run.job.name
        self._slots_total = len(pool)
        self._generation = 0
        self._parked: list[tuple[int, Reply]] = []
        self._running: dict[NodeId, Any] = {}
        self._order: list[NodeId] = []
        self._seen: set[NodeId] = set()
        self._slots: dict[NodeId, int] = {}
        self._free_slots: list[int] = []
        self._results: dict[NodeId, WorkerResult] = {}
        self._statuses: dict[NodeId, str] = {}
        self._stopped = False
        self._halted = False
        self._restarts = 0
        self._restarted: set[int] = set()   # the shards restarted from their checkpoint
        self._warned_empty = False
        self._asking = False   # timed out, asking where the workers are (``_late``)
        self._grace: Any = None
        self._over = False
        ctx.subscribe(self._membership)
        left = run.t0 + run.options.timeout_s - ctx.clock.now()
        self._deadline = ctx.schedule(max(0.0, left), self._timed_out)
        for w in pool:
            self._submit(w)
        if run.options.workers is None:   # workers that joined before we subscribed
            for w in ctx.workers():
                if w not in self._seen and run.trains(w):
                    self._submit(w)

    # ----------------------------------------------------------------- messages
    @handles(ParamKind.SHARDS)
    def shards(self, generation: int, env: Envelope) -> Any:
        """A worker lost a shard: the shard refs once newer than ``generation``, or
        ``(None, ())`` once the job failed."""
        if self.run.failure is not None:
            return (None, ())
        if generation < self._generation:
            return (self._generation, tuple(self.run.shards))
        self._parked.append((generation, env.defer()))
        return None

    @handles(ParamKind.CANCEL)
    def cancel(self, _: Any, env: Envelope) -> None:
        self._fail(JobFailed(f"job {self.name!r} was cancelled"))
        self._check()

    # ----------------------------------------------------------------- events
    def _membership(self, event: NodeEvent) -> None:
        node = NodeId(event.node_id)
        if event.kind is NodeEventKind.JOINED:
            if (event.role == "worker" and self.run.options.workers is None
                    and self.run.trains(node) and not self._ending() and node not in self._seen):
                log.info("job %s: worker %s joined; giving it a task", self.name, node)
                self._submit(node)
            return
        for i, host in enumerate(self.run.hosts):
            if host == node and not self._ending():
                self._restart_shard(i)
        self._check()

    def _task_ended(self, worker: NodeId, fut: Any) -> None:
        if self._running.pop(worker, None) is None:
            return
        try:
            result: WorkerResult = fut.result(0)
        except Exception as exc:
            # a worker task lost with its node (dead, or closing: the shard it called there
            # answered NodeLost) is a loss, told as one when the node is (a driver that lost
            # the manager as well learns it then, and says so)
            if isinstance(exc, NodeLost):
                self._statuses[worker] = "LOST"
                self._free_slots.append(self._slots[worker])
            else:
                self._statuses[worker] = "FAILED"
                if not self._asking:   # past the deadline, the timeout is the error told
                    self._fail(exc)
        else:
            self._results[worker] = result
            self._statuses[worker] = result.status.name
            if result.status == Status.FINISH:
                self._stopped = True
                self._halt_shards(result.stopped_at)
            elif result.status == Status.RELEASED:
                log.warning("job %s: worker %s released as a persistent straggler",
                            self.name, worker)
                self._free_slots.append(self._slots[worker])
        self._check()

    def _timed_out(self) -> None:
        """Out of time: ask the coordinator shard where each worker is, then fail saying so
        (before: "check the stop function" alone, also when a push or ``data=`` hung)."""
        if self._ending() or not self.run.shards:
            self._late(None)
            return
        self._asking = True
        self.ctx.request(self.run.shards[0], ParamKind.STATS, on_reply=self._late,
                         timeout_s=2.0)

    def _late(self, fut: Any) -> None:
        self._asking = False
        if not self._ending():
            stalled = None
            try:
                stats = fut.result(0) if fut is not None else None
                table = (dict(stats["steps"]), dict(stats["history"])) if stats else None
                stalled = stats.get("stalled") if stats else None
            except Exception:   # the shard is busy or gone: said without the steps
                table = None
            limit = self.run.options.timeout_s
            where = self._where(table)
            if stalled:   # the barrier held them all (before: blamed on stop, push or data=)
                hint = (f": {stalled}, and no worker joined that it might let go; check the "
                        "barrier")
            else:
                hint = ("; raise it, or check the stop function and the workers' logs"
                        + ("; if the steps stopped moving, a push, pull or data= does not "
                           "return (`py-spy dump` on that worker shows where)" if where else ""))
            late = ActorpyTimeout(f"job {self.name!r} did not reach its stop condition within "
                                  f"timeout_s={limit}{where}{hint}")
            late.job_timeout = (self.name, limit, where)   # for a CLI's wording
            self._fail(late)
        self._check()

    def _where(self, table: tuple[dict[NodeId, int], dict[NodeId, int]] | None) -> str:
        """Where the workers still running are (``table``: the coordinator shard's steps
        table and the steps of every worker it ever had): the steps each completed, and a
        word on one that is not in the table (never joined: stuck in ``data=``, and the
        others wait for it; joined before: it has not rejoined the restarted shard)."""
        running = sorted(self._running)
        if table is None or not running:
            return ""
        steps, history = table
        done = ", ".join(f"{w} {steps.get(w, history.get(w, '-'))}" for w in running)
        absent = [w for w in running if w not in steps and w not in history]
        # (or its task never started: a worker runs as many tasks at once as its threads,
        # and two jobs started together on one-thread workers can each hold the slot the
        # other waits for)
        stuck = (f"; {', '.join(absent)} has not joined: its data= has not returned (or its "
                 "task waits for a task slot another job's task holds on that worker), and the "
                 "first step waits for every worker" if absent else "")
        # its data= returned (a restarted shard's history is its checkpoint's table): before,
        # it was said not to have
        gone = [w for w in running if w not in steps and w in history]
        if gone:
            since = ("rejoined it since it was restarted" if 0 in self._restarted
                     else "come back to it")
            stuck += (f"; {', '.join(gone)} trained with server shard 0 but is not in its "
                      f"table now, and has not {since}")
        return f" (steps completed: {done}{stuck})"

    def _grace_over(self) -> None:
        if not self._over:
            log.warning("job %s: %d worker tasks still busy after the stop; not waiting for "
                        "them", self.name, len(self._running))
            left_running(self.run.cluster, self.name, self._running)
            self._finish()

    def _check(self) -> None:
        """After every event: end the job when it is over, or fail it when it cannot go on."""
        if self._over or self._asking:
            return
        if self._ending():
            if not self._running:
                self._finish()
            elif self._grace is None:
                grace = GRACE_S if self.run.failure is None else FAILED_GRACE_S
                self._grace = self.ctx.schedule(grace, self._grace_over)
        elif not self._running and self.run.options.workers is not None:
            self._fail(JobFailed(f"every worker of job {self.name!r} was lost "
                                 f"({', '.join(self._order)})"))
            self._check()
        elif not self._running and not self._warned_empty:
            self._warned_empty = True
            log.warning("job %s: no worker left; waiting for workers to join until the "
                        "job's timeout", self.name)

    def _ending(self) -> bool:
        return self._stopped or self.run.failure is not None

    # ----------------------------------------------------------------- shards
    def _restart_shard(self, i: int) -> None:
        run = self.run
        if self.ctx.node.is_dead(MANAGER_ID):   # this driver left the cluster: every node
            self._fail(JobFailed(                # looks dead, no shard or checkpoint helps
                f"job {self.name!r}: this driver lost its connection to the cluster's "
                "manager, so the job cannot go on; is `actorpy manager` still running?"))
            return
        if run.checkpoint_dir is None:
            lost = (f"server shard {i} of job {self.name!r} was lost with its node "
                    f"{run.hosts[i]} and there is no checkpoint to restart it from")
            failed = JobFailed(f"{lost}; pass checkpoint_dir= (and checkpoint_every=) to "
                               "survive this")
            failed.shard_lost = lost   # for a command line to word with its flags
            self._fail(failed)
            return
        # A live worker that neither trains nor hosts a shard, else one that hosts none.
        live = [w for w in self.ctx.workers() if w != run.hosts[i]]
        free = [w for w in live if w not in run.hosts]
        spare = [w for w in free if w not in self._running] or free or live
        if not spare:
            self._fail(JobFailed(f"server shard {i} was lost and no live worker can host it"))
            return
        log.warning("job %s: server shard %d lost with %s; restarting it on %s from %s",
                    self.name, i, run.hosts[i], spare[0], run.checkpoint_dir)
        assert run.base_spec is not None
        spec = replace(run.base_spec, resume=True)
        try:
            run.shards[i] = run.start_shard(i, spare[0], spec, list(self._running))
        except ActorpyError as exc:
            self._fail(JobFailed(f"server shard {i} was lost and could not be restarted on "
                                 f"{spare[0]} ({exc})"))
            return
        run.hosts[i] = spare[0]
        self._restarts += 1
        self._restarted.add(i)
        self._generation += 1
        self._answer_parked()

    def _answer_parked(self) -> None:
        """Answer workers asking for a newer shard directory, when there is one."""
        keep = []
        for generation, reply in self._parked:
            if self.run.failure is not None:
                reply.send((None, ()))
            elif generation < self._generation:
                reply.send((self._generation, tuple(self.run.shards)))
            else:
                keep.append((generation, reply))
        self._parked = keep

    def _halt_shards(self, at_step: int | None = None, kind: ParamKind = ParamKind.HALT
                     ) -> None:
        """Stop every shard: at once, or (the job met its stop condition at ``at_step``)
        once their workers reached that step, so all shards end on the same round; with
        ``ParamKind.ABORT`` (the job failed) at once, answering the workers HALTED."""
        if self._halted:
            return
        self._halted = True
        for ref in self.run.shards:
            if not self.ctx.node.is_dead(ref.node):
                try:
                    self.ctx.cast(ref, kind, at_step)
                except ActorpyError as exc:
                    log.debug("could not tell shard %s: %s", ref, exc)

    # ----------------------------------------------------------------- helpers
    def _submit(self, worker: NodeId) -> None:
        run, o = self.run, self.run.options
        self._seen.add(worker)
        slot = (self._free_slots.pop(0) if self._free_slots
                else max(self._slots.values(), default=-1) + 1)
        self._slots[worker] = slot
        left = max(1.0, run.t0 + o.timeout_s - self.ctx.clock.now())
        task = WorkerTask(run.job.push, run.job.data, tuple(run.shards), run.key_map,
                          self.ctx.ref, self._generation, slot, self._slots_total,
                          run.job.seed, o.batch, left, o.overlap)
        try:
            fut = run.cluster.submit_task(task, worker, what=f"worker task of job {self.name!r}")
        except SerializationError as exc:
            # push or data cannot be pickled (a lock, a generator): no worker can ever get a
            # task, so fail now; before, it was taken for a worker that died meanwhile and
            # the job waited out its timeout
            self._fail(exc)
            self.ctx.schedule(0.0, self._check)   # __init__ may be submitting: end later
            return
        except ActorpyError as exc:   # it died meanwhile: its DEAD event follows
            log.info("job %s: could not give %s a task: %s", self.name, worker, exc)
            return
        self._running[worker] = fut
        self._order.append(worker)
        self.ctx.when_done(fut, lambda f, w=worker: self._task_ended(w, f))

    def _fail(self, exc: BaseException) -> None:
        if self.run.failure is None:
            self.run.failure = exc
        self._halt_shards(kind=ParamKind.ABORT)
        self._answer_parked()

    def _finish(self) -> None:
        """Collect the model and the stats, stop the shards and this service, wake
        ``Run.result``."""
        self._over = True
        run = self.run
        try:
            self._collect()
        except BaseException as exc:   # never leave result() waiting
            log.exception("job %s: collecting the model failed", self.name)
            run.failure = run.failure or exc
        finally:
            self._deadline.cancel()
            run.stop_services()
            self._answer_parked()
            self.ctx.stop_service(self.ctx.ref)
            run.finished.set()

    def _collect(self) -> None:
        run = self.run
        model: dict[str, Any] = {}
        shard_stats: list[dict[str, Any]] = []
        wait = 30.0 if run.failure is None else FAILED_GRACE_S
        for i, ref in enumerate(run.shards):
            try:
                model.update(self.ctx.call(ref, ParamKind.MODEL, True, timeout_s=wait))
                shard_stats.append(self.ctx.call(ref, ParamKind.STATS, timeout_s=wait))
            except ActorpyError as exc:
                log.warning("job %s: could not collect shard %d: %s", self.name, i, exc)
                if run.failure is None:
                    run.failure = JobFailed(f"could not collect server shard {i}: {exc}")
        run.model = model
        coordinator = shard_stats[0] if shard_stats else {}
        history = coordinator.get("history", {})
        steps = [self._results[w].steps if w in self._results else history.get(w, 0)
                 for w in self._order]
        trace = sorted((row for s in shard_stats for row in s.get("trace", [])),
                       key=lambda row: row["t"])
        run.stats = RunStats(list(self._order), steps,
                             max((s["updates"] for s in shard_stats), default=0),
                             float(coordinator.get("train_seconds") or 0.0),
                             dict(self._statuses), self._restarts,
                             coordinator.get("first_push_wall"), shard_stats, trace,
                             sum(s.get("checkpoint_failures", 0) for s in shard_stats))
        if run.stats.checkpoint_failures:
            said = "; ".join(f"shard {i}: {s['checkpoint_failures']} (the last: "
                             f"{s['checkpoint_error']}), its last written at step "
                             f"{s['checkpoint_step']}" for i, s in enumerate(shard_stats)
                             if s.get("checkpoint_failures"))
            log.warning("job %s: %d checkpoints could not be written; %s; a resume starts "
                        "from the last one written", self.name, run.stats.checkpoint_failures,
                        said)
