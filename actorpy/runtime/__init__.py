"""The process runtime.

Files:
    node.py         one process's endpoint (facade): sockets, lifecycle, on/call_later, the tick
    node_peers.py   Node's directory calls: add_peer, links' verdicts, mark_dead, subscribe
    node_messages.py  Node's messaging calls: send, request (deadlines), wait, call, reply
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
    worker.py       a worker process: task runner + service host + object store
    tasks.py        the task pool: per-task contexts, cancellation, the worker end of streams
    stream.py       the driver end of streams: TaskStream, flow-control credit
    host.py         ServiceHost: starts, stops, routes to and reports on a node's services
    runner.py       ServiceRunner: one service's thread, from factory to its end
    mailbox.py      a service's bounded inbox; u16 service ids, reused, remembered
    service.py      Service base class with @handles, Envelope (the engines' API)
    service_context.py  ServiceContext: request(on_reply=), schedule, subscribe, Reply
    names.py        service names, kept by the manager
    context.py      WorkerContext / Caller / ServiceRef given to tasks (put, fetch, fetch_iter)
    store.py        ObjectStore: a worker's blocks within a byte budget, streams in segments
    spill.py        spill files for what exceeds the budget (private dir, mmap reads)
    keyindex.py     keys as a '/' tree: delete by prefix in O(keys removed)
    fetch.py        reading another worker's store: whole blocks or segment by segment
    remote.py       RemoteFailure capture and RemoteError rebuild
    local.py        the embedded local cluster: lifeline, 0700 ipc dir (last one out removes it)
    launch.py       how it starts its processes: forked from a single-threaded driver, else spawned
    cluster.py      connect() and the driver's Cluster handle
"""
