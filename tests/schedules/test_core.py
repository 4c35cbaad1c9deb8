"""Cron and interval times, daylight saving time as cron and Kubernetes CronJob, catch-up after an outage."""

from __future__ import annotations

import datetime

from agentrun.worker.core.schedules import Schedule, cron_problem, due, next_time, timezone_problem

UTC = datetime.UTC


def at(*args: int) -> datetime.datetime:
    return datetime.datetime(*args, tzinfo=UTC)


def cron(expr: str, tz: str = "UTC", **kw: object) -> Schedule:
    return Schedule("s", expr, None, tz, {}, {}, **kw)  # type: ignore[arg-type]


def test_spring_forward_runs_a_skipped_time_once_at_the_jump() -> None:
    # 2026-03-08, New York: 02:00 EST becomes 03:00 EDT; 02:30 does not exist that day.
    s = cron("30 2 * * *", "America/New_York")
    first = next_time(s, at(2026, 3, 8, 5, 0))  # 00:00 EST
    assert first == at(2026, 3, 8, 7, 0)  # 03:00 EDT: at the jump
    assert next_time(s, first) == at(2026, 3, 9, 6, 30)  # 02:30 EDT the next day
    hourly = cron("0 * * * *", "America/New_York")  # an hourly job has no 02:00 that day, and none twice
    times = [at(2026, 3, 8, 5, 30)]
    for _ in range(3):
        nxt = next_time(hourly, times[-1])
        assert nxt is not None
        times.append(nxt)
    assert times[1:] == [at(2026, 3, 8, 6, 0), at(2026, 3, 8, 7, 0), at(2026, 3, 8, 8, 0)]


def test_fall_back_runs_a_repeated_time_once() -> None:
    # 2026-11-01, New York: 02:00 EDT becomes 01:00 EST; 01:30 happens twice.
    s = cron("30 1 * * *", "America/New_York")
    first = next_time(s, at(2026, 11, 1, 4, 0))  # 00:00 EDT
    assert first == at(2026, 11, 1, 5, 30)  # 01:30 EDT, the first of the two
    assert next_time(s, first) == at(2026, 11, 2, 6, 30)  # not 06:30Z the same day (01:30 EST)


def test_time_zones_shift_cron() -> None:
    assert next_time(cron("0 9 * * *", "Europe/Berlin"), at(2026, 1, 15, 0, 0)) == at(2026, 1, 15, 8, 0)
    assert next_time(cron("0 9 * * *", "Europe/Berlin"), at(2026, 7, 15, 0, 0)) == at(2026, 7, 15, 7, 0)


def test_bad_cron_and_time_zones_say_why() -> None:
    assert cron_problem("* * *") and cron_problem("61 * * * *") and cron_problem("* * * * * *")
    assert cron_problem("x" * 500) and cron_problem("* * * * \x00")
    assert cron_problem("*/5 9-17 * * 1-5") is None
    assert timezone_problem("Mars/Olympus") and timezone_problem("../etc/passwd") and timezone_problem("")
    assert timezone_problem("Europe/Berlin") is None and timezone_problem("UTC") is None


def test_intervals_count_from_the_anchor() -> None:
    s = Schedule("s", None, 10, "UTC", {}, {}, anchor=at(2026, 1, 1, 0, 0, 0))
    assert next_time(s, at(2026, 1, 1, 0, 0, 0)) == at(2026, 1, 1, 0, 0, 10)
    assert next_time(s, at(2026, 1, 1, 0, 0, 25)) == at(2026, 1, 1, 0, 0, 30)


def test_after_an_outage_one_catch_up_run_within_the_deadline_and_the_rest_missed() -> None:
    s = Schedule("s", None, 1, "UTC", {}, {}, anchor=at(2026, 1, 1), next_due_at=at(2026, 1, 1, 0, 0, 1))
    d = due(s, at(2026, 1, 1, 0, 0, 30, 500000))
    assert d.run == at(2026, 1, 1, 0, 0, 30) and d.missed == 29 and len(d.missed_times) == 29
    assert d.next_due == at(2026, 1, 1, 0, 0, 31)
    late = due(s, at(2026, 1, 2))  # a day later: the latest tick is on time, 86,399 are missed, 100 listed
    assert late.run == at(2026, 1, 2) and late.missed == 86_399 and len(late.missed_times) == 100
    strict = Schedule("s", "* * * * *", None, "UTC", {}, {}, next_due_at=at(2026, 1, 1, 0, 1),
                      starting_deadline_seconds=10)
    gone = due(strict, at(2026, 1, 1, 0, 3, 30))  # the latest tick (00:03) is 30 s late: past 10 s
    assert gone.run is None and gone.missed == 3 and gone.next_due == at(2026, 1, 1, 0, 4)
    assert due(strict, at(2026, 1, 1, 0, 0, 30)).run is None  # not due yet
