from dualpath.sim.events import PRIO_ARRIVAL, PRIO_COMPLETE, PRIO_SCHEDULE, EventLoop


def test_time_then_priority_then_insertion_order():
    loop = EventLoop()
    seen = []
    loop.call_at(1.0, seen.append, "sched", PRIO_SCHEDULE)
    loop.call_at(1.0, seen.append, "arrive-a", PRIO_ARRIVAL)
    loop.call_at(0.5, seen.append, "early", PRIO_SCHEDULE)
    loop.call_at(1.0, seen.append, "complete", PRIO_COMPLETE)
    loop.call_at(1.0, seen.append, "arrive-b", PRIO_ARRIVAL)
    loop.run()
    assert seen == ["early", "complete", "arrive-a", "arrive-b", "sched"]
    assert loop.num_events == 5


def test_cannot_schedule_in_the_past():
    loop = EventLoop()
    loop.call_at(1.0, lambda _: None)
    loop.run()
    try:
        loop.call_at(0.5, lambda _: None)
    except ValueError:
        return
    raise AssertionError("scheduling in the past must fail")
