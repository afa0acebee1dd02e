"""Training with a progress bar on stderr: the one way `rlperf train` and each rank of a multi-rank run
start the trainer."""

from __future__ import annotations

from reference_trainer.config import TrainConfig


def run_with_progress(cfg: TrainConfig, quiet: bool, rank=None, save_policy: str = "") -> dict:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from reference_trainer.train import train

    if quiet:
        return train(cfg, rank, save_policy=save_policy)
    columns = (TextColumn("epoch"), MofNCompleteColumn(), BarColumn(), TimeRemainingColumn(),
               TextColumn("{task.fields[sps]:>9} SPS  return {task.fields[ret]}"))
    console = Console(stderr=True)
    # A bar that only a terminal redraws: into a pipe or a log it would leave a blank line, and no progress
    with Progress(*columns, transient=True, console=console, disable=not console.is_terminal) as progress:
        task = progress.add_task("train", total=cfg.num_epochs, sps="-", ret="-")

        def on_epoch(record: dict) -> None:
            ret = record["mean_episode_return"]
            progress.update(task, advance=1, sps=f"{record['steps'] / record['seconds']:,.0f}",
                            ret="-" if ret is None else f"{ret:.3f}")

        return train(cfg, rank, on_epoch, save_policy)

