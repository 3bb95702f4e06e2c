"""Optional metric loggers beside `metrics.jsonl`: TensorBoard and Weights & Biases.

`train.log_to` names them (TRL's `report_to`, verl's `trainer.logger`). Each gets the same
numeric values that `metrics.jsonl` and `eval.jsonl` hold, at the same step; the JSONL files
stay the record that `rlvr report` and resume read. The packages are extras
(`pip install -e ".[tensorboard]"`, `".[wandb]"`), imported only when named.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from pydantic import BaseModel

from rlvr.config import ConfigError


def _scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of `metrics` but its `step`, which the loggers take as their x axis
    (booleans, texts and nulls are not curves)."""
    return {
        key: float(value)
        for key, value in metrics.items()
        if key != "step"
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    }


def _package(module: str, logger: str) -> Any:
    """`module` imported, or a config error that names the logger and its extra."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ConfigError(
            f'{logger!r} needs the {logger} package (pip install -e ".[{logger}]"): {error}'
        ) from None


class TensorBoardLogger:
    """Scalars into `run_dir/tensorboard` (torch's `SummaryWriter`, which needs `tensorboard`);
    the config and project that every logger is given are W&B's."""

    def __init__(self, run_dir: Path, config: dict, project: str) -> None:
        tensorboard = _package("torch.utils.tensorboard", "tensorboard")
        self.writer = tensorboard.SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for key, value in _scalars(metrics).items():
            self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """One W&B run per `rlvr train` call in project `train.wandb_project`, named after the run
    directory, with the resolved config (`WANDB_MODE=offline` works without a network)."""

    def __init__(self, run_dir: Path, config: dict, project: str) -> None:
        wandb = _package("wandb", "wandb")
        self.run = wandb.init(project=project, name=run_dir.name, dir=str(run_dir), config=config)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        self.run.log(_scalars(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


LOGGERS = {"tensorboard": TensorBoardLogger, "wandb": WandbLogger}


class MetricLoggers:
    """The loggers `names` for one run, used as a context manager that closes them all."""

    def __init__(
        self,
        names: list[str],
        run_dir: Path,
        config: dict,
        project: str,
        key: str,
    ) -> None:
        """A `ConfigError` for a logger whose package is missing names the setting `key`."""
        self.loggers: list[TensorBoardLogger | WandbLogger] = []
        try:
            for name in names:
                self.loggers.append(LOGGERS[name](run_dir, config, project))
        except ConfigError as error:
            self.close()
            raise ConfigError(f"{key}: {error}") from None
        except BaseException:
            self.close()
            raise

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for logger in self.loggers:
            logger.log(metrics, step)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()
        self.loggers = []

    def __enter__(self) -> MetricLoggers:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def run_loggers(cfg: BaseModel, section: str, run_dir: Path, main: bool) -> MetricLoggers:
    """The loggers that `cfg`'s `{section}.log_to` names (none off rank 0), given the
    resolved config, the project `{section}.wandb_project` and that key for its errors."""
    settings = getattr(cfg, section)
    names = settings.log_to if main else []
    config = cfg.model_dump(mode="json")
    return MetricLoggers(names, run_dir, config, settings.wandb_project, f"{section}.log_to")
