"""Flint as the decode attention of Hugging Face transformers models.

``register()`` adds the attention function "flint" to transformers'
``AttentionInterface`` (and a mask function under the same name to
``AttentionMaskInterface``). A model set to it generates with a
``FlintPagedCache`` as its ``past_key_values``: the cache keeps every layer's
K/V in Flint's paged pool (16-token pages, one block table row and one
seq_len per request, pages scattered over the pool), the prompt is prefilled
with the model's own eager attention, and every later step runs
``torch.ops.flint.decode_attention`` on the pool::

    flint_attention.integrations.transformers.register()
    model.set_attn_implementation("flint")  # or attn_implementation="flint" when loading it
    cache = FlintPagedCache(model.config, batch_size, max_tokens, device)
    out = model.generate(input_ids, attention_mask=mask, past_key_values=cache, max_new_tokens=n)

or, the same in one call, ``flint_generate(model, input_ids, attention_mask=mask,
max_new_tokens=n)`` (``cuda_graph=True``: every decode step is a replay of
one captured CUDA graph; with a draft, one graph per verify step's token
count). Served: any bf16 model whose attention goes through
``AttentionInterface`` with GQA: FlintForCausalLM, GptOssForCausalLM,
Qwen3ForCausalLM, LlamaForCausalLM and the like.

How transformers hands the cache to the attention: a model's attention layer
calls ``past_key_values.update(key, value, layer_idx)`` and then the "flint"
function. ``update`` returns the new K/V unchanged and marks the cache as the
one that layer is running on; the "flint" function takes it from there (the
model does not pass the cache itself to attention functions), writes the new
K/V into the pool and attends. (So one forward at a time per process.)

How an attention layer maps onto the op (query ``[B, H, T, D]``, key/value
``[B, kvH, T, D]``, the layer's T new tokens, rotary applied where the layer
applies it; Flint's full-attention layers apply none):

- q: ``query`` as ``[B, H, D]`` (T = 1) or ``[B, T, H, D]`` (T new tokens per
  request, e.g. a draft being verified), token i at position ``seq_len - T + i``;
  past 8 tokens (the op's most), one call per 8 tokens, each with the lengths
  cut after its last token.
- K/V write: token p of request b (0-based, pads not counted) goes to row
  ``p % 16`` of block ``block_tables[b, p // 16]`` of the layer's pool
  ``[num_blocks, kvH, 16, 2 * D]``, K in the first half of the last dim, V in
  the second. seq_lens count every token written, the current ones included.
  Left padding (``generate``'s) is dropped: a request's tokens start at p = 0,
  as its position ids do.
- window: the layer's ``sliding_window`` (None on full-attention layers, and
  on models without one) as is: transformers' sliding mask lets query i see
  key j iff ``i - W < j <= i``, the last W positions with the current one,
  which is Flint's ``[L - W, L)`` for ``L = i + 1``.
- sinks: the layer's ``s_aux`` (its ``sinks`` parameter) as fp32, one logit
  per query head; None for models without sinks (they pass no ``s_aux``).
- GQA: query head h reads kv head ``h // G``, ``G = H // kvH``, in both
  (transformers' ``repeat_kv`` order): the heads go in unpermuted. G and D are
  the model's (``num_attention_heads // num_key_value_heads``, ``head_dim``).
- scale: the layer's ``scaling``.

The prefill (the first forward, into an empty cache) runs the model's own
``eager_attention_forward`` on the prompt with transformers' mask (the "flint"
mask function is eager's there, and None afterwards: Flint masks by seq_lens
and window), so its logits are eager's exactly.

Speculative (assisted) decoding: ``model.generate(..., assistant_model=draft)``
with a FlintPagedCache verifies the draft's k tokens in one forward of T = k + 1
tokens (the target's last token, not cached yet, and the draft's), then calls
``past_key_values.crop(-r)`` to drop the r rejected ones (``crop(0)`` when all
were accepted): ``crop`` lowers every request's length by r, the pages stay
with the request, and the next step overwrites those positions. The draft runs
with its own attention and cache (transformers gives the assistant a cache of
its own). ``flint_generate(..., cuda_graph=True, assistant_model=draft)`` does
the same for one request in its own host loop (``greedy_decode``), where each
verify step replays a CUDA graph captured for its T: one graph per T, 1 to 8
(the op's most), so at most 8 graphs. The draft proposes up to 7 tokens a round
(its ``num_assistant_tokens``, capped), with its own ``generate``.

``python -m flint_attention.integrations.transformers --demo`` generates with
a small random FlintForCausalLM through both attentions and prints the tokens.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator, Sequence

import torch

from flint_attention.ops import MAX_QUERY_TOKENS, flint_decode_attention

try:
    import transformers
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.cache_utils import Cache, CacheLayerMixin
    from transformers.generation.utils import GenerateDecoderOnlyOutput
    from transformers.masking_utils import eager_mask
except ImportError as exc:  # the optional extra is not installed
    raise ImportError(
        "flint_attention.integrations.transformers needs transformers 5.23: "
        "pip install -e '.[transformers]' in the clone"
    ) from exc

ATTN_IMPLEMENTATION = "flint"
PAGE_TOKENS = 16  # rows of a page: kv_cache is [num_blocks, kvH, 16, 2 * D]

# The cache whose update() ran last, and for which layer: the model calls
# past_key_values.update() right before the attention function, which takes
# the cache from here.
_current: list = [None, -1]


def register() -> str:
    """Registers Flint with transformers (idempotent) and returns the name to
    pass to ``model.set_attn_implementation`` / ``attn_implementation=``."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, flint_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, flint_mask)
    return ATTN_IMPLEMENTATION


