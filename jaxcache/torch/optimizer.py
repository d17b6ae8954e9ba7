"""DistributedOptimizer: gradients are reduced during backward, waited for in step()."""

from __future__ import annotations

import contextlib
import warnings

import torch

from .. import grouping
from .. import runtime as _runtime
from ..compat import process_sets, reduce_ops
from ..compat.process_sets import global_process_set
from . import checks, requests
from . import compression as _compression
from .compression import Compression
from .functions import agree
from .sparse import sparse_allreduce_async
from ..protocol import Kind


class OptimizerStateError(RuntimeError, AssertionError):
    """Misuse of DistributedOptimizer's step protocol (Horovod raises AssertionError here)."""


class _Unit:
    """One named request: a single parameter's gradient, or a group of them."""

    __slots__ = ("name", "indices", "ready", "submitted", "handle", "members", "sparse")

    def __init__(self, name: str, indices: list[int]):
        self.name = name
        self.indices = indices
        self.ready = 0  # members whose gradient is final for this step
        self.submitted = False
        self.handle = None  # the dense request
        self.members = []  # (index, compressed/densified copy, compression ctx, grad was sparse)
        self.sparse = []  # (index, callable returning the reduced sparse gradient)

    def reset(self) -> None:
        self.ready = 0
        self.submitted = False
        self.handle = None
        self.members = []
        self.sparse = []


