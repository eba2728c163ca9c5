"""The process runtime.

Files:
    node.py         one process's endpoint (facade): send/request/on/call_later/add_peer...
    directory.py    peers, the dead, parked messages, one DEALER link per peer, backpressure
    events.py       Peer records, membership events (JOINED/LEFT/DEAD) and their listeners
    requests.py     the request/reply table: pending requests by id, destination, deadline
    receive.py      the receive path: authenticate, validate, dispatch (one function)
    loop.py         the I/O thread: polls sockets, runs ticks, never dies silently
    timers.py       call_later timers (TimerHandle, TimerQueue)
    liveness.py     pure failure detection: link state, suspect/dead verdicts, stall guard
    reply.py        ReplyFuture: a reply that unpickles in the waiting thread
    membership.py   register, heartbeat, directory of peers, manager loss
    manager.py      the registry and failure detector (never runs user code)
    worker.py       runs tasks and hosts services for any engine
    context.py      WorkerContext / Caller / ServiceRef / object store given to tasks
    remote.py       RemoteFailure capture and RemoteError rebuild
    local.py        the embedded local cluster's processes (lifeline, 0700 ipc dir)
    cluster.py      connect() and the driver's Cluster handle
"""
