"""Real clients: transformers models generating with Flint's attention,
against the same models generating with transformers' own eager attention.

Three models, small and random (no weights downloaded): FlintForCausalLM
(32 query / 4 kv heads, head_dim 128, sinks, sliding and rotary-free full
layers, QK norms), GptOssForCausalLM as gpt-oss is (64 query / 8 kv heads,
head_dim 64, sinks, window 128 on alternate layers) and Qwen3ForCausalLM (no
sinks, 4 query heads per kv head). Both sides run ``model.generate`` on the
same left-padded batch of prompts of different lengths, greedily; the Flint
side with ``attn_implementation="flint"`` and a ``FlintPagedCache`` as
``past_key_values``. Same model object, same weights; only the attention
differs (the prefill is eager's on both sides: step 0 must match exactly).

How the two are compared (check_generation), per request:

- Tokens: Flint's greedy tokens must equal eager's, but at a near tie (eager's
  top-2 margin <= TIE_MARGIN), where rounding alone can swap the two; the
  comparison of that request stops there (the histories differ after it).
- Logits: at every step up to and including the first differing token,
  max |flint - eager| over the vocabulary <= LOGIT_BOUND.

The bound is what convention errors break: the tests give Flint a window off
by one, sinks of the wrong heads and the wrong GQA grouping, and require the
check to fail. reference_op (the op's semantics in plain torch) checks the
integration alone for the shapes of the other two models, and what each
model hands the op (its group, head_dim, sinks or None, window, scale) is
checked with the op replaced by a recorder.

Assisted (speculative) generation: the target generates with a draft model
(``generate(..., assistant_model=draft)``), so each step after the prefill
verifies the draft's tokens in one forward of several tokens per request, and
rejected draft tokens are taken back with ``past_key_values.crop``. Flint's
target must give what eager's gives under assisted generation and under plain
greedy generation (check_generation); a recorder of the op's calls and of the
crops shows that multi-token calls and rollbacks happened, and three errors
of the multi-token convention must fail the check.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import needs_hopper

pytest.importorskip("transformers", reason="needs the transformers extra: pip install -e '.[transformers]'")
from flint_attention.integrations import transformers as flint_tf  # noqa: E402

# Max |flint - eager| over the vocabulary, per request and step, for the
# logits of the random models below (std ~1), measured with the CPU path
# (FlintForCausalLM, 12 steps, prompt seeds 1-4) and with reference_op (all
# three): at most 0.09. The errors this test exists to catch move them far
# more by the second decode step: a window off by one by 0.78 or more, the
# sinks of the next kv group by 0.47, interleaved GQA groups by 3.9
# (FlintForCausalLM). FLINT_ERROR_LOG=path records what each run measures
# (a JSON line per comparison).
LOGIT_BOUND = 0.2
# Two logits that each move by no more than the noise can swap places only if
# they were about twice the noise apart or closer: a token flip is accepted
# there and nowhere else.
TIE_MARGIN = 0.2
STEPS = 12

# Per model: its builder's arguments and the prompts' lengths on the CPU
# (shorter than the window, crossing it during the decode, longer than it).
# The prompts' seed: one whose prompts meet no near tie in these steps on the
# CPU path (nor with reference_op), so that the tokens must be eager's exactly.
MODELS = {
    "flint": (flint_tf.random_flint, dict(window=32), [5, 30, 70], 2),
    "gpt_oss": (flint_tf.random_gpt_oss, dict(), [9, 124, 150], 0),
    "qwen3": (flint_tf.random_qwen3, dict(), [5, 30, 70], 3),
}
GPU_EXTRA_LEN = 2048


def make_prompts(lens, vocab_size: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab_size, (n,), generator=gen).tolist() for n in lens]


def eager_generate(model, ids, mask, steps=STEPS):
    with flint_tf.attention_implementation(model, "eager"), torch.inference_mode():
        return model.generate(ids, attention_mask=mask, max_new_tokens=steps, do_sample=False,
                              return_dict_in_generate=True, output_logits=True)


def flint_generate_by_hand(model, ids, mask, steps=STEPS):
    """As a transformers user writes it: the attention set to "flint", the
    cache passed as past_key_values."""
    cache = flint_tf.FlintPagedCache(model.config, ids.shape[0], ids.shape[1] + steps, model.device)
    with flint_tf.attention_implementation(model, flint_tf.register()), torch.inference_mode():
        return model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=steps,
                              do_sample=False, return_dict_in_generate=True, output_logits=True)


def check_generation(flint, eager, prompt_width: int) -> None:
    """Flint's generation against eager's (module docstring)."""
    tokens_f, tokens_e = flint.sequences[:, prompt_width:].cpu(), eager.sequences[:, prompt_width:].cpu()
    logits_f = torch.stack(flint.logits, 1).float().cpu()
    logits_e = torch.stack(eager.logits, 1).float().cpu()
    assert logits_f.shape == logits_e.shape and tokens_f.shape == tokens_e.shape
    top2 = logits_e.topk(2, dim=-1).values
    margin = top2[..., 0] - top2[..., 1]
    worst, flips = [], []
    for request in range(tokens_e.shape[0]):
        differ = (tokens_f[request] != tokens_e[request]).nonzero().flatten().tolist()
        last = differ[0] if differ else tokens_e.shape[1] - 1
        diff = (logits_f[request, : last + 1] - logits_e[request, : last + 1]).abs().amax(-1)
        worst.append(float(diff.max()))
        step = int(diff.argmax())
        assert diff.max() <= LOGIT_BOUND, (
            f"logits differ by up to {diff.max():.4f} > {LOGIT_BOUND} (request {request}, step {step})"
        )
        if differ:
            flips.append((request, last, float(margin[request, last])))
            assert margin[request, last] <= TIE_MARGIN, (
                f"request {request}: tokens differ from step {last} on, where eager's top-2 margin is "
                f"{float(margin[request, last]):.4f} > {TIE_MARGIN}"
            )
    log = os.environ.get("FLINT_ERROR_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps(dict(test=os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0],
                                    max_logit_diff=worst, flips=flips)) + "\n")


def build(kind: str, device: str = "cpu", extra_len: int | None = None):
    builder, kwargs, lens, seed = MODELS[kind]
    model = builder(device=device, **kwargs)
    prompts = make_prompts(lens + ([extra_len] if extra_len else []), model.config.vocab_size, seed)
    ids, mask = (x.to(device) for x in flint_tf.left_padded(prompts))
    return model, ids, mask


@pytest.fixture(scope="module", params=list(MODELS))
def cpu_reference(request):
    """A model, its batch, and eager's generation of it."""
    model, ids, mask = build(request.param)
    return request.param, model, ids, mask, eager_generate(model, ids, mask)


