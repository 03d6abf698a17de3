"""Adapters that let other libraries' models call Flint.

Each adapter is a submodule that imports its library itself, so that
``import flint_attention`` never needs them:

- ``flint_attention.integrations.transformers``: a Hugging Face transformers
  GptOss model that prefills with its own attention and decodes with Flint on
  a paged KV pool (``pip install -e '.[transformers]'`` from the clone).
"""
