"""horovod.torch.elastic on jaxcache's elastic core (jaxcache.elastic; docs/elastic.md).

    import jaxcache.torch as hvd
    hvd.init()
    sampler = hvd.elastic.ElasticSampler(dataset)
    loader = torch.utils.data.DataLoader(dataset, batch_size=32, sampler=sampler)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        while state.epoch < epochs:
            for i, (x, y) in enumerate(loader):
                ...; optimizer.step()
                sampler.record_batch(i, 32)
                state.batch += 1
                state.commit()
            state.epoch += 1
            state.batch = 0
            sampler.set_epoch(state.epoch)
            state.commit()

    train(state)

A reset restarts the job's processes (the launcher ends the MPI job and starts a new one);
``run`` loads the newest commit into the new processes' model, optimizer and sampler.
"""

from __future__ import annotations

import copy
import math
import random
from typing import Any

import torch

from ..compat.api import rank, size
from ..elastic import run
from ..elastic.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from ..elastic.state import ObjectState, State
from .functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters


class ElasticSampler(torch.utils.data.Sampler):
    """Splits a dataset over the ranks and, after a reset, splits only the samples not yet
    processed this epoch over the new ranks (Horovod's ElasticSampler).

    Progress is one number, ``processed_num``: how many samples of this epoch's (seeded,
    shuffled) order the job has processed. Every rank counts the same batches, so every
    rank's copy is the job's; a TorchState keeps it through resets. Call ``record_batch``
    after each batch and ``set_epoch`` at the end of each epoch.
    """

    def __init__(self, dataset, shuffle: bool = True, seed: int = 0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Starts `epoch` (its own order when shuffling) with nothing processed; call it at
        the end of an epoch so that a reset inside the next one skips what was done."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Records batch `batch_idx` (of this pass over the sampler, `batch_size` samples a
        rank) as processed on every rank."""
        self.record_indices(self.get_indices(batch_idx, batch_size))

    def record_indices(self, indices) -> None:
        """Records `indices`, this rank's next batch, as processed. Every rank records a
        batch of the same length at the same step (as with record_batch), so the job's
        progress grows by len(indices) per rank."""
        self.processed_num += len(indices) * self.num_replicas

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """This rank's dataset indices of batch `batch_idx` of this pass."""
        start = batch_idx * batch_size
        return self.indices[start:start + batch_size]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self) -> None:
        """Splits the samples not yet processed this epoch over the current ranks."""
        self.num_replicas, self.rank = size(), rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        # Rank r takes every num_replicas-th sample from r, so the first k samples of every
        # rank are together the first k * num_replicas of the order: what processed_num counts.
        # The order is padded by repeating it so that every rank gets num_samples.
        padded = [self.remaining_indices[i % len(self.remaining_indices)] for i in range(self.total_size)]
        self.indices = padded[self.rank::self.num_replicas]

    def __iter__(self):
        return iter(list(self.indices))

    def __len__(self) -> int:
        return self.num_samples


# --- TorchState: live objects kept by their state_dict -----------------------------


class _StateDictHandler:
    """A live object (model, optimizer, sampler) that TorchState saves as a deep copy of its
    state_dict and restores with load_state_dict."""

    def __init__(self, value):
        self.value = value
        self.saved: Any = None
        self.save()

    def save(self) -> None:
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        # A copy: load_state_dict may keep the given tensors (torch.optim does), and the
        # next in-place update must not reach the saved state.
        self.value.load_state_dict(copy.deepcopy(self.saved))

    def sync(self) -> None:
        """Gives every rank rank 0's live state, and saves it."""
        raise NotImplementedError

    def load_snapshot(self, saved: Any) -> None:
        self.saved = saved
        self.restore()


class _ModelHandler(_StateDictHandler):
    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)
        self.save()


class _OptimizerHandler(_StateDictHandler):
    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)
        self.save()


class _SamplerHandler(_StateDictHandler):
    def sync(self) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), 0, name="torch.elastic.sampler"))
        self.save()


_HANDLERS: list[tuple[type, type[_StateDictHandler]]] = [
    (torch.nn.Module, _ModelHandler),
    (torch.optim.Optimizer, _OptimizerHandler),
    (ElasticSampler, _SamplerHandler),
]


def _handler_for(value) -> _StateDictHandler | None:
    for kind, handler in _HANDLERS:
        if isinstance(value, kind):
            return handler(value)
    return None


class TorchState(ObjectState):
    """Horovod's TorchState: the model, the optimizer and any keyword values, each an
    attribute. Modules, optimizers and ElasticSamplers (any keyword) are saved as deep
    copies of their state_dict, restored with load_state_dict and synced from rank 0; the
    other values are kept as by ObjectState. Assigning a new model (or optimizer, sampler)
    to its attribute saves it at once, as Horovod does."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        handlers = {}
        for name, value in kwargs.items():
            handler = _handler_for(value)
            if handler is not None:
                handlers[name] = handler
        # Set before ObjectState's attributes, which __setattr__ checks against it.
        object.__setattr__(self, "_handlers", handlers)
        for name, handler in handlers.items():
            object.__setattr__(self, name, handler.value)
        super().__init__(**{k: v for k, v in kwargs.items() if k not in handlers})

    def __setattr__(self, name: str, value) -> None:
        handler = self.__dict__.get("_handlers", {}).get(name)
        if handler is not None:
            handler.value = value
            handler.save()
        super().__setattr__(name, value)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def _snapshot(self) -> Any:
        # state_dicts hold plain tensors, which pickle on their own.
        return {"handlers": {name: h.saved for name, h in self._handlers.items()},
                "values": super()._snapshot()}

    def _load_snapshot(self, snapshot: Any) -> None:
        for name, saved in snapshot["handlers"].items():
            if name in self._handlers:
                self._handlers[name].load_snapshot(saved)
        super()._load_snapshot(snapshot["values"])


__all__ = ["run", "TorchState", "ElasticSampler", "State", "ObjectState", "HorovodInternalError",
           "HostsUpdatedInterrupt"]