def test_cpu_generate_matches_eager(cpu_reference):
    kind, model, ids, mask, eager = cpu_reference
    flint = flint_generate_by_hand(model, ids, mask)
    assert torch.equal(flint.logits[0], eager.logits[0]), "the prefill is eager's"
    # Tokens equal eager's up to a near tie (check_generation): the prompts
    # have none under torch 2.11, but another torch's matmuls may move one.
    check_generation(flint, eager, ids.shape[1])


def test_flint_generate_matches_eager(cpu_reference):
    kind, model, ids, mask, eager = cpu_reference
    if kind != "flint":
        pytest.skip("the same path as test_cpu_generate_matches_eager: one model suffices")
    flint = flint_tf.flint_generate(model, ids, mask, max_new_tokens=STEPS, do_sample=False,
                                    return_dict_in_generate=True, output_logits=True)
    assert model.config._attn_implementation != "flint"  # set back
    check_generation(flint, eager, ids.shape[1])


def reference_op(q, kv_cache, block_tables, seq_lens, sinks, window, scale, out, **kwargs):
    """The op's semantics in plain torch (fp32), for any group, head_dim and
    number of query tokens: query token i of Q attends to the positions
    ``[end - window, end)``, ``end = seq_len - Q + i + 1``; head h reads kv head
    h // G; the sink is one more logit of weight ``exp(sinks[h])``."""
    one = q.dim() == 3
    queries = q[:, None] if one else q  # [B, Q, H, D]
    tokens, heads, head_dim = queries.shape[1:]
    group = heads // kv_cache.shape[1]
    result = torch.empty_like(queries)
    for b in range(queries.shape[0]):
        length = int(seq_lens[b])
        position = torch.arange(length, device=kv_cache.device)
        pages = kv_cache[block_tables[b, position // 16].long(), :, position % 16].float()  # [L, kvH, 2D]
        k = pages[..., :head_dim].repeat_interleave(group, 1)
        v = pages[..., head_dim:].repeat_interleave(group, 1)
        for i in range(tokens):
            end = length - tokens + i + 1
            start = 0 if window is None else max(end - window, 0)
            logits = torch.einsum("hd,lhd->hl", queries[b, i].float(), k[start:end]) * scale
            if sinks is not None:
                logits = torch.cat([logits, sinks[:, None].float()], 1)
            weights = logits.softmax(-1)[:, : end - start]
            result[b, i] = torch.einsum("hl,lhd->hd", weights, v[start:end]).to(result.dtype)
    return out.copy_(result[:, 0] if one else result)


@pytest.mark.parametrize("kind", ["gpt_oss", "qwen3"])
def test_cpu_generate_matches_eager_with_a_reference_op(kind, monkeypatch):
    """The integration alone, whatever shapes the op runs: the op replaced by
    its semantics in plain torch, for the models of other shapes than
    FlintForCausalLM's (head_dim 64; 4 query heads per kv head, no sinks)."""
    model, ids, mask = build(kind)
    eager = eager_generate(model, ids, mask, steps=6)
    monkeypatch.setattr(flint_tf, "flint_decode_attention", reference_op)
    flint = flint_generate_by_hand(model, ids, mask, steps=6)
    check_generation(flint, eager, ids.shape[1])


_REAL_ATTEND = flint_tf.FlintPagedCache.attend


def _other_groups_sinks(self, layer, query, sinks, window, scale):
    """Flint given each head's sink from the head G places on (the next kv group's)."""
    return _REAL_ATTEND(self, layer, query, sinks.roll(self.group), window, scale)


def _interleaved_groups(self, layer, query, sinks, window, scale):
    """Flint with query head h on kv head h % kvH instead of h // G (sinks
    kept with their heads): the heads regrouped before the op and back after."""
    kv_heads = query.shape[1] // self.group
    to_flint = lambda x: x.unflatten(1, (self.group, kv_heads)).transpose(1, 2).flatten(1, 2)  # noqa: E731
    out = _REAL_ATTEND(self, layer, to_flint(query), to_flint(sinks[None])[0], window, scale)  # [B, 1, H, D]
    return out.unflatten(2, (kv_heads, self.group)).transpose(2, 3).flatten(2, 3)


@pytest.fixture(scope="module")
def short_reference():
    model, ids, mask = build("flint")
    return model, ids, mask, eager_generate(model, ids, mask, steps=4)


@pytest.mark.parametrize("error", ["window+1", "window-1", "sinks-of-the-other-group", "gqa-interleaved"])
def test_check_catches_convention_errors(short_reference, error, monkeypatch):
    model, ids, mask, eager = short_reference
    if error.startswith("window"):
        window = model.config.sliding_window + (1 if error == "window+1" else -1)
        for layer in model.model.layers:
            if layer.self_attn.sliding_window is not None:  # Flint reads it; eager's mask does not
                monkeypatch.setattr(layer.self_attn, "sliding_window", window)
    else:
        wrong = _other_groups_sinks if error.startswith("sinks") else _interleaved_groups
        monkeypatch.setattr(flint_tf.FlintPagedCache, "attend", wrong)
    flint = flint_generate_by_hand(model, ids, mask, steps=4)
    with pytest.raises(AssertionError, match="logits differ"):
        check_generation(flint, eager, ids.shape[1])


@pytest.mark.parametrize("kind", list(MODELS))
def test_the_op_gets_the_models_shapes_and_sinks(kind, monkeypatch):
    """What each model hands the op, whatever shapes the op runs today: q
    [B, H, D] with the model's H and D, the pool [blocks, kvH, 16, 2D], fp32
    sinks or None for a model without them, the layer's window and scale."""
    model, ids, mask = build(kind)
    config = model.config
    calls = []

    def fake_op(q, kv_cache, block_tables, seq_lens, sinks, window, scale, out, **kwargs):
        calls.append((q.shape, kv_cache.shape, sinks if sinks is None else (sinks.dtype, sinks.shape), window,
                      scale, seq_lens.tolist()))
        return out.zero_()

    monkeypatch.setattr(flint_tf, "flint_decode_attention", fake_op)
    flint_generate_by_hand(model, ids, mask, steps=2)
    heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    assert len(calls) == config.num_hidden_layers  # one decode step, every layer
    lens = [int(n) + 1 for n in mask.sum(1)]
    windows = [getattr(layer.self_attn, "sliding_window", None) for layer in model.model.layers]
    sinks = None if kind == "qwen3" else (torch.float32, (heads,))
    for (q, pool, s, window, scale, seq_lens), expected_window in zip(calls, windows):
        assert q == (len(lens), heads, head_dim) and pool[1:] == (kv_heads, 16, 2 * head_dim)
        assert s == sinks and window == expected_window and scale == head_dim**-0.5 and seq_lens == lens


def test_pages_are_scattered_and_tables_follow_the_lengths():
    config = flint_tf.random_flint(layers=3).config
    cache = flint_tf.FlintPagedCache(config, batch_size=2, max_tokens=64, device="cpu")
    cache.start([17, 5], padded_len=17)
    for _ in range(16):
        cache.advance()
    assert cache.seq_lens.tolist() == [33, 21] and cache.get_seq_length() == 33
    pages = [cache.block_tables[0, :3].tolist(), cache.block_tables[1, :2].tolist()]
    ids = pages[0] + pages[1]
    assert len(set(ids)) == 5 and ids != sorted(ids), pages


def test_the_cache_refuses_another_attention():
    model, ids, mask = build("qwen3")
    cache = flint_tf.FlintPagedCache(model.config, ids.shape[0], ids.shape[1] + 2)
    with flint_tf.attention_implementation(model, "eager"), pytest.raises(ValueError, match="'flint'"):
        model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=2)


def test_flint_imports_without_transformers():
    code = (
        "import sys; sys.modules['transformers'] = None\n"  # any import of it fails
        "import flint_attention, flint_attention.integrations\n"
        "try:\n    import flint_attention.integrations.transformers\n"
        "except ImportError as e:\n    print('needs the extra' if \"pip install -e '.[transformers]'\" in str(e) else e)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "needs the extra", result.stdout + result.stderr


def test_demo_runs(capsys):
    assert flint_tf.main(["--demo", "--steps", "3", "--prompt-lens", "3", "20"]) == 0
    out = capsys.readouterr().out
    assert "flint:" in out and "eager:" in out and "generate with flint" in out, out


def test_decode_step_traces_as_one_graph():
    """What the CUDA-graph path needs, checked where there is no GPU: with the
    experts as they run on CUDA, the decode step traces into a single graph
    (no host read of a tensor, no branch on one), and the traced step gives
    the same logits."""
    model, ids, mask = build("flint")
    model.set_experts_implementation("batched_mm")
    with torch.inference_mode(), flint_tf.attention_implementation(model, flint_tf.register()):
        cache = flint_tf.FlintPagedCache(model.config, ids.shape[0], ids.shape[1] + 4)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache).logits
        tokens = logits[:, -1].argmax(-1)[:, None]
        cache.advance()
        eager = flint_tf.decode_step(model, cache, tokens)
        traced = torch.compile(flint_tf.decode_step, backend="eager", fullgraph=True)(model, cache, tokens)
    assert torch.equal(traced, eager)


@pytest.fixture
def exact_bf16_gemms():
    """cuBLAS bf16 GEMMs with fp32 reductions throughout, in both backends'
    shared layers (the default allows reduced-precision split-K reductions)."""
    saved = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    yield
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = saved


def skip_unserved_head_dim(model) -> None:
    """The CUDA kernels of this build serve head_dim 128 (groups 1-8): GptOss's
    head_dim 64 runs on the CPU path only, and raises on a GPU."""
    head_dim = getattr(model.config, "head_dim", None) or model.config.hidden_size // model.config.num_attention_heads
    if head_dim != 128:
        pytest.skip(f"the CUDA kernels of this build serve head_dim 128, not {head_dim}")


@needs_hopper
@pytest.mark.parametrize("kind", list(MODELS))
def test_gpu_generate_matches_eager(kind, exact_bf16_gemms):
    model, ids, mask = build(kind, "cuda", GPU_EXTRA_LEN)
    skip_unserved_head_dim(model)
    check_generation(flint_generate_by_hand(model, ids, mask), eager_generate(model, ids, mask), ids.shape[1])


@needs_hopper
@pytest.mark.parametrize("kind", list(MODELS))
def test_cuda_graph_generate_matches_eager(kind, exact_bf16_gemms, monkeypatch):
    """Every decode step is a replay of one captured graph."""
    model, ids, mask = build(kind, "cuda", GPU_EXTRA_LEN)
    skip_unserved_head_dim(model)
    eager = eager_generate(model, ids, mask)
    replays = []
    real_replay = torch.cuda.CUDAGraph.replay
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", lambda graph: (replays.append(graph), real_replay(graph))[1])
    flint = flint_tf.flint_generate(model, ids, mask, max_new_tokens=STEPS, cuda_graph=True,
                                    return_dict_in_generate=True, output_logits=True)
    assert len(replays) == STEPS - 1 and len(set(map(id, replays))) == 1, f"{len(replays)} replays"
    check_generation(flint, eager, ids.shape[1])


# Assisted generation. The draft proposes DRAFT_TOKENS tokens a round (fewer as
# max_new_tokens nears), so a step verifies up to 11 tokens per request: the
# op's calls of 8 and 3, and single calls of 1 to 8 tokens.
DRAFT_TOKENS = 10


def draft_for(model, draft_tokens: int = DRAFT_TOKENS):
    """A smaller draft of ``model``, as layer-skipping drafts are: a copy of it
    without its last layer (same embeddings, final norm and head), on
    transformers' eager attention with the cache ``generate`` gives it. It
    agrees with the target often enough that drafts are accepted in part and
    rejected in part. It always proposes ``draft_tokens`` tokens: no
    confidence cut-off (a random model is rarely confident, and would stop
    each draft after one token)."""
    draft = copy.deepcopy(model)
    layers = max(1, model.config.num_hidden_layers - 1)
    draft.model.layers = draft.model.layers[:layers]
    draft.config.num_hidden_layers = layers
    draft.config.layer_types = draft.config.layer_types[:layers]
    draft.set_attn_implementation("eager")
    draft.generation_config.num_assistant_tokens = draft_tokens
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    return draft


def assisted_generate(model, draft, ids, attention: str, steps: int = STEPS, max_tokens: int | None = None):
    """``model.generate(..., assistant_model=draft)`` greedily on one request
    (assisted generation takes one), the target's attention ``attention``;
    with "flint" a FlintPagedCache of ``max_tokens`` tokens, by default
    ``prompt + steps`` (no step writes past them). Returns the output and
    the cache (None for eager)."""
    cache = None
    kwargs = dict(max_new_tokens=steps, do_sample=False, assistant_model=draft, return_dict_in_generate=True,
                  output_logits=True)
    if attention == "flint":
        attention = flint_tf.register()
        max_tokens = max_tokens or ids.shape[1] + steps
        cache = kwargs["past_key_values"] = flint_tf.FlintPagedCache(model.config, 1, max_tokens, model.device)
    with flint_tf.attention_implementation(model, attention), torch.inference_mode():
        return model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs), cache


