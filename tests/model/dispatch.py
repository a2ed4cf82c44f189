"""What a step dispatches, the tests' measure of a launch-bound step: the operators torch runs below autograd, views
and the profiler's markers left out (on CUDA each is one or more kernels)."""

from __future__ import annotations

from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode


class Dispatched(TorchDispatchMode):
    """Within `with Dispatched() as seen:`, `seen.names` lists the operators run, in order."""

    NOT_WORK = {"view", "_unsafe_view", "reshape", "as_strided", "slice", "select", "expand", "t", "transpose",
                "unsqueeze", "squeeze", "detach", "alias", "empty", "empty_like", "_record_function_enter_new",
                "_record_function_exit"}

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    @property
    def count(self) -> int:
        return len(self.names)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func.overloadpacket.__name__ not in self.NOT_WORK:
            self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))
