"""The three engines, each built only on the core (``actorpy``); engines never import each other.

Files:
    mapre/   lazy map-reduce datasets (load, map, flat_map, reduce_by_key, collect, ...)
    param/   parameter server: register_schedule/push/pull/barrier/stop + run
    peer/    peer-to-peer engine over a Kademlia overlay, same callbacks as param
"""
