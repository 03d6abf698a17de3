"""Adapters that let other libraries' models call Flint.

Each adapter is a submodule that imports its library itself, so that
``import flint_attention`` never needs them:

- ``flint_attention.integrations.transformers``: Hugging Face transformers
  models (FlintForCausalLM, GptOss, Qwen3, Llama...) generating with the
  attention "flint" and a ``FlintPagedCache``: the prefill with the model's
  own attention, every later step with Flint on a paged KV pool
  (``pip install -e '.[transformers]'`` from the clone).
"""
