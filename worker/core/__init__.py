"""The pure core: what a run is and how its step log replays, with no I/O of its own.

Records, replay, guards, decisions, structured answers, pricing, text hygiene, the model-neutral types
the replay and pricing need, and the observer protocols. Nothing here imports another room of ours.
"""