def record_steps(monkeypatch) -> list:
    """Records, in order, the op's calls on the first layer's pool (which
    starts the storage of every layer's) as ("op", Q, seq_len of request 0),
    and the cache's crops as ("crop", tokens removed)."""
    events = []
    real_op, real_crop = flint_tf.flint_decode_attention, flint_tf.FlintPagedCache.crop

    def op(q, kv_cache, block_tables, seq_lens, *args, **kwargs):
        if kv_cache.storage_offset() == 0:
            events.append(("op", q.shape[1] if q.dim() == 4 else 1, int(seq_lens[0])))
        return real_op(q, kv_cache, block_tables, seq_lens, *args, **kwargs)

    def crop(cache, tokens_to_remove):
        events.append(("crop", -tokens_to_remove))
        return real_crop(cache, tokens_to_remove)

    monkeypatch.setattr(flint_tf, "flint_decode_attention", op)
    monkeypatch.setattr(flint_tf.FlintPagedCache, "crop", crop)
    return events


def steps_and_rollbacks(events) -> tuple[list[list[tuple[int, int]]], list[int], list[int]]:
    """The op's calls grouped by forward (the forwards after the prefill, each
    after a crop), each a list of (Q, seq_len); the rollbacks (crops of r > 0
    tokens) that reached the op; and how many draft tokens each forward kept
    (of the T - 1 it verified). Asserts what the calls must be: a forward's
    calls cover its tokens in order, in calls of 8 but the last; after a crop
    of r tokens, the next forward writes from r positions before where the
    last one ended."""
    steps = []  # (tokens the crop before it removed, its calls)
    for event in events:
        if event[0] == "crop":
            steps.append((event[1], []))
        elif steps:  # the prefill calls no op: every call follows a crop
            steps[-1][1].append(event[1:])
    steps = [step for step in steps if step[1]]
    rollbacks, kept = [], []
    for (_, previous), (removed, calls) in zip(steps, steps[1:]):
        assert calls[0][1] - calls[0][0] == previous[-1][1] - removed, (previous, removed, calls)
        if removed:
            rollbacks.append(removed)
        kept.append(sum(q for q, _ in previous) - 1 - removed)
    for _, calls in steps:
        assert all(q == 8 for q, _ in calls[:-1]), calls
        assert all(end - q == start for (_, start), (q, end) in zip(calls, calls[1:])), calls
    return [calls for _, calls in steps], rollbacks, kept