class _DistributedMixin:
    """Mixed in front of the wrapped optimizer's class (see DistributedOptimizer)."""

    # --- setup -----------------------------------------------------------------------------

    def _jc_setup(self, named_parameters, compression, backward_passes_per_step, op,
                  gradient_predivide_factor, groups, sparse_as_dense, process_set, name_prefix):
        fn = "DistributedOptimizer"
        pre, post = self._jc_arguments(compression, backward_passes_per_step, op, gradient_predivide_factor,
                                       sparse_as_dense, process_set, name_prefix, fn)
        all_params = [p for group in self.param_groups for p in group["params"]]
        names = self._jc_names(all_params, named_parameters, fn)
        # Horovod's attribute, which user code reads: {parameter: name}.
        self._parameter_names = {p: names[id(p)] for p in all_params}
        params = [p for p in all_params if p.requires_grad]
        for p in params:
            what = f"parameter {names[id(p)]!r}"
            checks.check_tensor(p, fn, what)
            checks.check_reduction(p, self._jc_op, pre, post, fn, what)
        self._jc_params = params
        self._jc_param_names = [names[id(p)] for p in params]
        self._jc_units = self._jc_build_units(params, groups, names, name_prefix, fn)
        self._jc_unit_of = [None] * len(params)
        for u in self._jc_units:
            for i in u.indices:
                self._jc_unit_of[i] = u
        self._jc_counts = [0] * len(params)
        self._jc_pending: list[_Unit] = []
        self._jc_synced = False
        self._jc_skip_sync = False
        self._jc_op_code, self._jc_pre, self._jc_post = checks.reduce_args(self._jc_op, pre, post)
        self._jc_hooks = []
        if not self._jc_member:
            return
        self._jc_agree_layout(name_prefix, fn, process_set)
        self._jc_hooks = [p.register_post_accumulate_grad_hook(self._jc_make_hook(i))
                          for i, p in enumerate(params)]

    def _jc_arguments(self, compression, backward_passes_per_step, op, gradient_predivide_factor,
                      sparse_as_dense, process_set, name_prefix, fn) -> tuple[float, float]:
        """Checks and keeps the optimizer's arguments; returns the (prescale, postscale)."""
        # Horovod's rule: on a rank outside the process set the optimizer reduces nothing.
        self._jc_set = process_sets.resolve(process_set, f"torch.{fn}", member=False)
        self._jc_member = self._jc_set.rank >= 0
        self._jc_op = reduce_ops.to_name(op, f"torch.{fn}")
        pre, post = reduce_ops.predivide(self._jc_op, gradient_predivide_factor, f"torch.{fn}")
        if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) \
                or backward_passes_per_step < 1:
            raise ValueError(f"jaxcache.torch.{fn}: backward_passes_per_step must be an int >= 1, got "
                             f"{backward_passes_per_step!r}")
        _compression.check(compression, fn)
        if not isinstance(name_prefix, str) or not name_prefix:
            raise TypeError(f"jaxcache.torch.{fn}: name_prefix must be a non-empty str")
        self._jc_k = backward_passes_per_step
        self.backward_passes_per_step = backward_passes_per_step
        self._jc_compression = compression
        self._jc_identity = compression is Compression.none or isinstance(compression, Compression.none)
        self._jc_sparse_as_dense = bool(sparse_as_dense)
        self.op, self.gradient_predivide_factor = op, gradient_predivide_factor
        self.sparse_as_dense, self.process_set = bool(sparse_as_dense), process_set
        return pre, post

    def _jc_build_units(self, params, groups, names, name_prefix, fn) -> list["_Unit"]:
        """One request per group, then one per parameter left outside every group."""
        index_of = {id(p): i for i, p in enumerate(params)}
        units = [_Unit(f"torch.{name_prefix}/group{gi}", members)
                 for gi, members in enumerate(self._jc_groups(params, groups, index_of, names, fn))]
        grouped = {i for u in units for i in u.indices}
        units += [_Unit(f"torch.{name_prefix}/{self._jc_param_names[i]}", [i])
                  for i in range(len(params)) if i not in grouped]
        return units

    def _jc_agree_layout(self, name_prefix, fn, process_set) -> None:
        """Every rank must build the same requests: checked once, failing on every rank if not."""
        params = self._jc_params
        layout = sorted(
            u.name + "=" + ",".join(f"{self._jc_param_names[i]}{tuple(params[i].shape)}"
                                    f"{str(params[i].dtype).replace('torch.', '')}" for i in u.indices)
            for u in self._jc_units
        )
        agree(f"{name_prefix}.layout", layout, fn,
              "the parameters to synchronize (names, shapes, dtypes, groups); build the model, the "
              "optimizer and named_parameters identically on every rank", process_set)

    @staticmethod
    def _jc_names(all_params, named_parameters, fn) -> dict[int, str]:
        if named_parameters is None:
            # Positional names: identical across ranks that build the optimizer the same way.
            names, i = {}, 0
            for p in all_params:
                names[id(p)] = f"param.{i}"
                i += 1
            return names
        try:
            pairs = list(named_parameters)
        except TypeError:
            raise TypeError(f"jaxcache.torch.{fn}: named_parameters must be an iterable of (name, "
                            f"parameter) pairs, e.g. model.named_parameters()") from None
        names: dict[int, str] = {}
        by_name: dict[str, torch.Tensor] = {}
        for j, item in enumerate(pairs):
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                    and isinstance(item[1], torch.Tensor)):
                raise TypeError(f"jaxcache.torch.{fn}: named_parameters item {j} is not a (str, "
                                f"torch.Tensor) pair: {type(item).__name__}")
            name, p = item
            if name in by_name:
                raise ValueError(f"jaxcache.torch.{fn}: duplicate parameter name {name!r} in "
                                 "named_parameters; names must be unique (they name the collectives)")
            if id(p) in names:
                raise ValueError(f"jaxcache.torch.{fn}: the same parameter appears twice in "
                                 f"named_parameters, as {names[id(p)]!r} and {name!r}")
            by_name[name] = p
            names[id(p)] = name
        unnamed = [tuple(p.shape) for p in all_params if id(p) not in names]
        if unnamed:
            raise ValueError(f"jaxcache.torch.{fn}: named_parameters lacks {len(unnamed)} of the "
                             f"optimizer's parameters (shapes {unnamed[:5]}); pass the model's "
                             "named_parameters() for every parameter the optimizer holds")
        return names

    @staticmethod
    def _jc_groups(params, groups, index_of, names, fn) -> list[list[int]]:
        if groups is None:
            return []
        if isinstance(groups, bool):
            raise TypeError(f"jaxcache.torch.{fn}: groups must be None, an int or a list of lists")
        if isinstance(groups, int):
            if groups < 1:
                raise ValueError(f"jaxcache.torch.{fn}: groups must be >= 1, got {groups}")
            # Contiguous chunks in the optimizer's order (which follows the model's layers).
            return grouping.contiguous(len(params), groups)
        if not isinstance(groups, (list, tuple)):
            raise TypeError(f"jaxcache.torch.{fn}: groups must be None, an int or a list of lists "
                            f"of parameters, got {type(groups).__name__}")
        out, seen = [], {}
        for gi, group in enumerate(groups):
            if not isinstance(group, (list, tuple)) or not group:
                raise TypeError(f"jaxcache.torch.{fn}: groups[{gi}] must be a non-empty list of parameters")
            members = []
            for p in group:
                if not isinstance(p, torch.Tensor):
                    raise TypeError(f"jaxcache.torch.{fn}: groups[{gi}] holds a {type(p).__name__}, "
                                    "not a parameter tensor")
                if id(p) not in index_of:
                    raise ValueError(f"jaxcache.torch.{fn}: groups[{gi}] holds a tensor of shape "
                                     f"{tuple(p.shape)} that is not a trainable parameter of the optimizer")
                if id(p) in seen:
                    raise ValueError(f"jaxcache.torch.{fn}: parameter {names[id(p)]!r} is in groups["
                                     f"{seen[id(p)]}] and groups[{gi}]")
                seen[id(p)] = gi
                members.append(index_of[id(p)])
            out.append(members)
        return out

    # --- gradient hooks --------------------------------------------------------------------

    def _jc_make_hook(self, i: int):
        def hook(_param):
            self._jc_on_grad(i)
        return hook

    def _jc_on_grad(self, i: int) -> None:
        count = self._jc_counts[i] + 1
        if count > self._jc_k:
            raise OptimizerStateError(
                f"jaxcache.torch.DistributedOptimizer: the gradient of {self._jc_param_names[i]!r} was "
                f"computed {count} times before step()/synchronize(), but backward_passes_per_step="
                f"{self._jc_k}; raise backward_passes_per_step or call step() after each accumulation"
            )
        self._jc_counts[i] = count
        self._jc_synced = False
        if count == self._jc_k:
            unit = self._jc_unit_of[i]
            unit.ready += 1
            if unit.ready == len(unit.indices):
                self._jc_submit(unit)

    def _jc_submit(self, unit: _Unit) -> None:
        dense = []
        for i in unit.indices:
            p = self._jc_params[i]
            g = p.grad
            if g is None:
                # No gradient on this rank (unused parameter): contribute zeros so that the
                # collective still matches the other ranks'.
                g = p.grad = torch.zeros_like(p)
            was_sparse = g.layout != torch.strided
            if was_sparse and not self._jc_sparse_as_dense:
                name = f"{unit.name}/sparse/{self._jc_param_names[i]}" if len(unit.indices) > 1 else unit.name
                unit.sparse.append((i, sparse_allreduce_async(g, name, self._jc_op, self.process_set)))
                continue
            if was_sparse:
                g = g.to_dense()
            if self._jc_identity and not was_sparse:
                dense.append(g)  # reduced in place in the gradient's own memory
                continue
            c, ctx = self._jc_compression.compress(g)
            dense.append(c)
            unit.members.append((i, c, ctx, was_sparse))
        if dense:
            unit.handle = requests.submit(Kind.ALLREDUCE, unit.name, dense, inplace=True,
                                     op=self._jc_op_code, prescale=self._jc_pre,
                                     postscale=self._jc_post, single=False, bump=False,
                                     process_set=self._jc_set, drive=True)
        unit.submitted = True
        self._jc_pending.append(unit)

    def _jc_finish(self, unit: _Unit) -> None:
        if unit.handle is not None:
            requests.synchronize(unit.handle)
        for i, c, ctx, was_sparse in unit.members:  # compressed or densified copies only
            p = self._jc_params[i]
            g = self._jc_compression.decompress(c, ctx)
            if was_sparse:
                p.grad = g.to_sparse()
            else:
                p.grad.copy_(g)
        for i, result in unit.sparse:
            self._jc_params[i].grad = result()

    # --- public API ------------------------------------------------------------------------

    def synchronize(self) -> None:
        """Submits the gradients whose hooks did not fire (zeros where a rank has none) and waits
        for every outstanding reduction; p.grad then holds the reduced gradient on every rank
        (of the process set; outside it the gradients stay local)."""
        if not self._jc_member:
            self._jc_counts = [0] * len(self._jc_params)
            self._jc_synced = True
            return
        for unit in self._jc_units:
            if not unit.submitted:
                self._jc_submit(unit)
        error = None
        for unit in self._jc_pending:
            try:
                self._jc_finish(unit)
            except Exception as e:  # noqa: BLE001 - raised after every handle is waited for
                if error is None:
                    error = e
            unit.reset()
        self._jc_pending = []
        self._jc_counts = [0] * len(self._jc_params)
        self._jc_synced = True
        if error is not None:
            raise error

    @contextlib.contextmanager
    def skip_synchronize(self):
        """`with opt.skip_synchronize(): opt.step()` after a manual opt.synchronize()."""
        self._jc_skip_sync = True
        try:
            yield
        finally:
            self._jc_skip_sync = False

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._jc_synced and not self._jc_skip_sync:
            # Horovod reduces again here; the gradients are already reduced, so this only
            # says that the call pattern differs from Horovod's documented one.
            warnings.warn("jaxcache.torch: optimizer.step() called without optimizer.skip_synchronize() "
                          "after optimizer.synchronize(); the gradients are not reduced again "
                          "(Horovod would reduce them twice): wrap step() in "
                          "`with optimizer.skip_synchronize():`", UserWarning, stacklevel=2)
        if not (self._jc_synced or self._jc_skip_sync):
            self.synchronize()
        result = super().step()
        self._jc_synced = False
        return loss if closure is not None else result

    # torch's Optimizer wraps `step` of each class it initializes with its profiling/hook
    # wrapper; the wrapped class's step (reached through super()) already is, so this one
    # must not be wrapped a second time (load_state_dict re-runs that patching).
    step.hooked = True

    def zero_grad(self, set_to_none: bool = True):
        if self._jc_pending:
            raise OptimizerStateError(
                "jaxcache.torch.DistributedOptimizer: zero_grad() was called while gradient "
                "reductions are in flight (after backward() and before step() or synchronize()); "
                "call step() (or synchronize()) first"
            )
        self._jc_counts = [0] * len(self._jc_params)
        for unit in self._jc_units:
            unit.ready = 0
        return super().zero_grad(set_to_none=set_to_none)

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Changes the number of local accumulation passes before each reduction."""
        if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
            raise ValueError(f"jaxcache.torch.DistributedOptimizer: backward_passes_per_step must be "
                             f"an int >= 1, got {passes!r}")
        if self._jc_pending:
            raise OptimizerStateError("jaxcache.torch.DistributedOptimizer: "
                                      "set_backward_passes_per_step() while reductions are in flight; "
                                      "call step() or synchronize() first")
        self._jc_k = self.backward_passes_per_step = passes
        self._jc_counts = [0] * len(self._jc_params)

    def load_state_dict(self, state_dict):
        if self._jc_pending:
            raise OptimizerStateError("jaxcache.torch.DistributedOptimizer: load_state_dict() while "
                                      "reductions are in flight; call step() or synchronize() first")
        self._jc_counts = [0] * len(self._jc_params)
        for unit in self._jc_units:
            unit.reset()
        self._jc_synced = False
        return super().load_state_dict(state_dict)

    def add_param_group(self, param_group):
        raise RuntimeError(
            "jaxcache.torch.DistributedOptimizer: add parameter groups to the optimizer before "
            "wrapping it (the wrapper registers one gradient hook per parameter at construction)"
        )

    def remove_hooks(self) -> None:
        """Detaches the gradient hooks (before wrapping the same parameters again)."""
        for h in self._jc_hooks:
            h.remove()
        self._jc_hooks = []


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step: int = 1, op=reduce_ops.Average,
                         gradient_predivide_factor: float = 1.0, num_groups: int = 0, groups=None,
                         sparse_as_dense: bool = False, process_set=global_process_set, *,
                         name_prefix: str = "grad"):
    """Wraps a torch optimizer so that step() applies gradients reduced over all ranks (of
    `process_set`).

    A hook on every trainable parameter submits its gradient (asynchronously, in place when
    uncompressed) as soon as backward has accumulated it `backward_passes_per_step` times, so
    communication overlaps the rest of backward; step() (or synchronize()) waits for all of
    them, then runs the wrapped optimizer.

    named_parameters: model.named_parameters(); the names name the collectives, so they must
        be unique (ValueError otherwise) and identical on every rank. Default: positional names.
    compression: Compression.none (default), .fp16 or .bf16 (floating gradients travel cast).
    op: Average (default) or Sum (also Min, Max, Product; jaxcache's op strings work too).
    gradient_predivide_factor: with op=Average, gradients are scaled by 1/f before the sum and
        f/size after it.
    num_groups: deprecated spelling of an int `groups`.
    groups: None (one request per parameter; the runtime still fuses small ones), an int n
        (n contiguous groups in the optimizer's parameter order) or a list of lists of
        parameters; a group is one atomic request, submitted when its last gradient is ready.
    sparse_as_dense: reduce sparse gradients densely (they are made sparse again after); else
        their indices and values are allgathered (every rank must produce a sparse gradient
        for such a parameter; a rank without one raises MismatchError, on every rank).

    To change gradients before the update (e.g. clip_grad_norm_), call synchronize() first,
    then step() inside `with opt.skip_synchronize():` (step() after synchronize() does not
    reduce again either way; without the context it warns, as Horovod's). A parameter without a gradient on some rank contributes zeros.
    zero_grad() while reductions are in flight raises. process_set: gradients are reduced
    (averaged) over that set's ranks only; on a rank outside it the optimizer steps with its
    local gradients (Horovod's rule). The returned object is an instance of a
    subclass of the optimizer's class sharing its state; use it instead of the original.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"jaxcache.torch.DistributedOptimizer: expected a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    if isinstance(optimizer, _DistributedMixin):
        raise ValueError("jaxcache.torch.DistributedOptimizer: this optimizer is already distributed")
    # The names are checked before the runtime is asked for, as Horovod checks them.
    if named_parameters is not None:
        try:
            named_parameters = list(named_parameters)
        except TypeError:
            pass  # _jc_names says what it expects
    _DistributedMixin._jc_names([p for g in optimizer.param_groups for p in g["params"]], named_parameters,
                                "DistributedOptimizer")
    _runtime.require_initialized("jaxcache.torch.DistributedOptimizer")
    if num_groups:
        warnings.warn("jaxcache.torch.DistributedOptimizer: num_groups is deprecated (as in Horovod); "
                      "use groups=", DeprecationWarning, stacklevel=2)
        if groups is None:
            groups = num_groups
    base = type(optimizer)
    cls = type(base.__name__, (_DistributedMixin, base), {"__module__": base.__module__})
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    wrapped._jc_setup(named_parameters, compression, backward_passes_per_step, op,
                      gradient_predivide_factor, groups, sparse_as_dense, process_set, name_prefix)
    return wrapped
