"""Hypothesis state machine: random alloc / fork / free / write / decode / verify+commit / flush
sequences against the fp64 step recurrence."""

import torch
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import replayssm as rs
from helpers import SPECS, TOL, Driver


class PoolMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.driver = None

    @rule(family=st.sampled_from(list(SPECS)), window=st.sampled_from([1, 2, 5]), drafts=st.sampled_from([0, 2]),
          read_format=st.sampled_from(["checkpoint", "fp8"]), seed=st.integers(0, 2**16))
    @precondition(lambda self: self.driver is None)
    def start(self, family, window, drafts, read_format, seed):
        cfg = rs.ReplayConfig(window=window, max_draft_tokens=drafts, read_format=read_format)
        self.driver = Driver(SPECS[family], cfg, num_layers=2, num_slots=6, gen=torch.Generator().manual_seed(seed))
        self.live = []
        self.errs = []

    def _pick(self, data_mask):
        chosen = [s for s, m in zip(self.live, data_mask) if m]
        return torch.tensor(chosen or self.live[:1], dtype=torch.int64)

    @precondition(lambda self: self.driver is not None and len(self.live) < 6)
    @rule(n=st.integers(1, 2))
    def alloc(self, n):
        n = min(n, 6 - len(self.live))
        self.live += self.driver.alloc(n).tolist()

    @precondition(lambda self: self.driver is not None and self.live and len(self.live) < 6)
    @rule(i=st.integers(0, 5))
    def fork(self, i):
        parent = torch.tensor([self.live[i % len(self.live)]])
        child = self.driver.pool.fork(parent)
        for o in self.driver.oracle:
            o[child.item()] = o[parent.item()].clone()
        self.live.append(child.item())

    @precondition(lambda self: self.driver is not None and self.live)
    @rule(i=st.integers(0, 5))
    def free(self, i):
        s = self.live.pop(i % len(self.live))
        self.driver.pool.free(torch.tensor([s]))

    @precondition(lambda self: self.driver is not None and self.live)
    @rule(layer=st.integers(0, 1), mask=st.lists(st.booleans(), min_size=6, max_size=6))
    def write(self, layer, mask):
        slots = self._pick(mask)
        state = torch.randn(slots.numel(), *self.driver.spec.state_shape, generator=self.driver.gen)
        self.driver.pool.write_state(layer, slots, state)
        for s, x in zip(slots.tolist(), state):
            self.driver.oracle[layer][s] = x.double()

    @precondition(lambda self: self.driver is not None and self.live)
    @rule(mask=st.lists(st.booleans(), min_size=6, max_size=6), pad=st.booleans())
    def decode(self, mask, pad):
        slots = self._pick(mask)
        if pad:
            slots = torch.cat((torch.tensor([-1]), slots))
        self.errs += self.driver.decode(slots)

    @precondition(lambda self: self.driver is not None and self.live and self.driver.cfg.max_draft_tokens)
    @rule(mask=st.lists(st.booleans(), min_size=6, max_size=6), T=st.integers(1, 3), data=st.data())
    def verify(self, mask, T, data):
        slots = self._pick(mask)
        acc = torch.tensor([data.draw(st.integers(1, T)) for _ in range(slots.numel())])
        self.errs += self.driver.verify(slots, T, acc)

    @precondition(lambda self: self.driver is not None and self.live)
    @rule(mask=st.lists(st.booleans(), min_size=6, max_size=6))
    def flush(self, mask):
        self.driver.pool.flush(self._pick(mask))

    @invariant()
    def matches_step_recurrence(self):
        if self.driver is None or not self.live:
            return
        tol = TOL[self.driver.cfg.read_format] if self.driver.cfg.read_format != "checkpoint" else TOL["float32"]
        assert max(self.errs, default=0.0) < tol
        assert self.driver.state_error(torch.tensor(self.live)) < TOL["float32"]


PoolMachine.TestCase.settings = settings(max_examples=25, stateful_step_count=25, deadline=None)
TestPoolMachine = PoolMachine.TestCase
