"""Flint as the decode attention of a Hugging Face transformers GptOss model.

GptOss has every feature Flint serves: attention sinks (one logit per query
head), sliding-window layers alternating with full ones, grouped-query
attention and rotary embeddings applied to K before it is cached. With this
module such a model (head_dim 128, 8 query heads per kv head, bf16) prefills
with transformers' own GptOss eager attention and then decodes every token
with ``torch.ops.flint.decode_attention`` on a paged KV pool
(``FlintPagedCache``: 16-token pages, one block table row and one seq_len per
request, requests of different lengths in one batch).

It plugs in through transformers' public interfaces: ``register()`` adds the
attention function under the name "flint" to ``AttentionInterface`` (and
transformers' eager masks under the same name to ``AttentionMaskInterface``,
for the prefill), and the cache travels to every attention call as the
``flint_cache`` keyword argument of the model's forward, which transformers
hands through to the attention function (its own continuous batching passes
its paged cache the same way, with ``use_cache=False`` so that the model makes
no cache of its own).

How one GptOss attention layer maps onto the op in a decode step:

- q: the layer's rotary-applied ``query_states[:, :, 0]``, ``[B, 8 * kvH, 128]``.
- K/V: the new token's rotary-applied key and its value are first written into
  row ``p % 16`` of block ``block_tables[b, p // 16]`` of that layer's pool,
  ``p = seq_lens[b] - 1`` (seq_lens count the current token).
- window: the layer's ``sliding_window`` (None on full-attention layers), as
  is. transformers' sliding mask lets query position i see key j iff
  ``i - W < j <= i``: the last W positions, the current one included, which is
  exactly Flint's ``[L - W, L)`` with ``L = i + 1``. (Its sliding cache keeps
  W - 1 past tokens for the same reason.)
- sinks: the layer's ``sinks`` parameter (passed as ``s_aux``), one logit per
  query head, as fp32.
- GQA: query head h reads kv head h // 8 in both (transformers' ``repeat_kv``
  order), so the heads go in unpermuted.
- scale: the layer's ``scaling`` (head_dim ** -0.5).

``python -m flint_attention.integrations.transformers --demo`` decodes a random
GptOss model with both backends and prints their tokens side by side with the
time of a decode step.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
import sys
import time
from collections.abc import Iterator, Sequence

import torch

from flint_attention.ops import GQA, HEAD_DIM, PAGE_TOKENS, flint_decode_attention

try:
    import transformers
    from transformers import AttentionInterface, AttentionMaskInterface, DynamicCache
    from transformers.masking_utils import eager_mask
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward as gpt_oss_eager_attention
except ImportError as exc:  # the optional extra is not installed
    raise ImportError(
        "flint_attention.integrations.transformers needs transformers: "
        "pip install 'flint-attention[transformers]'"
    ) from exc

ATTN_IMPLEMENTATION = "flint"


def register() -> str:
    """Registers Flint with transformers (idempotent) and returns the name to
    pass to ``model.set_attn_implementation``."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, flint_attention_forward)
    # The prefill runs GptOss's eager attention, so it needs eager's masks;
    # decode steps build none (decode_step passes None for them).
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, eager_mask)
    return ATTN_IMPLEMENTATION


