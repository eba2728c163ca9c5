"""A long-lived service on a worker: it keeps state and handles messages one at a time,
in arrival order, like a parameter-server shard.

    python examples/counter_service.py
"""
import actorpy

ADD, READ = 1, 2      # this service's own message kinds


class Counter:
    def __init__(self, ctx, start: int) -> None:
        self.total = start

    def handle(self, msg, ctx) -> None:
        if msg.kind == ADD:
            self.total += msg.payload()
        elif msg.kind == READ:
            ctx.reply(msg, self.total)
        else:
            raise ValueError(f"unknown kind {msg.kind}")   # the caller gets a RemoteError


def main() -> None:
    with actorpy.connect(workers=1) as cluster:
        ref = cluster.start_service(Counter, 100, name="counter")
        print(f"service {ref.name!r} runs on {ref.node} as service {ref.service}")
        for i in range(10):
            cluster.cast(ref, ADD, i)                      # one-way, in order
        print("total:", cluster.call(ref, READ, timeout_s=30))   # 145
        cluster.stop_service(ref)


if __name__ == "__main__":
    main()
