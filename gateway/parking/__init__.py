"""Claims parked in the gateway: an idle collector's long-poll waits here, not in the router.

decide.py says whether a claim may park (pure), hub.py holds the watches and parked claims on
one Redis subscription, beats.py writes parked claims' heartbeats to Redis in batches.
"""