def flint_mask(*args, q_offset=0, **kwargs):
    """The "flint" mask function: eager's for the prefill (no cached tokens
    before the query), none afterwards (Flint masks by seq_lens and window)."""
    if not isinstance(q_offset, torch.Tensor) and q_offset > 0:
        return None
    return eager_mask(*args, q_offset=q_offset, **kwargs)


def _text_config(config):
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


class _FlintLayer(CacheLayerMixin):
    """One layer's view of a FlintPagedCache (what transformers' Cache API
    asks of a layer); the pool and the lengths are the cache's."""

    is_compileable = False
    is_croppable = True  # FlintPagedCache.crop lowers the lengths of every layer at once

    def __init__(self, cache: FlintPagedCache, batch_size: int, sliding: bool):
        super().__init__()
        self.cache, self.batch_size, self.is_sliding = cache, batch_size, sliding
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        return key_states, value_states

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.cache.get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        return self.cache.get_seq_length()

    def get_max_length(self) -> int:
        return self.cache.max_blocks * PAGE_TOKENS

    def reset(self) -> None:
        pass


class FlintPagedCache(Cache):
    """The paged K/V of a batch of requests, for every attention layer: a
    transformers ``Cache`` to pass as ``past_key_values`` to ``generate`` or
    to the model's forward, with the attention set to "flint".

    ``kv[layer]`` is Flint's cache layout ``[num_blocks, kvH, 16, 2 * D]``.
    All layers use the same block ids, so one block table row and one seq_len
    per request serve every layer. One cache serves one batch, from its
    prefill on. The host decides which pages a request gets and keeps its own
    copy of the tables and lengths; the device tensors are updated in place
    (a captured CUDA graph reads the new values). Pages come from a free list
    in a scrambled order: nothing may assume that a request's pages are
    adjacent.

    Steps: inside ``generate`` (or a plain forward) each forward after the
    prefill takes its T new tokens per request by itself. A host loop that
    replays a CUDA graph calls ``advance(T)`` before each step and runs it
    with ``decode_step`` / ``GraphedDecodeStep`` instead. ``crop(-r)`` takes
    the last r tokens of every request back (rejected draft tokens).

    Sliding-window layers keep every token here too; an engine could give
    their pages back once they fall out of the window, since Flint reads only
    the attended ones.
    """

    def __init__(self, config, batch_size: int, max_tokens: int, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.bfloat16):
        config = _text_config(config)
        kv_heads, heads = config.num_key_value_heads, config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        if heads % kv_heads:
            raise ValueError(f"{heads} query heads do not group over {kv_heads} kv heads")
        self.config, self._batch, self.head_dim = config, batch_size, head_dim
        self.group = heads // kv_heads
        self.max_blocks = -(-max_tokens // PAGE_TOKENS)
        num_blocks = batch_size * self.max_blocks
        layer_types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
        super().__init__(layers=[_FlintLayer(self, batch_size, kind == "sliding_attention") for kind in layer_types])
        self.kv = torch.empty(config.num_hidden_layers, num_blocks, kv_heads, PAGE_TOKENS, 2 * head_dim,
                              dtype=dtype, device=device)
        self.block_tables = torch.zeros(batch_size, self.max_blocks, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(batch_size, dtype=torch.int32, device=device)
        self._tables = torch.zeros(batch_size, self.max_blocks, dtype=torch.int32)  # host copies
        self._lens = [0] * batch_size
        self._pages = [0] * batch_size
        self._free = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(0)).tolist()
        self._seen = 0  # tokens per row that the model has been given, left pads included
        self._host_steps = False  # whether the host calls advance() before each step
        self._prefill = False  # whether the running forward is the prefill
        self._slots: tuple[torch.Tensor, ...] | None = None  # where this forward's new K/V go
        self._cut_lens: list[torch.Tensor] = []  # a step of T > 8 tokens: its calls' seq_lens but the last's
        self._sinks: dict[int, torch.Tensor] = {}

    # transformers' Cache API
    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        """Called by the model's attention layer right before the attention
        function: the K/V are written there (this returns them unchanged)."""
        if self.config._attn_implementation != ATTN_IMPLEMENTATION:
            raise ValueError(
                f"FlintPagedCache needs the model's attention set to {ATTN_IMPLEMENTATION!r} "
                f"(flint_attention.integrations.transformers.register()), not "
                f"{self.config._attn_implementation!r}"
            )
        _current[0], _current[1] = self, layer_idx
        return key_states, value_states

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._seen

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self._seen + query_length, 0

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return self.max_blocks * PAGE_TOKENS

    @property
    def is_compileable(self) -> bool:
        return False

    def crop(self, tokens_to_remove: int) -> None:
        """Drops the last ``-tokens_to_remove`` tokens of every request, as
        transformers 5.23's ``Cache.crop`` takes it (a count <= 0; assisted
        decoding calls ``crop(-r)`` after each verification, r the rejected
        draft tokens, 0 included). The lengths go down, the requests keep
        their pages, and the next step overwrites the positions past the new
        lengths: the op never reads them before."""
        if tokens_to_remove > 0:
            raise ValueError(
                f"crop({tokens_to_remove}): pass minus the number of tokens to remove, as transformers' "
                "Cache.crop takes it (a positive length is not supported)"
            )
        count = -tokens_to_remove
        if count == 0:
            return
        if count > min(self._lens):
            raise ValueError(f"crop({tokens_to_remove}): a request of this cache holds {min(self._lens)} tokens")
        self._lens = [length - count for length in self._lens]
        self._seen -= count
        self._upload()

    # Host side
    def _grow(self, request: int, length: int) -> None:
        """Gives ``request`` pages for ``length`` tokens."""
        while self._pages[request] * PAGE_TOKENS < length:
            if self._pages[request] == self.max_blocks:
                raise ValueError(f"request {request} needs more than {self.max_blocks * PAGE_TOKENS} tokens")
            self._tables[request, self._pages[request]] = self._free.pop()
            self._pages[request] += 1
        self._lens[request] = length

    def _upload(self) -> None:
        self.block_tables.copy_(self._tables)
        self.seq_lens.copy_(torch.tensor(self._lens, dtype=torch.int32))

    def start(self, prompt_lens: Sequence[int], padded_len: int | None = None) -> None:
        """The prefill's host side (into an empty cache): request b's prompt
        is the last ``prompt_lens[b]`` of the ``padded_len`` columns of the
        forward (left padding; the pads are not cached)."""
        padded_len = max(prompt_lens) if padded_len is None else padded_len
        if self._seen:
            raise ValueError("FlintPagedCache serves one batch: this one has been prefilled already")
        if len(prompt_lens) != self._batch or not 1 <= min(prompt_lens) <= max(prompt_lens) <= padded_len:
            raise ValueError(f"prompt lengths {list(prompt_lens)} for a batch of {self._batch} "
                             f"in {padded_len} columns")
        for request, length in enumerate(prompt_lens):
            self._grow(request, length)
        self._upload()
        lens = torch.tensor(prompt_lens)
        request = torch.repeat_interleave(torch.arange(self._batch), lens)
        position = torch.cat([torch.arange(n) for n in prompt_lens])
        column = position + (padded_len - lens)[request]
        block = self._tables[request, position // PAGE_TOKENS].long()
        device = self.seq_lens.device
        self._slots = tuple(x.to(device) for x in (request, column, block, position % PAGE_TOKENS))
        self._seen = padded_len

    def advance(self, tokens: int = 1) -> None:
        """A step's host side, before it runs: ``tokens`` more per request (new
        pages where needed); seq_lens then include them."""
        for request in range(self._batch):
            self._grow(request, self._lens[request] + tokens)
        self._upload()
        self._seen += tokens

    # Device side
    def _step_slots(self, tokens: int) -> torch.Tensor:
        """Where this step's ``tokens`` new K/V per request go: positions
        ``seq_lens - tokens ...`` (tensor ops only, so a CUDA graph captures
        them and follows the in-place updates). Returns the positions [B, T].
        Past 8 tokens, also the seq_lens of ``attend``'s calls but the last:
        made here, before any layer writes its K/V, so that the kernel right
        before the op never writes the lengths it reads (programmatic
        dependent launch, docs/semantics.md)."""
        position = self.seq_lens.long()[:, None] - tokens + torch.arange(tokens, device=self.seq_lens.device)
        block = self.block_tables.gather(1, position // PAGE_TOKENS).long()
        self._slots = (None, None, block, position % PAGE_TOKENS)
        self._cut_lens = [self.seq_lens - (tokens - end) for end in range(MAX_QUERY_TOKENS, tokens, MAX_QUERY_TOKENS)]
        return position

    def _begin(self, tokens: int, position_ids: torch.Tensor | None) -> None:
        """Called at a forward's first layer: the prefill takes the prompts'
        lengths from the position ids (generate's count the tokens of each
        request, pads aside), a later step its T new tokens."""
        self._prefill = self._seen == 0
        if self._prefill:
            if position_ids is None:
                lens = [tokens] * self._batch
            else:
                lens = (position_ids.reshape(-1, position_ids.shape[-1])[:, -1] + 1).expand(self._batch)
                lens = lens.tolist()
            self.start(lens, tokens)
        else:
            if not self._host_steps:
                self.advance(tokens)
            self._step_slots(tokens)

    def write(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> None:
        """Writes this forward's new K/V ``[B, kvH, T, D]`` into their pages."""
        request, column, block, row = self._slots
        pages, d = self.kv[layer], self.head_dim
        if request is None:  # a step: every token of every request, [B, T] slots
            pages[block, :, row, :d] = key.transpose(1, 2).to(pages.dtype)
            pages[block, :, row, d:] = value.transpose(1, 2).to(pages.dtype)
        else:  # the prefill: the prompt tokens, pads left out
            pages[block, :, row, :d] = key[request, :, column].to(pages.dtype)
            pages[block, :, row, d:] = value[request, :, column].to(pages.dtype)

    def keep_sinks(self, layer: int, sinks: torch.Tensor) -> torch.Tensor:
        """The layer's sinks as the op takes them (fp32, contiguous), made
        once, in the prefill: so that no kernel writes them right before the
        op (see the README's programmatic dependent launch), and none at all
        in a captured decode step."""
        if layer not in self._sinks:
            self._sinks[layer] = sinks.detach().float().contiguous()
        return self._sinks[layer]

    def attend(self, layer: int, query: torch.Tensor, sinks: torch.Tensor | None, window: int | None,
               scale: float) -> torch.Tensor:
        """Flint over the pages for this step's T tokens: ``[B, H, T, D]`` ->
        ``[B, T, H, D]``; ``sinks`` fp32 ``[H]`` (``keep_sinks``) or None.
        The op takes up to 8 tokens a call: more go in calls of 8 (the last
        one shorter), in order, each with seq_lens cut after its last token,
        which is what one call of T tokens would compute (each token attends
        up to its own position)."""
        tokens = query.shape[2]
        if tokens == 1:
            q = query[:, :, 0]
            out = torch.empty_like(q)
            flint_decode_attention(q, self.kv[layer], self.block_tables, self.seq_lens, sinks, window, scale, out)
            return out.unsqueeze(1)
        q = query.transpose(1, 2).contiguous()
        out = torch.empty_like(q)
        for call, start in enumerate(range(0, tokens, MAX_QUERY_TOKENS)):
            end = min(start + MAX_QUERY_TOKENS, tokens)
            seq_lens = self.seq_lens if end == tokens else self._cut_lens[call]
            flint_decode_attention(q[:, start:end], self.kv[layer], self.block_tables, seq_lens, sinks, window,
                                   scale, out[:, start:end])
        return out


def _eager_attention(module):
    """The model's own eager attention function (its modeling module's)."""
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:
        raise NotImplementedError(f"{type(module).__name__}: no eager_attention_forward to prefill with")
    return eager


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
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The "flint" attention function. query ``[B, H, T, D]``, key and value
    ``[B, kvH, T, D]``: the T new tokens of each request. Returns the output
    as ``[B, T, H, D]`` (and eager's weights in the prefill, else None)."""
    cache, layer = _current
    if not isinstance(cache, FlintPagedCache) or layer != module.layer_idx:
        raise ValueError(
            "attention 'flint' needs a FlintPagedCache as the model's past_key_values "
            "(or flint_attention.integrations.transformers.flint_generate)"
        )
    _current[0], _current[1] = None, -1
    if layer == 0:
        cache._begin(query.shape[2], kwargs.get("position_ids"))
    cache.write(layer, key, value)
    if cache._prefill:
        # The prompt's own K/V are all there is to attend to: the model's eager attention, with
        # transformers' causal / sliding / padding mask.
        if s_aux is not None:
            cache.keep_sinks(layer, s_aux)
            kwargs["s_aux"] = s_aux
        return _eager_attention(module)(module, query, key, value, attention_mask, scaling=scaling,
                                        dropout=dropout, sliding_window=sliding_window, **kwargs)
    sinks = None if s_aux is None else cache.keep_sinks(layer, s_aux)
    return cache.attend(layer, query, sinks, sliding_window, scaling), None


def decode_step(model, cache: FlintPagedCache, input_ids: torch.Tensor) -> torch.Tensor:
    """One step of every request after ``cache.advance(T)``: the tokens
    ``input_ids [B, T]`` go in at positions ``seq_lens - T ...``; returns the
    logits ``[B, T, vocab]``. Nothing here reads a value on the host, so
    ``torch.cuda.graph`` can capture it."""
    positions = cache.seq_lens.long()[:, None] - input_ids.shape[1] + torch.arange(
        input_ids.shape[1], device=input_ids.device)
    cache._host_steps = True
    try:
        # No mask: the "flint" mask function gives none after the prefill.
        return model(input_ids=input_ids, position_ids=positions, past_key_values=cache, use_cache=True).logits
    finally:
        cache._host_steps = False


class GraphedDecodeStep:
    """``decode_step`` captured once in a CUDA graph, replayed for every step.

    The first call runs the step eagerly (the op allocates its workspace then)
    and captures it; every call, the first included, then copies the tokens
    into the graph's input and replays it. Call ``cache.advance()`` before each
    call, as for ``decode_step``: the graph reads seq_lens and the block tables
    from the device, so it follows their in-place updates (the warm-up and the
    capture write the same slots, which the replay then writes again). The
    graph's shapes are the first call's: steps of another token count T need
    another instance (``greedy_decode`` with a draft keeps one per T).
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


@contextlib.contextmanager
def attention_implementation(model, name: str) -> Iterator[None]:
    """Runs the block with the model's attention set to ``name``."""
    previous = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


@torch.inference_mode()
def flint_generate(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                   max_new_tokens: int, cuda_graph: bool = False, **generate_kwargs):
    """``model.generate(input_ids, attention_mask=..., max_new_tokens=...,
    **generate_kwargs)`` with Flint: the model's attention set to "flint" for
    the call and a fresh ``FlintPagedCache`` as ``past_key_values``; returns
    what ``generate`` returns. ``input_ids`` left-padded as for ``generate``
    (``attention_mask`` 0 on the pads). With ``assistant_model=draft``
    (one request): assisted generation, the draft on its own attention.

    ``cuda_graph=True`` (a CUDA model): greedy decoding in a host loop
    (``greedy_decode``) whose decode steps replay one captured CUDA graph;
    it returns what greedy ``generate`` would (the sequences, or with
    ``return_dict_in_generate`` a ``GenerateDecoderOnlyOutput`` with
    ``logits`` if ``output_logits``) and takes no other generation arguments
    but ``assistant_model``. With ``assistant_model=draft`` (one request,
    ``input_ids`` ``[1, P]``): greedy assisted decoding, whose verify steps of
    T = k + 1 tokens (k draft tokens, at most 7) replay the graph captured for
    their T, one graph per T and so at most 8; its tokens are the target's
    greedy ones, as assisted ``generate``'s are.
    """
    batch, prompt = input_ids.shape
    cache = FlintPagedCache(model.config, batch, prompt + max_new_tokens, model.device)
    with attention_implementation(model, register()):
        if not cuda_graph:
            return model.generate(input_ids, attention_mask=attention_mask, past_key_values=cache,
                                  max_new_tokens=max_new_tokens, **generate_kwargs)
        return _graphed_greedy(model, cache, input_ids, attention_mask, max_new_tokens, **generate_kwargs)


def _graphed_greedy(model, cache, input_ids, attention_mask, max_new_tokens, *, assistant_model=None,
                    return_dict_in_generate=False, output_logits=False, do_sample=False, pad_token_id=None):
    # The arguments first, then the device: their errors do not depend on where the model is.
    if do_sample:
        raise ValueError("cuda_graph decodes greedily (do_sample=False)")
    if assistant_model is not None and input_ids.shape[0] != 1:
        raise ValueError(f"cuda_graph with assistant_model decodes one request (as assisted generate does), "
                         f"not a batch of {input_ids.shape[0]}")
    if model.device.type != "cuda":
        raise ValueError(f"cuda_graph needs the model on a CUDA device, it is on {model.device}")
    graphs: dict[int, GraphedDecodeStep] = {}  # a graph's shapes are fixed: one per step's token count T

    def step(tokens: torch.Tensor) -> torch.Tensor:
        if tokens.shape[1] not in graphs:
            graphs[tokens.shape[1]] = GraphedDecodeStep(model, cache)
        return graphs[tokens.shape[1]](tokens)

    sequences, logits = greedy_decode(model, cache, input_ids, attention_mask, max_new_tokens, step,
                                      assistant_model)
    if not return_dict_in_generate:
        return sequences
    return GenerateDecoderOnlyOutput(sequences=sequences, logits=logits if output_logits else None)


def greedy_decode(model, cache: FlintPagedCache, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                  max_new_tokens: int, step, draft=None) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Greedy decoding in a host loop, plain or assisted by ``draft``: the
    prefill (eager, through the model's forward into the empty ``cache``),
    then steps of ``step(tokens [B, T]) -> logits [B, T, vocab]`` after
    ``cache.advance(T)``: ``decode_step`` (partially applied), or replays of
    CUDA graphs of it (``flint_generate(..., cuda_graph=True)``).

    Without a draft every step takes the last token (T = 1). With one (one
    request: ``input_ids [1, P]``), a round: the draft's own ``generate``
    proposes k greedy tokens d_1..d_k after the sequence so far, the step
    verifies [last, d_1..d_k] (T = k + 1), p_i = argmax of its row i, and
    the first a draft tokens with d_(i+1) = p_i are accepted: the round emits
    d_1..d_a, p_a, and ``cache.crop`` takes the k - a rejected ones back, so
    that the cache holds every emitted token but p_a, the next round's last.
    Each p_i is the target's greedy token after the tokens before it, so the
    tokens are plain greedy decoding's. k: the draft's
    ``num_assistant_tokens`` (as many as fit when unset), at most
    7 (T at most the op's 8) and no more than makes max_new_tokens.

    Returns the sequences ``[B, P + max_new_tokens]`` and the logits of each
    new token (``max_new_tokens`` tensors ``[B, vocab]``: the prefill's last
    row, then the step's row that gave the token, as greedy ``generate``'s
    ``output_logits``). EOS is not looked at: every request decodes
    ``max_new_tokens`` tokens.
    """
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    logits = [model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                    past_key_values=cache, use_cache=True).logits[:, -1]]
    tokens = [logits[0].argmax(-1, keepdim=True)]  # the new tokens, in pieces; the last one is not cached yet
    most = 0 if draft is None else min(draft.generation_config.num_assistant_tokens or MAX_QUERY_TOKENS,
                                       MAX_QUERY_TOKENS - 1)
    produced = 1
    while produced < max_new_tokens:
        proposal = tokens[-1][:, -1:]
        draft_tokens = min(most, max_new_tokens - produced - 1)  # a round emits up to draft_tokens + 1
        if draft_tokens:
            sequence = torch.cat([input_ids, *tokens], 1)
            mask = torch.cat([attention_mask, torch.ones_like(sequence[:, input_ids.shape[1]:])], 1)
            drafted = draft.generate(sequence.to(draft.device), attention_mask=mask.to(draft.device),
                                     max_new_tokens=draft_tokens, do_sample=False)
            # Fewer than draft_tokens where the draft met its EOS.
            proposal = torch.cat([proposal, drafted[:, sequence.shape[1]:].to(proposal.device)], 1)
        cache.advance(proposal.shape[1])
        verified = step(proposal)
        predicted = verified.argmax(-1)  # p_0..p_k
        # Plain decoding (T = 1) reads nothing on the host, so that its steps queue up asynchronously.
        accepted = 0 if proposal.shape[1] == 1 else int((proposal[:, 1:] == predicted[:, :-1]).cumprod(-1).sum())
        cache.crop(-(proposal.shape[1] - 1 - accepted))
        tokens.append(predicted[:, : accepted + 1])
        logits += verified[:, : accepted + 1].unbind(1)
        produced += accepted + 1
    return torch.cat([input_ids, *tokens], 1), tuple(logits)


# Small random models, for the tests and the demo.

def _finish(model, device):
    """bf16 on ``device``, logits in fp32 (from the bf16 hidden state): bf16
    logits, quantized to 1/64 near 2, would tie at the top too often to
    compare greedy tokens. The builders draw weights at 3x transformers'
    default scale and this sets QK-norm gains to 2, so that attention is
    peaked enough for a single position (the window's edge) to matter; sinks
    of unit scale (the initializer's would hardly matter)."""
    with torch.no_grad():
        for layer in model.model.layers:
            attn = layer.self_attn
            for norm in (getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)):
                if norm is not None:
                    norm.weight.fill_(2.0)
            if hasattr(attn, "sinks"):
                attn.sinks.normal_(0.0, 1.0)
    if hasattr(model, "set_experts_implementation") and hasattr(model.config, "num_experts_per_tok"):
        # On CUDA the experts run as batched matmuls, which a CUDA graph can capture (eager's loop
        # reads the routing on the host); on the CPU as eager's loop, far cheaper for a prefill.
        model.set_experts_implementation("batched_mm" if torch.device(device).type == "cuda" else "eager")
    model = model.to(device=device, dtype=torch.bfloat16).eval()
    model.lm_head.float()
    model.lm_head.register_forward_pre_hook(lambda _, args: (args[0].float(),))
    model.generation_config.pad_token_id = 0
    return model


def random_flint(*, layers: int = 4, window: int = 513, hidden_size: int = 256, vocab_size: int = 512,
                 seed: int = 0, device: str | torch.device = "cpu"):
    """A small random FlintForCausalLM: 32 query / 4 kv heads, head_dim 128,
    sinks, a sliding window on the middle layers and full (rotary-free)
    attention on the first and last, QK norms; every token routed to every
    expert (a near tie in a top-k choice of experts would turn rounding noise
    into a jump of the logits). The weights depend only on ``seed``."""
    config = transformers.FlintConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=hidden_size, num_hidden_layers=layers,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, sliding_window=window,
        layer_types=["full_attention"] + ["sliding_attention"] * (layers - 2) + ["full_attention"],
        mlp_only_layers=[0], num_experts=4, num_experts_per_tok=4, moe_intermediate_size=hidden_size // 2,
        shared_expert_intermediate_size=hidden_size // 2, initializer_range=0.06, max_position_embeddings=4096,
    )
    torch.manual_seed(seed)
    return _finish(transformers.FlintForCausalLM(config), device)


def random_gpt_oss(*, layers: int = 2, window: int = 128, hidden_size: int = 256, vocab_size: int = 512,
                   experts: int = 4, seed: int = 0, device: str | torch.device = "cpu"):
    """A small random GptOssForCausalLM as gpt-oss is: 64 query / 8 kv heads,
    head_dim 64, sinks, sliding window and full layers alternating."""
    config = transformers.GptOssConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=hidden_size, head_dim=64,
        num_attention_heads=64, num_key_value_heads=8, num_hidden_layers=layers,
        layer_types=["sliding_attention", "full_attention"] * (layers // 2) + ["sliding_attention"] * (layers % 2),
        sliding_window=window, num_local_experts=experts, num_experts_per_tok=experts,
        initializer_range=0.06, max_position_embeddings=4096,
    )
    torch.manual_seed(seed)
    return _finish(transformers.GptOssForCausalLM(config), device)


def random_qwen3(*, layers: int = 2, hidden_size: int = 256, vocab_size: int = 512, seed: int = 0,
                 device: str | torch.device = "cpu"):
    """A small random Qwen3ForCausalLM: no sinks, 16 query / 4 kv heads (4 per
    kv head), head_dim 128, full attention."""
    config = transformers.Qwen3Config(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=hidden_size, head_dim=128,
        num_attention_heads=16, num_key_value_heads=4, num_hidden_layers=layers,
        initializer_range=0.06, max_position_embeddings=4096,
    )
    torch.manual_seed(seed)
    return _finish(transformers.Qwen3ForCausalLM(config), device)


def left_padded(prompts: Sequence[Sequence[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of different lengths as ``generate`` takes them: ``input_ids``
    and ``attention_mask`` ``[B, max_len]``, left-padded."""
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    return ids, mask


def _demo(args) -> int:
    device = torch.device("cuda" if torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
                          else "cpu")
    model = random_flint(device=device)
    gen = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(1, model.config.vocab_size, (n,), generator=gen).tolist() for n in args.prompt_lens]
    ids, mask = (x.to(device) for x in left_padded(prompts))
    config = model.config
    print(f"random FlintForCausalLM: {config.num_hidden_layers} layers ({', '.join(config.layer_types)}; window "
          f"{config.sliding_window}), {config.num_attention_heads} query / {config.num_key_value_heads} kv heads, "
          f"head_dim {config.head_dim}, bf16, on {device}")
    print(f"{len(prompts)} requests, prompt lengths {args.prompt_lens}; greedy, {args.steps} new tokens each")
    results = {}
    for name in ("flint", "eager"):
        start = time.perf_counter()
        if name == "flint":
            out = flint_generate(model, ids, mask, max_new_tokens=args.steps, do_sample=False)
        else:
            with attention_implementation(model, "eager"), torch.inference_mode():
                out = model.generate(ids, attention_mask=mask, max_new_tokens=args.steps, do_sample=False)
        results[name] = (out[:, ids.shape[1]:].cpu(), time.perf_counter() - start)
    for request in range(len(prompts)):
        same = torch.equal(results["flint"][0][request], results["eager"][0][request])
        print(f"request {request}, prompt of {args.prompt_lens[request]} tokens: "
              f"{'same tokens' if same else 'tokens differ'}")
        for name in results:
            print(f"  {name}: {results[name][0][request].tolist()}")
    for name, (_, seconds) in results.items():
        print(f"generate with {name} attention: {seconds:.2f} s")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flint_attention.integrations.transformers",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--demo", action="store_true", help="generate with Flint and with eager, side by side")
    parser.add_argument("--prompt-lens", type=int, nargs="+", default=[7, 60, 600])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not args.demo:
        parser.print_help()
        return 0
    return _demo(args)


if __name__ == "__main__":
    sys.exit(main())
