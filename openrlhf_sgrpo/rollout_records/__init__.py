"""Rollout records: compact per-step jsonl of what the agent did, for ``python -m openrlhf_sgrpo.inspect``.

- :mod:`.build`   one trajectory (token ids + the agent's info row) -> a sample record with its turns
- :mod:`.sources` local ``Sample`` lists / OpenRLHF experiences -> group records (strata, SAN/GN)
- :mod:`.store`   ``RUN_DIR/rollouts/<phase>/step_<step:06d>.jsonl``: atomic or appending writer, reader

The format (``schema_version`` 1) is documented in ``docs/inspector.md``. Nothing is imported
here, so the inspector reads records without importing torch.
"""