def check_assisted(model, prompts, monkeypatch) -> None:
    """Flint's assisted generation against eager's (assisted and plain), one
    request at a time, and the evidence that it verified several tokens per
    call and rolled the cache back."""
    draft = draft_for(model)
    tokens_per_call, chunked, rollbacks, kept = set(), 0, [], []
    for prompt in prompts:
        ids = torch.tensor([prompt], device=model.device)
        eager_assisted, _ = assisted_generate(model, draft, ids, "eager")
        eager = eager_generate(model, ids, torch.ones_like(ids))
        events = record_steps(monkeypatch)
        flint, cache = assisted_generate(model, draft, ids, "flint")
        monkeypatch.undo()
        assert torch.equal(flint.logits[0], eager_assisted.logits[0]), "the prefill is eager's"
        check_generation(flint, eager_assisted, ids.shape[1])
        check_generation(flint, eager, ids.shape[1])
        # The cache holds every token but the last (the target's own, not fed back yet).
        assert cache.get_seq_length() == int(cache.seq_lens[0]) == flint.sequences.shape[1] - 1
        calls, removed, accepted = steps_and_rollbacks(events)
        tokens_per_call |= {q for step in calls for q, _ in step}
        chunked += sum(len(step) > 1 for step in calls)
        rollbacks += removed
        kept += accepted
    # Calls of 8 tokens and of 2 to 7, forwards of more than 8 tokens split
    # into calls, rejected draft tokens taken back, and accepted ones kept
    # (their K/V, written by a multi-token call, read by the later steps).
    assert 8 in tokens_per_call and tokens_per_call & set(range(2, 8)), sorted(tokens_per_call)
    assert chunked and rollbacks and any(kept), (chunked, rollbacks, kept)


