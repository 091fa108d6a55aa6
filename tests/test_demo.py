"""transformers' own hybrid models decoded through ReplayCache: tokens and logits match
transformers' own cache decode, speculative decoding matches greedy, and the check notices a
wrong state."""

import contextlib

import pytest
import torch

import replayssm as rs

pytest.importorskip("transformers")
from transformers import DynamicCache  # noqa: E402

from replayssm.integrations.transformers import demo  # noqa: E402
from replayssm.integrations.transformers.cache import ReplayCache  # noqa: E402
from replayssm.integrations.transformers.models import MODELS, tiny_model  # noqa: E402

STEPS = 24
WINDOW = 4          # several flushes within STEPS
DRAFTS = 3
# fp32 replay vs transformers' recurrence: rounding only (measured <= 1e-6); a 0.1 % error in one
# recurrent layer's output already moves the logits by >= 2e-4
LOGIT_TOL = 1e-5


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=MODELS)
def setup(request):
    model = tiny_model(request.param)
    prompt = torch.randint(3, model.config.vocab_size, (1, demo.PROMPT_LEN), generator=torch.Generator().manual_seed(1))
    ref = demo.decode_greedy(model, DynamicCache(config=model.config), contextlib.nullcontext(), prompt, STEPS,
                             lambda n: None)
    return model, prompt, ref


def _replay(model, max_draft=0, read_format="checkpoint"):
    cfg = rs.ReplayConfig(window=WINDOW, max_draft_tokens=max_draft, read_format=read_format)
    return ReplayCache(model, cfg, batch_size=1, backend="reference")


