"""A long-lived service on a worker: it keeps state and handles messages one at a time,
in arrival order, like a parameter-server shard. Handlers per kind, a reply given later
(with a timer to give up), and a task that streams its progress back to the driver.

    python examples/counter_service.py
"""
import actorpy
from actorpy.runtime.service import Envelope, Service, ServiceContext, handles

ADD, READ, WAIT_FOR = 1, 2, 3      # this service's own message kinds


class Counter(Service):
    def __init__(self, ctx: ServiceContext, start: int) -> None:
        super().__init__(ctx)
        self.total = start
        self.waiting = []                                  # (target, Reply, timer)

    @handles(ADD)
    def add(self, n: int, env: Envelope) -> None:          # a cast: nothing to return
        self.total += n
        for entry in [e for e in self.waiting if self.total >= e[0]]:
            _, reply, timer = entry
            timer.cancel()
            reply.send(self.total)                         # answers a WAIT_FOR given earlier
            self.waiting.remove(entry)

    @handles(READ)
    def read(self, _: None, env: Envelope) -> int:        # the value is the reply
        return self.total

    @handles(WAIT_FOR)
    def wait_for(self, target: int, env: Envelope) -> None:
        reply = env.defer()                                # reply later, keep serving
        give_up = self.ctx.schedule(60.0, reply.fail, TimeoutError(f"{target} not reached"))
        self.waiting.append((target, reply, give_up))      # the timer runs on this thread


def count_up(ctx, ref, n):                                 # a task that reports progress
    for i in range(n):
        ctx.cast(ref, ADD, i)
        ctx.emit(f"added {i}")
    return n


def main() -> None:
    with actorpy.connect(workers=1) as cluster:
        ref = cluster.start_service(Counter, 100, name="counter")
        print(f"service {ref.name!r} runs on {ref.node} as service {ref.service}")
        assert cluster.lookup("counter") == ref
        waiter = cluster.call_async(ref, WAIT_FOR, 140)    # answered once the total gets there
        with cluster.submit_stream(count_up, ref, 10) as progress:
            for line in progress:
                print("progress:", line)
        print("reached:", waiter.result(30))
        print("total:", cluster.call(ref, READ, timeout_s=30))   # 145
        cluster.stop_service(ref)


if __name__ == "__main__":
    main()