@pytest.mark.parametrize("kind", list(MODELS))
def test_assisted_generate_matches_eager(kind, monkeypatch):
    """Assisted generation with a smaller draft on transformers' eager
    attention: the target through the op gives eager's tokens, up to near
    ties, and logits within the bound, at every step."""
    builder, kwargs, lens, seed = MODELS[kind]
    model = builder(**kwargs)
    prompts = make_prompts(lens, model.config.vocab_size, seed)
    check_assisted(model, prompts, monkeypatch)
    if kind == "flint":  # flint_generate passes the draft on to generate
        ids = torch.tensor([prompts[0]])
        by_hand, _ = assisted_generate(model, draft_for(model), ids, "flint")
        sequences = flint_tf.flint_generate(model, ids, max_new_tokens=STEPS, do_sample=False,
                                            assistant_model=draft_for(model))
        assert torch.equal(sequences, by_hand.sequences)


@needs_hopper
@pytest.mark.parametrize("kind", list(MODELS))
def test_gpu_assisted_generate_matches_eager(kind, exact_bf16_gemms, monkeypatch):
    """The same on the GPU's kernels, with a prompt of GPU_EXTRA_LEN too."""
    builder, kwargs, lens, seed = MODELS[kind]
    model = builder(device="cuda", **kwargs)
    skip_unserved_head_dim(model)
    check_assisted(model, make_prompts(lens + [GPU_EXTRA_LEN], model.config.vocab_size, seed), monkeypatch)



