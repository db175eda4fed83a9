"""Bigger than memory: a model read from its safetensors shards one decoder layer at a time.

* :mod:`.checkpoint` -- which shard holds which tensor; tensors read memory-mapped
  (``safe_open``); a checkpoint with only ``.bin`` pickles is refused.
* :mod:`.model` -- :class:`StreamedModel`: the model's skeleton on the ``meta`` device, whose
  embeddings, final norm / LM head and one decoder layer at a time are materialised from the
  checkpoint on the compute device (a pruned cell's keep set and compensated weights installed
  per layer as it streams) and released after.
* :mod:`.hidden` -- :class:`HiddenStore`: the hidden states of all sequences between two
  layers, in host memory up to a budget and in files next to the output beyond it.
* :mod:`.calibrate` -- the calibration pass over a streamed model, resumable after a kill at
  the layer of its last checkpoint.
* :mod:`.stages` -- how a stage reaches a streamed cell (whether an evaluation streams, the
  streamed model with its tokenizer); the stage bodies are ``coec.pipeline``'s.
* :mod:`.options` -- the streaming flags and their values (:class:`StreamOptions`).

Layer-sequential evaluation lives in :mod:`coec.evaluate.layerwise` (perplexity) and
:mod:`coec.evaluate.layerwise_lm` (an lm-eval ``LM``); the memory plan in :mod:`.plan`.
"""
