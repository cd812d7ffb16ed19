"""Tools built on the core: the ``zephon-jax`` command line and what it runs.

``cli`` (the command), ``demo`` (the elastic-resume demo), ``prepare`` and
``prepare_beam`` (corpus conversion), ``verify`` (topology and resume checks),
``inspect_plan`` (a pipeline's plan, state bytes and timing), ``explain``
(provenance as text), ``corpus`` (the built-in corpus), ``tokenizers``
(the byte-level tokenizer and ``module:function`` loading) and ``arguments``
(argument types of the command's parsers). The core
(``zephon_jax`` itself) never imports them.
"""