# The host loop of cuda_graph=True (greedy_decode) with a draft: 19 new tokens,
# not a multiple of the 8 a full round verifies (7 draft tokens and the last),
# so the last rounds verify fewer.
LOOP_STEPS = 19


def decode_with_spies(model, draft, ids, monkeypatch, steps=LOOP_STEPS):
    """``greedy_decode`` with the eager ``decode_step`` as its step (what the
    graphs replay), on a FlintPagedCache; returns the output as generate's
    and the rounds, each [T, tokens the crop after it removed]."""
    cache = flint_tf.FlintPagedCache(model.config, ids.shape[0], ids.shape[1] + steps, model.device)
    rounds = []
    real_crop = cache.crop
    monkeypatch.setattr(cache, "crop", lambda n: (rounds[-1].append(-n), real_crop(n))[1])

    def step(tokens):
        rounds.append([tokens.shape[1]])
        return flint_tf.decode_step(model, cache, tokens)

    with flint_tf.attention_implementation(model, flint_tf.register()), torch.inference_mode():
        sequences, logits = flint_tf.greedy_decode(model, cache, ids, None, steps, step, draft)
    # The cache holds every token but the last (the next round's first).
    assert cache.get_seq_length() == int(cache.seq_lens[0]) == sequences.shape[1] - 1
    return flint_tf.GenerateDecoderOnlyOutput(sequences=sequences, logits=logits), rounds


