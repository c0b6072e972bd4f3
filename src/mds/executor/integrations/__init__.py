"""Glue between the executor and training frameworks, one module per framework.

Nothing here is imported by `mds.executor`: import `mds.executor.integrations.lightning` or
`mds.executor.integrations.hf` only where that framework is installed and used.
`mds.executor.integrations.batches` (torch only) holds what the adapters share.
"""
