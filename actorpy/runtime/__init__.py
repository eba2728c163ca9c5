"""The process runtime.

Files:
    node.py         one process's endpoint: ROUTER + per-peer DEALERs + I/O thread
    reply.py        ReplyFuture: a reply that unpickles in the waiting thread
    membership.py   register, heartbeat, directory of peers, manager loss
    manager.py      the registry and failure detector (never runs user code)
    worker.py       runs tasks and hosts services for any engine
    context.py      WorkerContext / Caller / ServiceRef given to tasks (put, fetch, fetch_iter)
    store.py        ObjectStore: a worker's blocks within a byte budget, streams in segments
    spill.py        spill files for what exceeds the budget (private dir, mmap reads)
    keyindex.py     keys as a '/' tree: delete by prefix in O(keys removed)
    fetch.py        reading another worker's store: whole blocks or segment by segment
    remote.py       RemoteFailure capture and RemoteError rebuild
    local.py        the embedded local cluster's processes (lifeline, 0700 ipc dir)
    cluster.py      connect() and the driver's Cluster handle
"""