@pytest.mark.parametrize("drafted", [True, False], ids=["draft", "no-draft"])
def test_greedy_decode_gives_plain_greedy_tokens(drafted, monkeypatch):
    """The loop that cuda_graph=True replays its graphs in, on the CPU with
    eager steps: with a draft (one verify step per round, T up to 8, the
    rejected tokens cropped) and without (T = 1), the tokens are plain greedy
    generate's up to near ties, and the logits within the bound; with the draft,
    draft tokens were both accepted and rejected."""
    builder, kwargs, lens, seed = MODELS["flint"]
    model = builder(**kwargs)
    draft = draft_for(model) if drafted else None  # proposes 10 a round: the loop takes 7
    all_rounds = []
    for prompt in make_prompts(lens, model.config.vocab_size, seed):
        ids = torch.tensor([prompt])
        eager = eager_generate(model, ids, torch.ones_like(ids), steps=LOOP_STEPS)
        flint, rounds = decode_with_spies(model, draft, ids, monkeypatch)
        check_generation(flint, eager, ids.shape[1])  # eager's tokens, up to a near tie
        # Every round emits its accepted draft tokens and one of the target's: 1 + those make the steps.
        assert 1 + sum(tokens - removed for tokens, removed in rounds) == LOOP_STEPS, rounds
        all_rounds += rounds
    tokens_per_step = {tokens for tokens, _ in all_rounds}
    if not drafted:
        assert tokens_per_step == {1} and not any(removed for _, removed in all_rounds)
        return
    accepted = [tokens - 1 - removed for tokens, removed in all_rounds]
    assert max(tokens_per_step) == flint_tf.MAX_QUERY_TOKENS and len(tokens_per_step) > 1, all_rounds
    assert any(accepted) and any(removed for _, removed in all_rounds), all_rounds


def test_cuda_graph_with_a_draft_takes_one_request():
    """As assisted generate does (and greedily), whatever the device."""
    model, ids, mask = build("flint")
    draft = draft_for(model)
    with pytest.raises(ValueError, match="one request"):
        flint_tf.flint_generate(model, ids[:2], mask[:2], max_new_tokens=4, cuda_graph=True, assistant_model=draft)
    with pytest.raises(ValueError, match="greedily"):
        flint_tf.flint_generate(model, ids[:1], mask[:1], max_new_tokens=4, cuda_graph=True, assistant_model=draft,
                                do_sample=True)


@needs_hopper
@pytest.mark.parametrize("kind", list(MODELS))
def test_cuda_graph_assisted_generate_matches_eager(kind, exact_bf16_gemms, monkeypatch):
    """cuda_graph=True with a draft: the target's verify steps replay one
    graph per token count T, and the tokens are eager's plain greedy ones."""
    builder, kwargs, lens, seed = MODELS[kind]
    model = builder(device="cuda", **kwargs)
    skip_unserved_head_dim(model)
    draft = draft_for(model)
    real_call = flint_tf.GraphedDecodeStep.__call__
    for prompt in make_prompts(lens + [GPU_EXTRA_LEN], model.config.vocab_size, seed):
        ids = torch.tensor([prompt], device="cuda")
        calls = []  # (graph, T) per step
        monkeypatch.setattr(flint_tf.GraphedDecodeStep, "__call__",
                            lambda graph, tokens: (calls.append((graph, tokens.shape[1])), real_call(graph, tokens))[1])
        flint = flint_tf.flint_generate(model, ids, max_new_tokens=LOOP_STEPS, cuda_graph=True, assistant_model=draft,
                                        return_dict_in_generate=True, output_logits=True)
        monkeypatch.undo()
        check_generation(flint, eager_generate(model, ids, torch.ones_like(ids), steps=LOOP_STEPS), ids.shape[1])
        graphs, tokens = {graph for graph, _ in calls}, {t for _, t in calls}
        assert len(set(calls)) == len(graphs) == len(tokens) > 1, [t for _, t in calls]  # one graph per T
        assert max(tokens) <= flint_tf.MAX_QUERY_TOKENS


