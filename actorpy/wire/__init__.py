"""The wire: what travels between actorpy processes.

Files:
    kinds.py    core message kinds (an IntEnum) and PROTOCOL_VERSION
    header.py   the fixed header frame: encode, decode, validate (pure)
    serde.py    pickle 5 (the C pickler for plain values, else cloudpickle), numpy/torch buffers
                over 16 KB out of band, smaller ones in band; the only ``loads``
    auth.py     cluster secrets, CURVE keys and the allow-list authenticator
    message.py  a received message (header + frames) and frame assembly for sending
"""
