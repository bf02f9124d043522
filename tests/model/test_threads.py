"""model.threads: the thread count surgery tune computes with: the user's, else OMP_NUM_THREADS's,
else the cores the machine's other jobs leave idle."""

from __future__ import annotations

import os

import pytest
import torch

from surgery.model import threads


@pytest.fixture(autouse=True)
def _keep_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_idle_cores_are_the_cores_less_the_load(monkeypatch):
    monkeypatch.setattr(threads, "usable_cores", lambda: 8)
    for load, idle in ((0.2, 8), (2.6, 5), (7.9, 1), (30.0, 1)):
        monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, load, load))
        assert threads.idle_cores() == idle


def test_a_requested_count_wins_then_omp_num_threads_then_the_idle_cores(monkeypatch):
    monkeypatch.setattr(threads, "idle_cores", lambda: 1)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    torch.set_num_threads(2)
    with threads.threads(1) as count:
        assert count == torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2  # restored: the caller's count outlives the tune
    with threads.threads(None) as count:
        assert count == 2  # the user's OMP_NUM_THREADS, left as torch read it
    monkeypatch.delenv("OMP_NUM_THREADS")
    with threads.threads(None) as count:
        assert count == 1
    assert torch.get_num_threads() == 2