_REAL_OP = flint_tf.flint_decode_attention


def _draft_sees_ahead(q, kv_cache, block_tables, seq_lens, sinks, window, scale, out, **kwargs):
    """Every token of a multi-token call at the last position: the draft's
    tokens attend to the ones after them."""
    if q.dim() == 3:
        return _REAL_OP(q, kv_cache, block_tables, seq_lens, sinks, window, scale, out)
    for i in range(q.shape[1]):
        _REAL_OP(q[:, i], kv_cache, block_tables, seq_lens, sinks, window, scale, out[:, i])
    return out


def _window_from_the_last_token(q, kv_cache, block_tables, seq_lens, sinks, window, scale, out, **kwargs):
    """Each token of a multi-token call causal, but its window starting where
    the last token's does (window counted from the last token)."""
    if q.dim() == 3 or window is None:
        return _REAL_OP(q, kv_cache, block_tables, seq_lens, sinks, window, scale, out)
    tokens = q.shape[1]
    for i in range(tokens):
        before = tokens - 1 - i  # tokens after this one
        _REAL_OP(q[:, i], kv_cache, block_tables, seq_lens - before, sinks, max(1, window - before), scale,
                 out[:, i])
    return out


def _no_rollback(cache, tokens_to_remove):
    """transformers told of the crop (its length), the op's lengths left as they were."""
    cache._seen += tokens_to_remove


@pytest.fixture(scope="module")
def assisted_reference():
    """The FlintForCausalLM, its draft, a prompt longer than its window, and
    eager's assisted generation of it."""
    builder, kwargs, lens, seed = MODELS["flint"]
    model = builder(**kwargs)
    draft = draft_for(model)
    ids = torch.tensor([make_prompts(lens, model.config.vocab_size, seed)[-1]])
    assert ids.shape[1] > model.config.sliding_window
    return model, draft, ids, assisted_generate(model, draft, ids, "eager")[0]


@pytest.mark.parametrize("error", ["draft-sees-ahead", "window-from-the-last-token", "no-rollback"])
def test_assisted_check_catches_multi_token_errors(assisted_reference, error, monkeypatch):
    model, draft, ids, eager = assisted_reference
    if error == "no-rollback":
        monkeypatch.setattr(flint_tf.FlintPagedCache, "crop", _no_rollback)
    else:
        wrong = _draft_sees_ahead if error == "draft-sees-ahead" else _window_from_the_last_token
        monkeypatch.setattr(flint_tf, "flint_decode_attention", wrong)
    # Without rollbacks the lengths grow by the rejected tokens too.
    flint, _ = assisted_generate(model, draft, ids, "flint", max_tokens=ids.shape[1] + STEPS * (DRAFT_TOKENS + 1))
    with pytest.raises(AssertionError, match="logits differ"):
        check_generation(flint, eager, ids.shape[1])


def test_crop_lowers_the_lengths_and_keeps_the_pages():
    config = flint_tf.random_flint(layers=3).config
    cache = flint_tf.FlintPagedCache(config, batch_size=2, max_tokens=64, device="cpu")
    cache.start([17, 5], padded_len=17)
    cache.advance(8)
    tables, free = cache.block_tables.clone(), len(cache._free)
    cache.crop(0)
    assert cache.seq_lens.tolist() == [25, 13] and cache.get_seq_length() == 25
    cache.crop(-6)
    assert cache.seq_lens.tolist() == [19, 7] and cache.get_seq_length() == 19
    cache.advance(6)  # the dropped positions again, on the pages the requests kept
    assert cache.seq_lens.tolist() == [25, 13] and len(cache._free) == free
    assert torch.equal(cache.block_tables, tables)
    with pytest.raises(ValueError, match="minus the number of tokens"):
        cache.crop(3)
    with pytest.raises(ValueError, match="holds 13 tokens"):
        cache.crop(-14)
