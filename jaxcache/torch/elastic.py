"""horovod.torch.elastic's names: not supported by jaxcache (each raises and says why)."""

from __future__ import annotations

from ..compat import unsupported

run = unsupported.function("jaxcache.torch.elastic.run", unsupported.ELASTIC)
TorchState = unsupported.cls("jaxcache.torch.elastic.TorchState", unsupported.ELASTIC)
ElasticSampler = unsupported.cls("jaxcache.torch.elastic.ElasticSampler", unsupported.ELASTIC)

__all__ = ["run", "TorchState", "ElasticSampler"]
