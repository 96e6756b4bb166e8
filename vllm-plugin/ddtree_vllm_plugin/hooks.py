"""The two places the plugin hooks into vLLM; both are pass-through unless DDTree is asked for.

* the current platform's ``check_and_update_config`` (runs when a ``VllmConfig`` is built):
  validates the configuration (:func:`.config.validate`, one clear error) and selects the DDTree
  worker through ``parallel_config.worker_cls``;
* ``InputProcessor._validate_params`` (runs when a request arrives): refuses sampling features the
  tree walk does not implement, and per-request budgets outside the instance's range
  (:func:`.config.request_problem`).
"""

from __future__ import annotations

from . import config

__all__ = ["install", "installed"]

_MARK = "_ddtree_hook"


def installed() -> bool:
    from vllm.platforms import current_platform
    from vllm.v1.engine.input_processor import InputProcessor

    platform_cls = type(current_platform)
    return bool(
        getattr(platform_cls.check_and_update_config, _MARK, False)
        and getattr(InputProcessor._validate_params, _MARK, False)
    )


def install() -> None:
    import vllm
    from vllm.platforms import current_platform
    from vllm.v1.engine.input_processor import InputProcessor

    platform_cls = type(current_platform)
    stock_check = platform_cls.check_and_update_config
    if not getattr(stock_check, _MARK, False):
        stock_func = stock_check.__func__

        def check_and_update_config(cls, vllm_config):
            result = stock_func(cls, vllm_config)  # first: it settles async scheduling, worker_cls, ...
            if config.requested(vllm_config):
                config.validate(vllm_config, vllm.__version__, current_platform)
                vllm_config.parallel_config.worker_cls = config.WORKER_CLS
            return result

        setattr(check_and_update_config, _MARK, True)
        platform_cls.check_and_update_config = classmethod(check_and_update_config)

    stock_validate = InputProcessor._validate_params
    if not getattr(stock_validate, _MARK, False):

        def _validate_params(self, params, *args, **kwargs):
            result = stock_validate(self, params, *args, **kwargs)
            if config.requested(self.vllm_config):
                problem = config.request_problem(params, config.budget_range(self.vllm_config))
                if problem is not None:
                    raise ValueError(problem)
            return result

        setattr(_validate_params, _MARK, True)
        InputProcessor._validate_params = _validate_params
