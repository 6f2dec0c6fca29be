"""Engines: what runs a model.

- :mod:`.sampling`: sampling parameters, outputs, the processed distribution both engines sample;
- :mod:`.lifecycle`: the generation loop's lifecycle (thread, weight loads, close), written once;
- :mod:`.scheduler`: continuous batching over a torch KV cache;
- :mod:`.generation`: the generation engines (Transformers, vLLM);
- :mod:`.policy`: the training engines (plain torch, DeepSpeed);
- :mod:`.weight_sync`: trainer -> generator weights over a torch process group;
- :mod:`.offload`: moving a role's state off the device it shares.

Imports the config only.
"""
