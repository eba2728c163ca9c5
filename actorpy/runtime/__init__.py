"""The process runtime.

Files:
    node.py         one process's endpoint: ROUTER + per-peer DEALERs + I/O thread
    reply.py        ReplyFuture: a reply that unpickles in the waiting thread
    membership.py   register, heartbeat, directory of peers, manager loss
    manager.py      the registry and failure detector (never runs user code)
    worker.py       runs tasks and hosts services for any engine
    context.py      WorkerContext / Caller / ServiceRef / object store given to tasks
    remote.py       RemoteFailure capture and RemoteError rebuild
    local.py        the embedded local cluster: lifeline, 0700 ipc dir (last one out removes it)
    cluster.py      connect() and the driver's Cluster handle
"""
