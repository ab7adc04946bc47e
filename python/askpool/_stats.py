"""Typed views of the statistics dicts the extension returns."""

from __future__ import annotations

from typing import TypedDict


class PoolStats(TypedDict):
    name: str
    in_flight: int
    queued: int
    admitted: int
    handler_runs: int
    duplicate_acks: int
    replays: int
    suppressed_replies: int
    rejected_full: int
    cancels: int
    expired: int
    dedup_in_progress: int
    dedup_terminal: int


class NodeStats(TypedDict):
    pending: int
    armed_timers: int
    retries: int
    late_outcomes: int
    timed_out_records: int
    dlq_depth: int
    dlq_dropped: int
    pools: dict[str, PoolStats]
