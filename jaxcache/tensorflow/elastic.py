"""horovod.tensorflow.elastic's names: not supported by jaxcache (each raises and says why)."""

from __future__ import annotations

from ..compat import unsupported

_WHY = unsupported.ELASTIC
run = unsupported.function("jaxcache.tensorflow.elastic.run", _WHY)
TensorFlowKerasState = unsupported.cls("jaxcache.tensorflow.elastic.TensorFlowKerasState", _WHY)
TensorFlowState = unsupported.cls("jaxcache.tensorflow.elastic.TensorFlowState", _WHY)
ObjectState = unsupported.cls("jaxcache.tensorflow.elastic.ObjectState", _WHY)

__all__ = ["run", "TensorFlowKerasState", "TensorFlowState", "ObjectState"]
