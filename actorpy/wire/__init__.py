"""The wire: what travels between actorpy processes.

Files:
    kinds.py    core message kinds (an IntEnum) and PROTOCOL_VERSION
    header.py   the fixed header frame: encode, decode, validate (pure)
    serde.py    cloudpickle with pickle-5 out-of-band buffers for numpy/torch; the only ``loads``
    auth.py     cluster secrets, CURVE keys and the allow-list authenticator
    message.py  a received message (header + frames) and frame assembly for sending
"""
