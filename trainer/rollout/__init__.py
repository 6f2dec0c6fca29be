"""Rollout: envs asking a generator, episodes becoming groups of samples.

- :mod:`.types`: ``Sample``, ``Group``, ``Segment`` (plain dataclasses, read by every room above);
- :mod:`.manager`: the asynchronous rollout (prompt template, batching generator, staleness bound);
- :mod:`.curriculum`: initialized sampling from states saved along successful episodes;
- :mod:`.reward`: verifiers and LLM judges that add to an episode's reward;
- :mod:`.service_policy`: the trainer's policy behind the model service.

Imports the engines, the config, envs and models.
"""
