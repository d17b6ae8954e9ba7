"""horovod.tensorflow.keras.elastic's names: not supported by jaxcache (each raises and says why)."""

from __future__ import annotations

from ...compat import unsupported

_WHY = unsupported.ELASTIC
run = unsupported.function("jaxcache.tensorflow.keras.elastic.run", _WHY)
KerasState = unsupported.cls("jaxcache.tensorflow.keras.elastic.KerasState", _WHY)
CommitStateCallback = unsupported.cls("jaxcache.tensorflow.keras.elastic.CommitStateCallback", _WHY)
UpdateBatchStateCallback = unsupported.cls("jaxcache.tensorflow.keras.elastic.UpdateBatchStateCallback", _WHY)
UpdateEpochStateCallback = unsupported.cls("jaxcache.tensorflow.keras.elastic.UpdateEpochStateCallback", _WHY)

__all__ = ["run", "KerasState", "CommitStateCallback", "UpdateBatchStateCallback",
           "UpdateEpochStateCallback"]
