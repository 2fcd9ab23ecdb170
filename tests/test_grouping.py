"""The entropy stage's group commit (encoders/grouping.py) and encode_ints_many on the CPU."""

import contextlib
import threading
import time

import numpy as np
import pytest

from visemz.encoders import EncoderConfig, decode_ints, encode_ints, encode_ints_many, start_encode_ints
from visemz.encoders.grouping import Grouped
from visemz.errors import CorruptStreamError, InvalidArgumentError

from .helpers import check_switch_setting, make_ints

WAIT = 30.0  # seconds a test waits for threads before it fails (never reached when the code is right)


def _until(cond) -> None:
    end = time.monotonic() + WAIT
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("threads did not reach the expected state")
        time.sleep(0.001)


class Recorder:
    """A grouped run that records its batches; its first batch holds until ``release`` is set."""

    def __init__(self):
        self.batches: list[list[int]] = []
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, payloads):
        self.batches.append(list(payloads))
        if len(self.batches) == 1:
            self.started.set()
            assert self.release.wait(WAIT)
        return [10 * p for p in payloads]


def _submit_all(group, payloads, results, errors):
    def one(p):
        try:
            results[p] = group.submit(p)
        except BaseException as e:  # noqa: BLE001 - the test inspects what each thread got
            errors[p] = e

    threads = [threading.Thread(target=one, args=(p,)) for p in payloads]
    for t in threads:
        t.start()
    return threads


def test_a_lone_request_runs_at_once_by_itself():
    rec = Recorder()
    rec.release.set()
    g = Grouped(rec)
    assert g.submit(3) == 30
    assert g.submit(4) == 40
    assert rec.batches == [[3], [4]]
    assert (g.batches, g.payloads, g.pending()) == (2, 2, 0)


def test_requests_arriving_during_a_batch_form_the_next_batch_and_each_gets_its_result():
    rec = Recorder()
    g = Grouped(rec)
    results, errors = {}, {}
    first = _submit_all(g, [0], results, errors)
    assert rec.started.wait(WAIT)
    rest = _submit_all(g, [1, 2, 3, 4], results, errors)
    _until(lambda: g.pending() == 4)
    rec.release.set()
    for t in first + rest:
        t.join(WAIT)
    assert not errors
    assert results == {p: 10 * p for p in range(5)}
    assert rec.batches[0] == [0] and sorted(rec.batches[1]) == [1, 2, 3, 4] and len(rec.batches) == 2
    assert (g.batches, g.payloads, g.pending()) == (2, 5, 0)


def test_an_error_reaches_every_thread_of_its_batch_and_the_group_goes_on():
    calls = []

    def run(payloads):
        calls.append(list(payloads))
        if len(calls) == 2:
            raise CorruptStreamError("bad batch")
        if len(calls) == 1:
            _until(lambda: g.pending() == 3)
        return payloads

    g = Grouped(run)
    results, errors = {}, {}
    threads = _submit_all(g, [0], results, errors)
    _until(lambda: len(calls) == 1)
    threads += _submit_all(g, [1, 2, 3], results, errors)
    for t in threads:
        t.join(WAIT)
    assert results == {0: 0}
    assert sorted(errors) == [1, 2, 3] and all(isinstance(e, CorruptStreamError) for e in errors.values())
    assert g.submit(7) == 7 and g.pending() == 0


def test_submit_async_returns_while_the_batch_runs():
    rec = Recorder()
    g = Grouped(rec)
    fut = g.submit_async(2)
    assert rec.started.wait(WAIT)
    assert not fut.done()
    rec.release.set()
    assert fut.result(WAIT) == 20


def test_a_worker_context_that_fails_fails_its_callers_and_the_next_request_retries():
    tries = []

    def context():
        tries.append(1)
        if len(tries) == 1:
            raise CorruptStreamError("no device here")
        return contextlib.nullcontext()

    g = Grouped(lambda payloads: list(payloads), context=context)
    with pytest.raises(CorruptStreamError, match="no device"):
        g.submit(1)
    assert g.submit(2) == 2 and len(tries) == 2


def test_a_run_returning_the_wrong_count_is_an_error():
    g = Grouped(lambda payloads: [])
    with pytest.raises(RuntimeError, match="0 results for 1"):
        g.submit(1)
    assert g.pending() == 0


CONFIGS = [EncoderConfig(p, b, e) for p in ("global", "block") for b in (True, False) for e in ("zstd", "none")]


def test_encode_ints_many_writes_what_encode_ints_writes():
    items = []
    for i, cfg in enumerate(CONFIGS):
        for n in (0, 1, 5000, 70_001):  # 70k values: several 16 KiB frames
            items.append((make_ints("latent", n, seed=10 * i + n % 7, scale=0.8), cfg))
    got = encode_ints_many(items)
    assert len(got) == len(items)
    for (a, cfg), b in zip(items, got):
        assert b == encode_ints(a, policy=cfg.policy, bitshuffle=cfg.bitshuffle, entropy=cfg.entropy)
        np.testing.assert_array_equal(decode_ints(b), a.reshape(-1))
    assert encode_ints_many([]) == []
    assert start_encode_ints(items[:3])() == got[:3]


def test_encode_ints_many_names_a_bad_pair():
    with pytest.raises(InvalidArgumentError, match="EncoderConfig"):
        encode_ints_many([(np.zeros(3, np.int32), {"policy": "block"})])


def test_entropy_batch_environment_setting(monkeypatch):
    check_switch_setting(monkeypatch, "VISEMZ_ENTROPY_BATCH", "entropy_batch")