def test_replay_matches_transformers_cache(setup):
    model, prompt, ref = setup
    cache = _replay(model)
    run = demo.decode_greedy(model, cache, cache.routing(), prompt, STEPS, lambda n: None)
    assert run.tokens == ref.tokens
    assert demo.logit_drift(run, ref).max() < LOGIT_TOL
    assert demo.next_token_kl(run, ref).abs().max() < 1e-9
    layers = len(cache.layer_map)
    assert cache.checkpoint_writes() == layers * ((STEPS - 1) // WINDOW)  # one flush per window per layer
    assert cache.pool.read_state(0, cache.slots).abs().sum() > 0


def test_state_error_is_noticed(setup):
    """The same comparison with the prefill's state dropped (zeros in the pool) must fail."""
    model, prompt, ref = setup
    cache = _replay(model)
    write = cache.pool.write_state
    cache.pool.write_state = lambda layer, slots, state: write(layer, slots, torch.zeros_like(state))
    run = demo.decode_greedy(model, cache, cache.routing(), prompt, STEPS, lambda n: None)
    assert demo.logit_drift(run, ref).max() > 100 * LOGIT_TOL
    assert demo.next_token_kl(run, ref).mean() > 1e3 * demo.next_token_kl(ref, ref).abs().max() + 1e-12


def test_speculative_matches_greedy(setup):
    """Drafts from the greedy continuation with every third one wrong: accepts and rejects both happen."""
    model, prompt, ref = setup
    start = prompt.shape[1]

    def drafts(tokens, k):
        pos = len(tokens) - start
        guess = ref.tokens[pos:pos + k]
        return [t if (pos + i) % 3 else (t + 1) % model.config.vocab_size for i, t in enumerate(guess)]

    cache = _replay(model, DRAFTS)
    run = demo.decode_speculative(model, cache, prompt, STEPS, lambda n: None, draft=drafts)
    assert run.tokens == ref.tokens
    assert demo.logit_drift(run, ref).max() < LOGIT_TOL
    assert 0 < run.notes["accepted"] < run.notes["drafted"]


def test_prompt_lookup_speculative_matches_greedy(setup):
    model, prompt, ref = setup
    cache = _replay(model, DRAFTS)
    run = demo.decode_speculative(model, cache, prompt, STEPS, lambda n: None)
    assert run.tokens == ref.tokens
    assert run.notes["drafted"] > 0


@pytest.mark.parametrize("name", MODELS)
def test_triton_backend_matches(name):
    """The Triton kernels (compiled on a GPU, Triton's interpreter on a CPU) behind the same
    adapter: greedy and speculative tokens match transformers' cache."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    steps = 10
    model = tiny_model(name, device=device)
    prompt = torch.randint(3, model.config.vocab_size, (1, demo.PROMPT_LEN), generator=torch.Generator().manual_seed(1))
    prompt = prompt.to(device)
    ref = demo.decode_greedy(model, DynamicCache(config=model.config), contextlib.nullcontext(), prompt, steps,
                             lambda n: None)
    cache = ReplayCache(model, rs.ReplayConfig(window=WINDOW), batch_size=1, backend="triton")
    run = demo.decode_greedy(model, cache, cache.routing(), prompt, steps, lambda n: None)
    assert run.tokens == ref.tokens
    assert demo.logit_drift(run, ref).max() < LOGIT_TOL
    start = prompt.shape[1]

    def drafts(tokens, k):
        pos = len(tokens) - start
        guess = ref.tokens[pos:pos + k]
        return [t if (pos + i) % 3 else (t + 1) % model.config.vocab_size for i, t in enumerate(guess)]

    cache = ReplayCache(model, rs.ReplayConfig(window=WINDOW, max_draft_tokens=DRAFTS), batch_size=1, backend="triton")
    run = demo.decode_speculative(model, cache, prompt, steps, lambda n: None, draft=drafts)
    assert run.tokens == ref.tokens
    assert 0 < run.notes["accepted"] < run.notes["drafted"]


@pytest.mark.parametrize("name", MODELS)
def test_batch_of_two(name):
    """Two sequences in one pool (one slot each) decode like transformers' batched cache."""
    model = tiny_model(name)
    prompt = torch.randint(3, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(2))

    @torch.no_grad()
    def greedy(cache, routing):
        chosen, rows = [], []
        with routing:
            logits = model(prompt, past_key_values=cache, use_cache=True).logits[:, -1]
            for _ in range(2 * WINDOW + 1):
                chosen.append(logits.argmax(-1, keepdim=True))
                rows.append(logits)
                logits = model(chosen[-1], past_key_values=cache, use_cache=True).logits[:, -1]
        return torch.cat(chosen, 1), torch.stack(rows)

    ref_tokens, ref_logits = greedy(DynamicCache(config=model.config), contextlib.nullcontext())
    cache = ReplayCache(model, rs.ReplayConfig(window=WINDOW), batch_size=2, backend="reference")
    tokens, logits = greedy(cache, cache.routing())
    assert torch.equal(tokens, ref_tokens)
    assert ((logits - ref_logits).norm(dim=-1) / ref_logits.norm(dim=-1)).max() < LOGIT_TOL


def test_lookup_drafts():
    assert demo.lookup_drafts([5, 6, 7, 8, 5, 6], 2) == [7, 8]
    assert demo.lookup_drafts([1, 2, 3], 2) == []
    assert demo.lookup_drafts([1, 2, 1], 4) == [2, 1]


def test_errors():
    model = tiny_model("kimi_linear")
    with pytest.raises(ValueError, match="model: expected a model of type"):
        ReplayCache(torch.nn.Linear(2, 2), rs.ReplayConfig(), batch_size=1)
    cache = _replay(model)
    with pytest.raises(ValueError, match="max_draft_tokens=0"):
        cache.commit(1)
    cache = _replay(model, DRAFTS)
    with pytest.raises(ValueError, match="no forward"):
        cache.commit(1)
    with torch.no_grad(), cache.routing():
        model(torch.tensor([[5, 6, 7]]), past_key_values=cache, use_cache=True)
        model(torch.tensor([[8, 9]]), past_key_values=cache, use_cache=True)
    with pytest.raises(ValueError, match="num_accepted: expected an int in 1..2"):
        cache.commit(3)
    cache.commit(2)


def test_main_prints_table(tmp_path, capsys):
    demo.main(["--steps", "6", "--plot", str(tmp_path / "demo.png")])
    out = capsys.readouterr().out
    for name in MODELS:
        for mode in ("hf cache", "replay spec", "replay nvfp4"):
            assert any(line.startswith(f"{name:12} {mode}") for line in out.splitlines()), (name, mode)
    assert " NO " not in out
    assert (tmp_path / "demo.png").stat().st_size > 0


def test_batched_replay_matches_transformers_cache(setup):
    """Several prompts at once: every row's greedy tokens equal transformers' cache's."""
    model = setup[0]
    prompts = torch.randint(3, model.config.vocab_size, (3, 8), generator=torch.Generator().manual_seed(1))
    ref, _ = demo.decode_batch(model, DynamicCache(config=model.config), contextlib.nullcontext(), prompts, STEPS,
                               lambda n: None)
    cache = ReplayCache(model, rs.ReplayConfig(window=WINDOW), batch_size=3, backend="reference")
    tokens, _ = demo.decode_batch(model, cache, cache.routing(), prompts, STEPS, lambda n: None)
    assert tokens.shape == (3, STEPS)
    assert torch.equal(tokens, ref)
    assert len({tuple(r) for r in ref.tolist()}) == 3      # the rows really differ