class FlintPagedCache:
    """The paged K/V of a batch of requests, for every attention layer.

    ``kv[layer]`` is Flint's cache layout ``[num_blocks, kvH, 16, 256]`` (K in
    ``[..., :128]``, V in ``[..., 128:]``). All layers use the same block ids,
    so one block table row and one seq_len per request serve every layer.
    One cache serves one batch: ``start`` it with the prompts' lengths, then
    ``advance`` it before every decode step. The host decides which pages a
    request gets and keeps its own copy of the tables and lengths; the device
    tensors are updated in place, so that a captured CUDA graph reads the new
    values. Pages come from a free list in a scrambled order: nothing may
    assume that a request's pages are adjacent.

    Sliding-window layers keep every token here too; an engine could give
    their pages back once they fall out of the window, since Flint reads only
    the attended ones.
    """

    def __init__(self, config, batch_size: int, max_tokens: int, device: torch.device | str):
        kv_heads, heads, head_dim = config.num_key_value_heads, config.num_attention_heads, config.head_dim
        if head_dim != HEAD_DIM or heads != GQA * kv_heads:
            raise ValueError(
                f"Flint needs head_dim {HEAD_DIM} and {GQA} query heads per kv head; the model has "
                f"head_dim {head_dim}, {heads} query heads and {kv_heads} kv heads"
            )
        self.batch_size = batch_size
        self.max_blocks = -(-max_tokens // PAGE_TOKENS)
        num_blocks = batch_size * self.max_blocks
        self.kv = torch.empty(
            config.num_hidden_layers, num_blocks, kv_heads, PAGE_TOKENS, 2 * HEAD_DIM,
            dtype=torch.bfloat16, device=device,
        )
        self.block_tables = torch.zeros(batch_size, self.max_blocks, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(batch_size, dtype=torch.int32, device=device)
        self._tables = torch.zeros(batch_size, self.max_blocks, dtype=torch.int32)  # host copies
        self._lens = [0] * batch_size
        self._pages = [0] * batch_size
        self._free = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(0)).tolist()
        self._slots: tuple[torch.Tensor, ...] | None = None  # where this forward's new K/V go
        self._sinks: dict[int, torch.Tensor] = {}

    def _grow(self, request: int, length: int) -> None:
        """Host side: gives ``request`` pages for ``length`` tokens."""
        while self._pages[request] * PAGE_TOKENS < length:
            if self._pages[request] == self.max_blocks:
                raise ValueError(f"request {request} needs more than {self.max_blocks * PAGE_TOKENS} tokens")
            self._tables[request, self._pages[request]] = self._free.pop()
            self._pages[request] += 1
        self._lens[request] = length

    def _upload(self) -> None:
        self.block_tables.copy_(self._tables)
        self.seq_lens.copy_(torch.tensor(self._lens, dtype=torch.int32))

    def start(self, prompt_lens: Sequence[int]) -> None:
        """Takes the prompts' lengths before the prefill (into an empty cache)
        and says where each prompt token's K/V goes."""
        assert len(prompt_lens) == self.batch_size and min(prompt_lens) >= 1, prompt_lens
        for request, length in enumerate(prompt_lens):
            self._grow(request, length)
        self._upload()
        lens = torch.tensor(prompt_lens)
        request = torch.repeat_interleave(torch.arange(self.batch_size), lens)
        position = torch.cat([torch.arange(n) for n in prompt_lens])  # also the index in the forward
        block = self._tables[request, position // PAGE_TOKENS].long()
        device = self.seq_lens.device
        self._slots = tuple(x.to(device) for x in (request, position, block, position % PAGE_TOKENS))

    def advance(self) -> None:
        """Host side of a decode step, before it runs: one more token per
        request (a new page where one is full); seq_lens then include the
        token being decoded."""
        for request in range(self.batch_size):
            self._grow(request, self._lens[request] + 1)
        self._upload()

    def decode_slots(self) -> torch.Tensor:
        """Device side of a decode step: the position of each request's new
        token (seq_lens - 1), which is where its K/V go. Tensor ops only, so a
        CUDA graph captures them and follows the in-place updates."""
        position = self.seq_lens.long() - 1
        request = torch.arange(self.batch_size, device=position.device)
        block = self.block_tables[request, position // PAGE_TOKENS].long()
        self._slots = (request, torch.zeros_like(request), block, position % PAGE_TOKENS)
        return position

    def write(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> None:
        """Writes this forward's new K/V ``[B, kvH, T, 128]`` into their pages."""
        request, index, block, row = self._slots
        pages = self.kv[layer]
        pages[block, :, row, :HEAD_DIM] = key[request, :, index]
        pages[block, :, row, HEAD_DIM:] = value[request, :, index]

    def attend(self, layer: int, query: torch.Tensor, sinks: torch.Tensor, window: int | None,
               scale: float) -> torch.Tensor:
        """Flint over the pages for the single new token: ``[B, H, 1, 128]`` -> ``[B, H, 128]``."""
        if layer not in self._sinks:
            # Made once, so that no kernel writes the sinks right before the op (see the README's
            # programmatic dependent launch); the first call is eager, before any graph capture.
            self._sinks[layer] = sinks.detach().float().contiguous()
        q = query[:, :, 0]
        out = torch.empty_like(q)
        return flint_decode_attention(
            q, self.kv[layer], self.block_tables, self.seq_lens, self._sinks[layer], window, scale, out
        )


def flint_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    s_aux: torch.Tensor | None = None,
    flint_cache: FlintPagedCache | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The "flint" attention function. query ``[B, H, T, 128]``, key and value
    ``[B, kvH, T, 128]``: the T new tokens of each request, rotary applied.
    Returns the output as ``[B, T, H, 128]`` (and the weights, or None)."""
    if flint_cache is None:
        raise ValueError("attention 'flint' needs the model called with flint_cache=FlintPagedCache(...)")
    flint_cache.write(module.layer_idx, key, value)
    if query.shape[2] > 1:
        # Prefill into an empty cache: the prompt's own K/V are all there is to
        # attend to, with GptOss's eager attention and the causal/sliding mask.
        return gpt_oss_eager_attention(module, query, key, value, attention_mask, scaling=scaling,
                                       dropout=dropout, **kwargs)
    out = flint_cache.attend(module.layer_idx, query, s_aux, sliding_window, scaling)
    return out.unsqueeze(1), None


def prefill(model, cache: FlintPagedCache, prompts: Sequence[Sequence[int]]) -> torch.Tensor:
    """Runs the prompts as one right-padded batch, writing their K/V into the
    cache; returns each prompt's last-token logits ``[B, vocab]``.

    No padding mask is needed: under the causal mask a prompt's tokens never
    see the pads after them, the pads' own outputs are dropped and their K/V
    are not written.
    """
    lens = [len(p) for p in prompts]
    cache.start(lens)
    ids = torch.zeros(len(prompts), max(lens), dtype=torch.long)
    for request, prompt in enumerate(prompts):
        ids[request, : len(prompt)] = torch.tensor(prompt)
    device = cache.seq_lens.device
    positions = torch.arange(max(lens), device=device).expand(len(prompts), -1)
    logits = model(input_ids=ids.to(device), position_ids=positions, use_cache=False, flint_cache=cache).logits
    return logits[torch.arange(len(prompts), device=device), torch.tensor(lens, device=device) - 1]


def decode_step(model, cache: FlintPagedCache, input_ids: torch.Tensor) -> torch.Tensor:
    """One decode step of every request (after ``cache.advance()``): the
    tokens ``input_ids [B, 1]`` go in at position seq_lens - 1; returns the
    logits ``[B, vocab]``. Nothing here reads a value on the host, so
    ``torch.cuda.graph`` can capture it."""
    positions = cache.decode_slots()
    # Masks given as None for every layer type: the model builds none (Flint masks by seq_lens and
    # window, and building them would read tensors on the host).
    no_masks = dict.fromkeys(model.config.layer_types)
    logits = model(
        input_ids=input_ids, position_ids=positions[:, None], attention_mask=no_masks,
        use_cache=False, flint_cache=cache,
    ).logits
    return logits[:, -1]


class GraphedDecodeStep:
    """``decode_step`` captured once in a CUDA graph, replayed for every token.

    The first call runs the step eagerly (the op allocates its workspace then)
    and captures it; every call, the first included, then copies the tokens
    into the graph's input and replays it. Call ``cache.advance()`` before each
    call, as for ``decode_step``: the graph reads seq_lens and the block tables
    from the device, so it follows their in-place updates.
    """

    def __init__(self, model, cache: FlintPagedCache):
        self.model, self.cache = model, cache
        self.graph: torch.cuda.CUDAGraph | None = None

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.graph is None:
            self.input_ids = input_ids.clone()
            stream = torch.cuda.Stream()  # warm-up off the default stream, as torch.cuda.graph advises
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                decode_step(self.model, self.cache, self.input_ids)
            torch.cuda.current_stream().wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.logits = decode_step(self.model, self.cache, self.input_ids)
        self.input_ids.copy_(input_ids)
        self.graph.replay()
        return self.logits.clone()


@dataclasses.dataclass
class Generation:
    """Greedy decoding of a batch: ``tokens[b, i]`` is the argmax of
    ``logits[b, i]``; step 0 is the prefill, steps 1.. the decode steps."""

    tokens: torch.Tensor  # [B, steps + 1] int64
    logits: torch.Tensor  # [B, steps + 1, vocab] float32
    step_seconds: list[float]  # wall time of each decode step (all requests)


@contextlib.contextmanager
def attention_implementation(model, name: str) -> Iterator[None]:
    """Runs the block with the model's attention set to ``name``."""
    previous = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


def _timed(device: torch.device, call):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    result = call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return result, time.perf_counter() - start


@torch.inference_mode()
def flint_generate(model, prompts: Sequence[Sequence[int]], steps: int, *, cuda_graph: bool = False,
                   feed: torch.Tensor | None = None) -> Generation:
    """Greedy decoding of all prompts in one batch: prefill with transformers'
    attention, then ``steps`` decode steps with Flint (in a CUDA graph if
    ``cuda_graph``). ``feed`` ``[B, >= steps]``: tokens to feed at the decode
    steps instead of the model's own choices (to compare logits step by step
    with another backend's decoding)."""
    device = model.device
    if model.dtype != torch.bfloat16:
        raise ValueError(f"Flint needs a bf16 model, got {model.dtype}")
    if cuda_graph and device.type != "cuda":
        raise ValueError(f"cuda_graph needs the model on a CUDA device, it is on {device}")
    cache = FlintPagedCache(model.config, len(prompts), max(map(len, prompts)) + steps, device)
    forward = GraphedDecodeStep(model, cache) if cuda_graph else (lambda ids: decode_step(model, cache, ids))

    def step(tokens: torch.Tensor) -> torch.Tensor:
        cache.advance()
        return forward(tokens[:, None])

    with attention_implementation(model, register()):
        logits = [prefill(model, cache, prompts).float()]
        seconds = []
        for i in range(steps):
            tokens = logits[-1].argmax(-1) if feed is None else feed[:, i].to(device)
            step_logits, elapsed = _timed(device, lambda: step(tokens))
            logits.append(step_logits.float())
            seconds.append(elapsed)
    logits = torch.stack(logits, dim=1)
    return Generation(logits.argmax(-1), logits, seconds)


@torch.inference_mode()
def reference_generate(model, prompts: Sequence[Sequence[int]], steps: int, *,
                       feed: torch.Tensor | None = None, attention: str = "eager") -> Generation:
    """The same greedy decoding with transformers' own ``attention`` and its
    DynamicCache, one request at a time (so without padding).
    ``step_seconds`` adds up the requests' times of each step."""
    device = model.device
    per_request = []
    seconds = [0.0] * steps
    with attention_implementation(model, attention):
        for request, prompt in enumerate(prompts):
            cache = DynamicCache(config=model.config)
            ids = torch.tensor([prompt], device=device)
            logits = [model(input_ids=ids, past_key_values=cache, use_cache=True).logits[0, -1].float()]
            for i in range(steps):
                token = logits[-1].argmax() if feed is None else feed[request, i].to(device)
                out, elapsed = _timed(device, lambda: model(input_ids=token.view(1, 1), past_key_values=cache,
                                                            use_cache=True))
                logits.append(out.logits[0, -1].float())
                seconds[i] += elapsed
            per_request.append(torch.stack(logits))
    logits = torch.stack(per_request)
    return Generation(logits.argmax(-1), logits, seconds)


def random_gpt_oss(num_kv_heads: int, *, layers: int = 4, window: int = 128, hidden_size: int = 256,
                   vocab_size: int = 512, experts: int = 4, seed: int = 0, device: str | torch.device = "cpu"):
    """A small random-weight GptOss that Flint serves (head_dim 128, 8 query
    heads per kv head, sliding and full layers alternating, sinks), bf16 on
    ``device``. The weights depend only on ``seed``: they are drawn on the CPU.

    Three choices make it a sharp yardstick for attention backends: weights
    3x transformers' default scale, so that attention is peaked enough for a
    single position (the window's edge) to matter; sinks of unit scale (the
    initializer's 0.06 would hardly matter); and every token routed to every
    expert, since a near tie in a top-k choice of experts would turn rounding
    noise into a jump of the logits. The logits are computed in fp32 (from the
    bf16 hidden state): bf16 logits, quantized to 1/64 near 2, would tie at
    the top too often to compare greedy tokens.
    """
    config = transformers.GptOssConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=hidden_size, head_dim=HEAD_DIM,
        num_attention_heads=GQA * num_kv_heads, num_key_value_heads=num_kv_heads, num_hidden_layers=layers,
        layer_types=["sliding_attention", "full_attention"] * (layers // 2) + ["sliding_attention"] * (layers % 2),
        sliding_window=window, num_local_experts=experts, num_experts_per_tok=experts,
        initializer_range=0.06, max_position_embeddings=131072,
    )
    torch.manual_seed(seed)
    model = transformers.GptOssForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 1.0)
    # On CUDA the experts run as batched matmuls, which a CUDA graph can capture (eager's loop over
    # the experts hit reads them on the host); on the CPU as eager's loop, far cheaper for a prefill
    # (batched_mm copies each token's expert weights).
    model.set_experts_implementation("batched_mm" if torch.device(device).type == "cuda" else "eager")
    model = model.to(device=device, dtype=torch.bfloat16).eval()
    model.lm_head.float()
    model.lm_head.register_forward_pre_hook(lambda _, args: (args[0].float(),))
    return model


def _demo(args) -> int:
    device = torch.device("cuda" if torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
                          else "cpu")
    model = random_gpt_oss(args.kv_heads, device=device)
    gen = torch.Generator().manual_seed(args.seed)
    lens = args.prompt_lens
    prompts = [torch.randint(model.config.vocab_size, (n,), generator=gen).tolist() for n in lens]
    graph = device.type == "cuda"
    print(f"random GptOss: {model.config.num_hidden_layers} layers (sliding window "
          f"{model.config.sliding_window} / full alternating), {args.kv_heads} kv heads, "
          f"{GQA * args.kv_heads} query heads, head_dim {HEAD_DIM}, bf16, on {device}")
    print(f"{len(lens)} requests, prompt lengths {lens}; greedy: the first token from the prefill, "
          f"then {args.steps} decode steps")
    flint = flint_generate(model, prompts, args.steps, cuda_graph=graph)
    eager = reference_generate(model, prompts, args.steps)
    for request in range(len(prompts)):
        differ = (flint.tokens[request] != eager.tokens[request]).nonzero().flatten().tolist()
        if not differ:
            verdict = "same tokens"
        else:
            # Up to the first difference both decoded the same history, so their logits there compare.
            first = differ[0]
            top2 = eager.logits[request, first].topk(2).values
            moved = (flint.logits[request, first] - eager.logits[request, first]).abs().max()
            verdict = (f"tokens differ from step {first} on: there eager's top two logits are "
                       f"{float(top2[0] - top2[1]):.4f} apart, and Flint's logits within {float(moved):.4f} "
                       f"of eager's (a near tie if the first is not larger than twice the second)")
        print(f"request {request}, prompt of {lens[request]} tokens: {verdict}")
        print(f"  flint: {flint.tokens[request].tolist()}")
        print(f"  eager: {eager.tokens[request].tolist()}")
    flint_label = "Flint, batched, CUDA graph replay" if graph else "Flint, batched"
    # The first two decode steps include warm-up (and, with a graph, the capture).
    for label, result in ((flint_label, flint), ("transformers eager, one request after the other", eager)):
        median = statistics.median(result.step_seconds[2:] or result.step_seconds)
        print(f"decode step of all {len(lens)} requests ({label}): median {median * 1e3:.2f} ms")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flint_attention.integrations.transformers",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--demo", action="store_true", help="decode with Flint and with eager, side by side")
    parser.add_argument("--kv-heads", type=int, default=2, choices=[1, 2, 4, 8])
    parser.add_argument("--prompt-lens", type=int, nargs="+", default=[7, 60, 200])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not args.demo:
        parser.print_help()
        return 0
    return _demo(args)


if __name__ == "__main__":
    sys.exit(main())
