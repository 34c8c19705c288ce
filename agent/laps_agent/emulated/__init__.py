"""Emulated engines: the engine's protocol and LAPS scheduler with time from a cost model.

`profile` (cost-model profiles), `core` (the engine model, shared with `laps sim`; its
`requests` in and events out, `prefill_cost` its batch durations), `engine`
(the wall-clock driver behind the engine's HTTP server), `build` and `cli` (`laps engine --backend
emulated`: its server, its entry).
"""
