"""The OpenAI Batch API on the mesh's own pools (docs/batch.md).

``api`` serves ``/v1/files`` and ``/v1/batches`` behind the gateway; ``runner`` feeds the jobs'
lines back through the gateway in the batch lane while the pool has headroom. Jobs, progress and
results live in Redis (``records``), file bytes in a :class:`~batch_service.files.FileStore`.
"""
